"""Pipeline parallelism (train.pipeline_model_parallel_size) on CPU with gloo: PP=2, interleaved
virtual stages, PP x FSDP2 and PP x TP give one process's loss, gradient norm and updated weights
(fp32); checkpoints resume exactly; weight sync and the Hugging Face folder hold the full tensors.
The stage split itself is checked in one process: the stages chained give the model's logits."""

import pytest
import torch

from reinforge.parallel_layout import Layout, microbatch_count
from reinforge.train.batching import build
from reinforge.train.pipeline import pad_micro_batch, split_stages
from tests.integration.test_distributed import (
    _resume_worker,
    assert_resumes_on_one_process,
    assert_same,
    make_cfg,
    make_data,
    run_ranks,
    run_single,
)


@pytest.fixture(scope="module")
def four_layer_path(tmp_path_factory, smollm2_path):
    from tests.conftest import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny4"), smollm2_path, num_hidden_layers=4)


def pp_cfg(path, pp=2, vpp=1, **extra):
    return make_cfg(
        path, **{"train.pipeline_model_parallel_size": pp, "train.virtual_pipeline_model_parallel_size": vpp, **extra}
    )


def test_layout_rules_name_the_keys():
    assert Layout.for_world(4, pp=2).words() == "4 trainer ranks = 2 pipeline x 2 data"
    assert (
        Layout.for_world(4, pp=2, vpp=2, tp=2).words() == "4 trainer ranks = 2 pipeline (4 stages) x 1 data x 2 tensor"
    )
    with pytest.raises(ValueError, match="pipeline_model_parallel_size=2 x train.tensor_model_parallel_size=2 .* = 4 "):
        Layout.for_world(6, pp=2, tp=2)
    with pytest.raises(ValueError, match="virtual_pipeline_model_parallel_size=2 .* needs"):
        Layout.for_world(2, vpp=2)
    with pytest.raises(ValueError, match="expert_model_parallel_size=2 with train.pipeline_model_parallel_size=2"):
        Layout.for_world(4, pp=2, ep=2)
    assert "num_hidden_layers=2" in Layout(pp=2, vpp=2).model_problems(4, 2, 128, 2)[0]
    assert Layout(pp=2).model_problems(4, 2, 128, 2) == []


def test_config_and_preflight_refuse_what_pipelines_do_not_run(tiny_model_path):
    from reinforge.config import ConfigError, load_config
    from reinforge.preflight import PreflightError, check_offline, check_rl

    ray = ["cluster.mode=ray", "cluster.actor_num_gpus_per_node=4", f"model.path={tiny_model_path}"]
    with pytest.raises(ConfigError, match="pipeline_model_parallel_size=3 .* does not divide the 4 trainer ranks"):
        load_config(None, ray + ["train.pipeline_model_parallel_size=3"])
    with pytest.raises(ConfigError, match="pipeline_model_parallel_size=2 does not combine with algo.advantage"):
        load_config(None, ray + ["train.pipeline_model_parallel_size=2", "algo.advantage_estimator=gae"])
    with pytest.raises(ConfigError, match="does not combine with model.lora_rank=8"):
        load_config(None, ray + ["train.pipeline_model_parallel_size=2", "model.lora_rank=8"])
    with pytest.raises(ConfigError, match="virtual_pipeline_model_parallel_size=2 splits"):
        load_config(None, ray + ["train.virtual_pipeline_model_parallel_size=2"])
    cfg = load_config(None, ray + ["train.pipeline_model_parallel_size=4"])  # 4 stages, 2 layers
    with pytest.raises(PreflightError, match="4 pipeline stages must divide the model's num_hidden_layers=2"):
        check_rl(cfg, tiny_model_path, 10, memory=1e15)
    with pytest.raises(PreflightError, match="pipeline_model_parallel_size=2: reinforge offline does not run it"):
        check_offline(
            load_config(None, [f"model.path={tiny_model_path}", "train.pipeline_model_parallel_size=2"]),
            tiny_model_path,
            10,
        )


def test_microbatch_count_fits_the_schedules():
    assert [microbatch_count(n, 2, 1) for n in (0, 1, 2, 5)] == [2, 2, 2, 5]
    assert [microbatch_count(n, 2, 2) for n in (1, 3, 5, 6)] == [2, 3, 6, 6]  # interleaved: multiple of n // pp
    mb = build([[5, 6, 7], [5, 8]], [1, 1], [[1], [1]], [[0], [1]], pad_id=0)
    padded = pad_micro_batch(mb, 3, 5, pad_id=0)
    assert padded.input_ids.shape == (3, 5) and padded.input_ids[0].tolist() == [5, 6, 7, 0, 0]
    assert padded.position_ids[1].tolist() == [0, 1, 2, 2, 2]  # the row's real positions, then any valid one
    assert torch.equal(padded.logit_cols, mb.logit_cols) and torch.equal(padded.targets, mb.targets)


def test_stages_chained_give_the_models_logits(four_layer_path):
    """Each pipeline rank keeps its layers under their global names (the tied head: a copy on the last
    stage); the two ranks' stages, interleaved (2 x 2 stages), chained in order, compute the logits of
    the whole model."""
    from reinforge.models.loading import build_model
    from reinforge.train.step import ModelInput

    whole = build_model(four_layer_path, torch.float32, torch.device("cpu"))
    ranks = [build_model(four_layer_path, torch.float32, torch.device("cpu")) for _ in range(2)]
    splits = [split_stages(m, 2, 2, r) for r, m in enumerate(ranks)]
    assert [st.index for st in splits[0].stages] == [0, 2] and [st.index for st in splits[1].stages] == [1, 3]
    names = [dict(m.named_parameters()) for m in ranks]
    assert "model.embed_tokens.weight" in names[0] and "lm_head.weight" not in names[0]
    assert {"model.layers.1.mlp.up_proj.weight", "model.layers.3.mlp.up_proj.weight", "lm_head.weight"} <= set(names[1])
    assert "model.layers.0.mlp.up_proj.weight" not in names[1]
    assert splits[0].tied and torch.equal(names[1]["lm_head.weight"], names[0]["model.embed_tokens.weight"])
    assert [w.owner for w in splits[0].weights if "layers" not in w.name] == [0, 1]  # embedding, norm (head tied)
    ids = torch.tensor([[11, 12, 13, 14], [15, 16, 17, 0]])
    index = (torch.tensor([0, 0, 1]), torch.tensor([1, 2, 2]))
    inp = ModelInput(ids, None, None, index)
    stages = sorted((st for s in splits for st in s.stages), key=lambda st: st.index)
    seen = {}

    def loss(i, logits):  # the last stage hands its logits to the step's loss and outputs that [1]
        seen[i] = logits
        return logits.sum()

    x = ids
    for st in stages:
        st.inputs, st.loss = [inp], loss
        x = st(x, torch.tensor([0]))
    with torch.no_grad():
        assert torch.allclose(seen[0], whole(ids, logits_mask=index), atol=1e-5)
        assert x.shape == (1,) and torch.allclose(x, seen[0].sum().reshape(1))


def test_two_stages_match_one_process_and_resume(tmp_path, tiny_model_path):
    """PP=2 on 2 ranks (one layer a stage; the tied embedding's gradient summed between the stages):
    one process's loss, gradient norm and weights; its checkpoint and Hugging Face folder load on one
    process and a second step equals an uninterrupted run's."""
    assert_resumes_on_one_process(tiny_model_path, pp_cfg(tiny_model_path), make_data(6, seed=11), tmp_path / "ck")


def test_interleaved_stages_with_a_reference_model_match_one_process(four_layer_path):
    """2 ranks x 2 virtual stages (interleaved 1F1B) with a KL loss: the reference model is split and
    run on the same schedule (forward only); 2 optimizer steps per rollout (old log-probs recomputed)."""
    extra = {"algo.use_kl_loss": "true", "algo.kl_loss_coef": 0.1, "train.num_steps_per_rollout": 2}
    data = make_data(8, seed=12)
    single = run_single(make_cfg(four_layer_path, **extra), four_layer_path, data)
    assert_same(single[:2], run_ranks(2, pp_cfg(four_layer_path, vpp=2, **extra), four_layer_path, data))


def test_a_step_whose_every_advantage_is_zero_runs_on_two_stages(tiny_model_path):
    """Every sample dropped (zero advantages, common early in GRPO): no micro-batch on any stage; the
    step applies a zero gradient as one process does, instead of running the schedule on dummies."""
    data = make_data(4, seed=16, equal_rewards=True)
    single = run_single(make_cfg(tiny_model_path), tiny_model_path, data)
    assert_same(single[:2], run_ranks(2, pp_cfg(tiny_model_path), tiny_model_path, data))


@pytest.mark.slow
@pytest.mark.parametrize("other", ["fsdp", "tp", "cp"])
def test_pipeline_times_fsdp_tp_or_cp_on_four_ranks(tiny_model_path, other):
    """2 pipeline x 2 data (FSDP2 over each stage's data-parallel ranks), 2 pipeline x 2 tensor and
    2 pipeline x 2 context; packed rows (padded to one shape per step) and a sample too few for every
    data rank."""
    sizes = {"tp": {"train.tensor_model_parallel_size": 2}, "cp": {"train.context_parallel_size": 2}}
    extra = {"train.packing": "sequences", **sizes.get(other, {})}
    for data in (make_data(7, seed=13), make_data(1, seed=14)):
        single = run_single(make_cfg(tiny_model_path), tiny_model_path, data)
        assert_same(single[:2], run_ranks(4, pp_cfg(tiny_model_path, **extra), tiny_model_path, data))


def test_one_process_checkpoint_resumes_on_two_stages(tmp_path, tiny_model_path):
    """A one-process checkpoint loads on PP=2 ranks (the last stage's LM-head copy takes the tied
    embedding's weights and AdamW state) and the next step equals an uninterrupted run's."""
    from tests.ranks import spawn_ranks

    data = make_data(6, seed=15)
    metrics, weights, _ = run_single(make_cfg(tiny_model_path), tiny_model_path, data, steps=2)
    _, _, w = run_single(make_cfg(tiny_model_path), tiny_model_path, data, steps=1)
    w.save(str(tmp_path / "ck"))
    resumed = spawn_ranks(
        _resume_worker, 2, (pp_cfg(tiny_model_path), str(tiny_model_path), data, str(tmp_path / "ck"))
    )
    assert_same(([metrics[1]], weights), ([resumed[0]], {k: torch.from_numpy(v) for k, v in resumed[1].items()}))
