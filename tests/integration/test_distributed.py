"""FSDP2 data parallelism on CPU (gloo): 2 ranks match 1 process, uneven data completes, DCP reshards."""

import pytest
import torch

from reinforge.config import load_config
from reinforge.records import Sample
from reinforge.train.collectives import partition_by_tokens
from tests.ranks import spawn_ranks
from tests.unit.test_packing import train_rollout


def make_cfg(tiny_model_path, **extra):
    # adam_eps 1e-3: Adam's first step is ~lr * sign(g), which would turn reduction-order noise on
    # near-zero gradients into lr-sized differences; a large eps keeps updates proportional to g.
    # train.device=cpu: gloo ranks also on a machine with one GPU (NCCL refuses two ranks on one GPU)
    o = [
        f"model.path={tiny_model_path}",
        "train.device=cpu",
        "train.lr=1e-2",
        "train.max_tokens_per_gpu=64",
        "train.clip_grad=1e9",
        "train.adam_eps=1e-3",
        "rollout.n_samples_per_prompt=2",
    ]
    return load_config(None, o + [f"{k}={v}" for k, v in extra.items()])


def make_data(n: int, seed: int = 0, lengths=None, equal_rewards: bool = False) -> list[list[Sample]]:
    """A scored rollout of ``n`` samples (rounded up to even) in groups of 2 (``rollout.n_samples_per_prompt``
    of :func:`make_cfg`) with random rewards (``equal_rewards``: 0.5 each, every GRPO advantage 0)."""
    g = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(n + n % 2):
        P = 3 + i % 4
        R = lengths[i] if lengths else 2 + (i * 5) % 9
        tokens = torch.randint(10, 40000, (P + R,), generator=g).tolist()
        reward = 0.5 if equal_rewards else float(torch.randn(1, generator=g))
        samples.append(
            Sample(
                prompt="p",
                tokens=tokens,
                response_length=R,
                loss_mask=[1] * R,
                rollout_log_probs=[-1.0] * R,
                group_index=i // 2,
                reward=reward,
            )
        )
    return [samples[i : i + 2] for i in range(0, len(samples), 2)]


def _worker(rank, world, port, cfg, path, data, steps, save_dir, queue):
    from reinforge.train.worker import TrainWorker

    w = TrainWorker(cfg, path, rank=rank, world_size=world, master_port=port)
    metrics = [train_rollout(w, data, r) for r in range(steps)]
    weights = {
        n: t.detach().float().cpu().numpy().copy() for n, t in w.named_weights()
    }  # numpy: no shared-memory handles (bf16: as fp32)
    if save_dir:
        w.save(save_dir)
    if rank == 0:
        queue.put((metrics, weights))
    w.parallel.barrier()


def run_ranks(world, cfg, path, data, steps=1, save_dir=None):
    metrics, weights = spawn_ranks(_worker, world, (cfg, str(path), data, steps, save_dir))
    return metrics, {k: torch.from_numpy(v) for k, v in weights.items()}


def run_single(cfg, path, data, steps=1):
    from reinforge.train.worker import TrainWorker

    w = TrainWorker(cfg, path)
    metrics = [train_rollout(w, data, r) for r in range(steps)]
    return metrics, {n: t.detach().cpu().clone() for n, t in w.named_weights()}, w


def assert_same(a, b):
    (ma, wa), (mb, wb) = a, b
    for x, y in zip(ma, mb):
        assert x["train/loss"] == pytest.approx(y["train/loss"], rel=1e-4, abs=1e-6)
        assert x["train/grad_norm"] == pytest.approx(y["train/grad_norm"], rel=1e-4)
        assert x["train/pg_loss"] == pytest.approx(y["train/pg_loss"], rel=1e-4, abs=1e-6)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=2e-5, rtol=1e-4), k


def assert_resumes_on_one_process(path, cfg, data, ckpt) -> dict[str, torch.Tensor]:
    """One step on 2 ranks under ``cfg`` (a parallel layout), saved to ``ckpt``: the same loss as one
    process; the checkpoint and its Hugging Face folder hold the same weights on one process, and
    a second step from it equals an uninterrupted one-process run's. Returns the 2-rank weights."""
    from reinforge.models.loading import build_model
    from reinforge.train.worker import TrainWorker

    single_metrics, single_weights, _ = run_single(make_cfg(path), path, data, steps=2)
    metrics, weights = run_ranks(2, cfg, path, data, save_dir=str(ckpt))
    assert_same((single_metrics[:1], {}), (metrics, {}))
    w = TrainWorker(make_cfg(path), path)
    w.load(str(ckpt))
    loaded = dict(w.named_weights())
    hf = dict(build_model(ckpt / "model", torch.float32).named_parameters())
    for k in weights:
        assert torch.equal(weights[k], loaded[k]), k
        assert torch.equal(weights[k], hf[k].detach()), k
    m = train_rollout(w, data, 1)
    assert m["train/loss"] == pytest.approx(single_metrics[1]["train/loss"], rel=1e-4, abs=1e-6)
    for k, v in w.named_weights():
        assert torch.allclose(v, single_weights[k], atol=2e-5, rtol=1e-4), k
    return weights


def test_partition_by_tokens():
    parts = partition_by_tokens([10, 1, 9, 2, 5], 2)
    assert sorted(i for p in parts for i in p) == [0, 1, 2, 3, 4]
    sums = [sum([10, 1, 9, 2, 5][i] for i in p) for p in parts]
    assert abs(sums[0] - sums[1]) <= 3
    assert partition_by_tokens([4], 3) in ([[0], [], []],)


def test_two_ranks_match_one_process(tiny_model_path):
    cfg = make_cfg(tiny_model_path, **{"train.num_steps_per_rollout": 2})
    data = make_data(8)
    single = run_single(cfg, tiny_model_path, data, steps=2)
    two = run_ranks(2, cfg, tiny_model_path, data, steps=2)
    assert_same(single[:2], two)


def test_uneven_data_per_rank_completes(tiny_model_path):
    # 2 groups: the long one on one rank, the short one on the other; the token budget gives the ranks
    # different micro-batch counts. Then a single group: one rank has none.
    cfg = make_cfg(tiny_model_path, **{"train.max_tokens_per_gpu": 24})
    data = make_data(4, seed=1, lengths=[14, 2, 3, 2])
    assert_same(run_single(cfg, tiny_model_path, data)[:2], run_ranks(2, cfg, tiny_model_path, data))
    data = make_data(1, seed=2)
    assert_same(run_single(cfg, tiny_model_path, data)[:2], run_ranks(2, cfg, tiny_model_path, data))


def test_dcp_saved_on_two_ranks_loads_on_one(tiny_model_path, tmp_path):
    cfg = make_cfg(tiny_model_path)
    data = make_data(6, seed=3)
    _, weights = run_ranks(2, cfg, tiny_model_path, data, steps=1, save_dir=str(tmp_path / "ckpt"))
    from reinforge.train.worker import TrainWorker

    w = TrainWorker(cfg, tiny_model_path)
    w.load(str(tmp_path / "ckpt"))
    loaded = dict(w.named_weights())
    for k in weights:
        assert torch.equal(weights[k], loaded[k]), k
    assert w.actor.scheduler.last_epoch == 1 and len(w.actor.optimizer.state) > 0
    # a second step from the loaded state equals a second step of an uninterrupted run
    single_metrics, _, single = run_single(cfg, tiny_model_path, data, steps=2)
    m = train_rollout(w, data, 1)
    assert m["train/loss"] == pytest.approx(single_metrics[1]["train/loss"], rel=1e-4, abs=1e-6)
    # the Hugging Face folder written by rank 0 holds the same weights
    from reinforge.models.loading import build_model

    hf = dict(build_model(tmp_path / "ckpt" / "model", torch.float32).named_parameters())
    for k in weights:
        assert torch.equal(weights[k], hf[k].detach()), k


def _resume_worker(rank, world, port, cfg, path, data, ckpt, queue):
    from reinforge.train.worker import TrainWorker

    w = TrainWorker(cfg, path, rank=rank, world_size=world, master_port=port)
    w.load(ckpt)
    m = train_rollout(w, data, 1)
    weights = {n: t.detach().cpu().numpy().copy() for n, t in w.named_weights()}
    if rank == 0:
        queue.put((m, weights))
    w.parallel.barrier()


def test_a_one_process_checkpoint_resumes_on_two_fsdp_ranks(tiny_model_path, tmp_path):
    """Every parameter trains, so the checkpoint's weights are its Hugging Face folder only
    (dcp/actor/hf_weights.json): two FSDP ranks read the full tensors, keep their shards, load the
    AdamW state from DCP, and the next step equals an uninterrupted run's."""
    import json

    cfg = make_cfg(tiny_model_path)
    data = make_data(6, seed=4)
    single_metrics, single_weights, _ = run_single(cfg, tiny_model_path, data, steps=2)
    *_, w = run_single(cfg, tiny_model_path, data, steps=1)
    w.save(str(tmp_path / "ckpt"))
    assert json.loads((tmp_path / "ckpt" / "dcp" / "actor" / "hf_weights.json").read_text())["weights"]
    assert not (tmp_path / "ckpt" / "dcp" / "actor" / ".metadata").exists()
    m, weights = spawn_ranks(_resume_worker, 2, (cfg, str(tiny_model_path), data, str(tmp_path / "ckpt")))
    assert_same(([single_metrics[1]], single_weights), ([m], {k: torch.from_numpy(v) for k, v in weights.items()}))


def test_two_ranks_shared_prompt_match_one_padded_process(tiny_model_path):
    """Shared-prompt rows split by whole prompt groups over 2 ranks give the update of one
    process with padded rows."""
    from tests.unit.test_packing import group_rollout

    data = group_rollout(prompts=3, group=4, seed=5)
    padded = run_single(make_cfg(tiny_model_path), tiny_model_path, data)
    shared = run_ranks(2, make_cfg(tiny_model_path, **{"train.packing": "shared_prompt"}), tiny_model_path, data)
    assert_same(padded[:2], shared)
