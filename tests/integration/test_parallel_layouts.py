"""Tensor and context parallelism, alone and with FSDP2, on CPU (gloo): each layout gives the loss,
gradient norm and updated weights of one process (fp32), also with ranks that get no samples."""

import pytest

from reinforge.parallel_layout import Layout
from tests.integration.test_distributed import (
    assert_resumes_on_one_process,
    assert_same,
    make_cfg,
    make_data,
    run_ranks,
    run_single,
)


def layout_cfg(path, tp=1, cp=1, **extra):
    return make_cfg(path, **{"train.tensor_model_parallel_size": tp, "train.context_parallel_size": cp, **extra})


def test_layout_words_and_checks():
    assert Layout.for_world(4, tp=2).words() == "4 trainer ranks = 2 data x 2 tensor"
    assert Layout.for_world(8, tp=2, cp=2).words() == "8 trainer ranks = 2 data x 2 context x 2 tensor"
    with pytest.raises(
        ValueError,
        match=r"tensor_model_parallel_size=3 x train.context_parallel_size=1 = 3 "
        r"does not divide the 4 trainer rank",
    ):
        Layout.for_world(4, tp=3)
    assert Layout(1, 1, 2).model_problems(4, 2, 128) == []
    assert "num_key_value_heads=2" in Layout(1, 1, 4).model_problems(8, 2, 128)[0]
    assert "must divide the query heads" in Layout(1, 4, 2).model_problems(4, 2, 128)[0]
    assert Layout(1, 2, 1).model_problems(4, 1, 128) == []  # kv heads repeated for the all-to-all


@pytest.mark.parametrize("tp,cp", [(2, 1), (1, 2)])
def test_two_ranks_match_one_process(tiny_model_path, tp, cp):
    cfg = layout_cfg(tiny_model_path, tp, cp)
    data = make_data(6, seed=7)
    single = run_single(make_cfg(tiny_model_path), tiny_model_path, data)
    assert_same(single[:2], run_ranks(2, cfg, tiny_model_path, data))


@pytest.mark.slow
@pytest.mark.parametrize("tp,cp", [(2, 1), (1, 2)])
def test_fsdp_times_tp_or_cp_on_four_ranks(tiny_model_path, tp, cp):
    """2 data x 2 tensor, 2 data x 2 context: FSDP2 over dp (x cp) composed with the other dimension."""
    cfg = layout_cfg(tiny_model_path, tp, cp)
    data = make_data(6, seed=8)
    assert_same(
        run_single(make_cfg(tiny_model_path), tiny_model_path, data)[:2], run_ranks(4, cfg, tiny_model_path, data)
    )
    # one sample: one data-parallel rank has none and runs a dummy micro-batch through the
    # tensor / context parallel collectives and FSDP's (no hang, the same update)
    data = make_data(1, seed=2)
    assert_same(
        run_single(make_cfg(tiny_model_path), tiny_model_path, data)[:2], run_ranks(4, cfg, tiny_model_path, data)
    )


@pytest.mark.slow
def test_fsdp_times_tp_qwen3_sums_q_norm_grads(tmp_path, smollm2_path):
    """2 data x 2 tensor on Qwen3: the per-head q_norm / k_norm gradients are summed over the tensor-
    parallel group also when FSDP2 has replaced the parameters with sharded ones (before the fix the
    sum used the pre-FSDP parameters, whose gradients stay None: q_norm / k_norm moved lr-sized off)."""
    from tests.conftest import make_tiny_model

    path = make_tiny_model(tmp_path / "qwen3", smollm2_path, "qwen3")
    data = make_data(6, seed=10)
    assert_same(run_single(make_cfg(path), path, data)[:2], run_ranks(4, layout_cfg(path, tp=2), path, data))


def test_cp_packed_sequences(tiny_model_path):
    """Context parallelism on packed rows: attention over the whole row is masked by its sequence
    ids (rows of odd length are padded to a multiple of cp)."""
    data = make_data(5, seed=9)
    single = run_single(make_cfg(tiny_model_path), tiny_model_path, data)
    cfg = layout_cfg(tiny_model_path, cp=2, **{"train.packing": "sequences"})
    assert_same(single[:2], run_ranks(2, cfg, tiny_model_path, data))


def test_tp_qwen3_checkpoint_resumes_on_one_process(tmp_path, smollm2_path):
    """Qwen3 (per-head q_norm / k_norm, whose gradients are summed over the tensor-parallel ranks):
    TP=2 matches one process; its checkpoint (DCP with DTensor shards, and the Hugging Face folder of
    full tensors) loads on one process and a second step equals an uninterrupted run's."""
    from tests.conftest import make_tiny_model

    path = make_tiny_model(tmp_path / "qwen3", smollm2_path, "qwen3")
    assert_resumes_on_one_process(path, layout_cfg(path, tp=2), make_data(6, seed=10), tmp_path / "ckpt")


def test_config_and_preflight_name_keys_world_and_layout(tiny_model_path):
    from reinforge.cluster.resources import ClusterError, check_placement
    from reinforge.config import ConfigError, load_config
    from reinforge.preflight import PreflightError, check_rl

    ray = ["cluster.mode=ray", "cluster.actor_num_gpus_per_node=4", f"model.path={tiny_model_path}"]
    with pytest.raises(
        ConfigError,
        match=r"train.tensor_model_parallel_size=3 x train.context_parallel_size=1 = 3 "
        r"does not divide the 4 trainer ranks",
    ):
        load_config(None, ray + ["train.tensor_model_parallel_size=3"])
    cfg = load_config(None, ray + ["train.tensor_model_parallel_size=4"])  # 4 ranks, but 2 kv heads
    with pytest.raises(
        PreflightError,
        match=r"tensor_model_parallel_size=4 must divide the model's "
        r"num_key_value_heads=2",
    ):
        check_rl(cfg, tiny_model_path, 10, memory=1e15)
    local = load_config(None, [f"model.path={tiny_model_path}", "train.context_parallel_size=2"])
    with pytest.raises(PreflightError, match=r"does not divide the 1 trainer rank.*cluster.mode=ray"):
        check_rl(local, tiny_model_path, 10, memory=1e15)
    cfg = load_config(None, ray + ["train.tensor_model_parallel_size=2", "cluster.colocate=true"])
    with pytest.raises(
        ClusterError,
        match=r"needs 4 GPUs \(actor_num_nodes \* actor_num_gpus_per_node = 4 "
        r"\(4 trainer ranks = 2 data x 2 tensor\)\)",
    ):
        check_placement(cfg, {"GPU": 2, "CPU": 64})


@pytest.mark.parametrize("packing", ["none", "sequences"])
def test_sequence_parallel_matches_one_process(tmp_path, tiny_model_path, packing):
    """train.sequence_parallel with TP=2: norms and residual stream over half the positions each
    (rows of odd length padded to a multiple of tp), the same loss, gradient norm and weights; with
    padded rows its checkpoint (the norms are DTensors over the tensor-parallel ranks) resumes on one process."""
    cfg = layout_cfg(tiny_model_path, tp=2, **{"train.sequence_parallel": "true", "train.packing": packing})
    data = make_data(5, seed=16)
    if packing == "none":
        assert_resumes_on_one_process(tiny_model_path, cfg, data, tmp_path / "ckpt")
        return
    single = run_single(make_cfg(tiny_model_path), tiny_model_path, data)
    assert_same(single[:2], run_ranks(2, cfg, tiny_model_path, data))


def test_sequence_parallel_refusals():
    with pytest.raises(ValueError, match="sequence_parallel=true splits what tensor parallelism leaves whole"):
        Layout.for_world(2, sp=True)
    with pytest.raises(ValueError, match="sequence_parallel=true does not combine with train.pipeline_model"):
        Layout.for_world(4, tp=2, pp=2, sp=True)
    moe = {"model_type": "qwen3_moe", "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 8}
    assert "mixture-of-experts" in Layout(tp=2, sp=True).config_problems(moe)[0]
    assert Layout.for_world(4, tp=2, sp=True).words() == "4 trainer ranks = 2 data x 2 tensor (sequence parallel)"


@pytest.mark.slow
def test_fsdp_times_tp_with_sequence_parallel_qwen3(tmp_path, smollm2_path):
    """2 data x 2 tensor with sequence parallelism on Qwen3 (per-head q_norm / k_norm summed over the
    tensor-parallel ranks, norms as DTensors under FSDP2): one process's update."""
    from tests.conftest import make_tiny_model

    path = make_tiny_model(tmp_path / "qwen3", smollm2_path, "qwen3")
    data = make_data(6, seed=17)
    cfg = layout_cfg(path, tp=2, **{"train.sequence_parallel": "true"})
    assert_same(run_single(make_cfg(path), path, data)[:2], run_ranks(4, cfg, path, data))
