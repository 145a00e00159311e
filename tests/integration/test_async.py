"""Asynchronous RL (rollout.max_staleness): the decoupled loss, the weight gate, the producer and the loop."""

import json
import threading
import time

import pytest
import torch

from reinforge.algo.losses import POLICY_LOSSES, decoupled_policy_loss
from reinforge.config import load_config
from reinforge.config.fields import ConfigError
from reinforge.loop import RLLoop, run_training
from reinforge.records import GenerateRequest, Sample, SamplingParams
from reinforge.rollout.async_rollout import AsyncRolloutProducer, WeightGate, drop_stale_groups, staleness_metrics
from reinforge.rollout.source import SyncRollouts
from tests.integration.test_integration import read_metrics, tiny_overrides, without_timings

# ---------------------------------------------------------------------------- the decoupled objective


@pytest.mark.parametrize("loss_name", ["ppo", "gspo"])
def test_decoupled_loss_equals_ppo_when_behaviour_is_proximal(loss_name):
    cfg = load_config(None, ["algo.eps_clip_high=0.28"])
    g = torch.Generator().manual_seed(0)
    lp = torch.randn(3, 5, generator=g) * 0.1 - 1
    prox = lp + torch.randn(3, 5, generator=g) * 0.3
    adv = torch.randn(3, 5, generator=g)
    mask = torch.ones(3, 5)
    fn = POLICY_LOSSES.get(loss_name)
    ref, ref_ratio, ref_clipped = fn(lp, prox, adv, mask, cfg.algo)
    loss, ratio, clipped, w = decoupled_policy_loss(fn, lp, prox, prox.clone(), adv, mask, cfg.algo)
    assert torch.equal(w, torch.ones_like(w))
    torch.testing.assert_close(loss, ref, rtol=0, atol=0)
    assert torch.equal(ratio, ref_ratio) and torch.equal(clipped, ref_clipped)


def test_decoupled_loss_weights_by_proximal_over_behaviour():
    cfg = load_config(None, [])
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    prox = torch.tensor([[-1.1, -1.5]])
    behav = torch.tensor([[-1.3, -1.0]])
    adv = torch.tensor([[1.0, -1.0]])
    loss, _, _, w = decoupled_policy_loss(POLICY_LOSSES.get("ppo"), lp, prox, behav, adv, torch.ones(1, 2), cfg.algo)
    torch.testing.assert_close(w, torch.exp(prox - behav))
    # -(pi_prox/pi_behav) * min(r A, clip(r) A), r = pi/pi_prox (AReaL eq. 5)
    r = torch.exp(lp.detach() - prox)
    expect = -w * torch.minimum(r * adv, r.clamp(0.8, 1.2) * adv)
    torch.testing.assert_close(loss.detach(), expect)
    capped = decoupled_policy_loss(
        POLICY_LOSSES.get("ppo"), lp, prox, behav, adv, torch.ones(1, 2), cfg.algo, max_weight=1.2
    )[3]
    assert float(capped.max()) == pytest.approx(1.2)
    loss.sum().backward()  # the weight carries no gradient; the policy term does
    assert lp.grad is not None and torch.isfinite(lp.grad).all()


# ---------------------------------------------------------------------------- config


def test_config_keys_and_refusals():
    assert load_config(None, []).decoupled_loss is False
    assert load_config(None, ["rollout.max_staleness=1"]).decoupled_loss is True
    assert load_config(None, ["rollout.max_staleness=1", "algo.use_decoupled_loss=false"]).decoupled_loss is False
    with pytest.raises(ConfigError, match="rollout.partial_rollout"):
        load_config(None, ["rollout.partial_rollout=true"])
    with pytest.raises(ConfigError, match="rollout.max_staleness"):
        load_config(None, ["rollout.max_staleness=1", "algo.advantage_estimator=gae"])
    with pytest.raises(ConfigError, match="cluster.colocate"):
        load_config(None, ["rollout.max_staleness=1", "cluster.mode=ray", "cluster.colocate=true"])
    with pytest.raises(ConfigError, match="engine.backend=embedded"):
        load_config(None, ["rollout.max_staleness=1", "rollout.partial_rollout=true", "engine.backend=hf"])


# ---------------------------------------------------------------------------- staleness bookkeeping


def _sample(versions):
    return Sample(
        prompt="p",
        tokens=[1] * (2 + len(versions)),
        response_length=len(versions),
        weight_version=versions[0],
        weight_versions=list(versions) if len(set(versions)) > 1 else [],
    )


def test_staleness_metrics_and_filter():
    groups = [[_sample([3, 3]), _sample([2, 3, 4])], [_sample([1, 1])]]
    kept, dropped = drop_stale_groups(groups, version=4, max_staleness=2)
    assert dropped == 1 and kept == groups[:1]
    m = staleness_metrics([s for g in kept for s in g], version=4, max_staleness=2)
    assert m["async/staleness_max"] == 2.0
    assert m["async/staleness_mean"] == pytest.approx((1 + 1 + 2 + 1 + 0) / 5)
    assert (m["async/staleness_samples_0"], m["async/staleness_samples_1"], m["async/staleness_samples_2"]) == (0, 1, 1)


# ---------------------------------------------------------------------------- the gate and the engine


@pytest.fixture()
def engine(tiny_model_path):
    from reinforge.config import EngineConfig
    from reinforge.engine import EmbeddedEngine
    from reinforge.models.loading import build_model

    model = build_model(tiny_model_path, torch.float32, torch.device("cpu"))
    e = EmbeddedEngine(model, EngineConfig(max_num_seqs=8, sync_interval=1), max_model_len=128, seed=0)
    yield e
    e.shutdown()


def test_partial_rollout_continues_under_new_weights(engine):
    """A weight update interrupts generation; sequences continue with the new version and keep
    their tokens, log-probs and per-token versions."""
    gate = WeightGate(engine, partial_rollout=True)
    steps = {"n": 0}
    step = engine.step
    updater: list[threading.Thread] = []

    def update():
        gate.run_update(lambda: engine.update_weights([], 1), 1)

    def counting_step():
        steps["n"] += 1
        if steps["n"] == 3 and not updater:
            updater.append(threading.Thread(target=update))
            updater[0].start()
            while not engine._interrupted:  # the update asked for the engine
                time.sleep(0.001)
        step()

    engine.step = counting_step
    params = SamplingParams(max_new_tokens=12, temperature=1.0, ignore_eos=True)
    results = gate.generate([GenerateRequest([1, 5, 9, 14], params, n=2), GenerateRequest([1, 7], params, n=1)])
    updater[0].join(10)
    assert gate.version == 1 and engine.weight_version == 1
    for res in results:
        for r in res:
            assert len(r.token_ids) == len(r.log_probs) == 12
            assert r.token_versions is not None and len(r.token_versions) == 12
            assert r.token_versions[0] == 0 and r.token_versions[-1] == 1
            assert r.token_versions == sorted(r.token_versions)
            assert r.weight_version == 0 and r.finish_reason.value == "length"


class _AbortingEngine:
    """Aborts every request by itself (no interruption asked): the gate must not retry forever."""

    weight_version = 0

    def __init__(self):
        self.calls = 0

    def generate(self, requests):
        from reinforge.records import FinishReason, GenerateResult

        self.calls += 1
        return [[GenerateResult([3], [-0.5], FinishReason.ABORT, 0)] * r.n for r in requests]

    def interrupt(self):
        pass

    def resume(self):
        pass

    def update_weights(self, named_tensors, version):
        self.weight_version = version

    def reseed(self, seed):
        pass

    def sleep(self, offload_weights=False):
        pass

    def wake_up(self):
        pass

    def shutdown(self):
        pass


def test_engine_side_abort_is_final():
    engine = _AbortingEngine()
    gate = WeightGate(engine, partial_rollout=True)
    (res,) = gate.generate([GenerateRequest([1, 2], SamplingParams(max_new_tokens=8), n=2)])
    assert engine.calls == 1 and [r.finish_reason.value for r in res] == ["abort", "abort"]
    assert res[0].token_ids == [3] and res[0].token_versions is None


def test_without_partial_rollout_update_waits_for_generation(engine):
    gate = WeightGate(engine, partial_rollout=False)
    started = threading.Event()
    step = engine.step

    def slow_step():
        started.set()
        time.sleep(0.01)
        step()

    engine.step = slow_step
    out = {}
    t = threading.Thread(
        target=lambda: out.update(
            r=gate.generate([GenerateRequest([1, 5, 9], SamplingParams(max_new_tokens=10, ignore_eos=True), n=2)])
        )
    )
    t.start()
    started.wait(10)
    gate.run_update(lambda: engine.update_weights([], 1), 1)
    t.join(10)
    for r in out["r"][0]:
        assert len(r.token_ids) == 10 and r.token_versions is None and r.weight_version == 0
    assert engine.weight_version == 1


def test_producer_memory_stays_bounded_over_many_rollouts():
    """The producer keeps a data snapshot per rollout it starts (for checkpoints); taking a rollout
    drops those of it and earlier ones, so over a long run only the rollouts in flight are held."""
    gate = WeightGate(_AbortingEngine())
    k = 2
    producer = AsyncRolloutProducer(lambda j: j, gate, 0, 500, k, snapshot=lambda: {"offset": 0}).start()
    try:
        for j in range(500):
            assert producer.take(j).value == j
            gate.run_update(lambda: None, j + 1)
            assert len(producer._snapshots) <= k + 1 and len(producer._ready) <= k + 1
    finally:
        producer.close()


def test_producer_respects_bound_and_shuts_down_mid_generation(engine):
    gate = WeightGate(engine, partial_rollout=True)
    seen = []

    def produce(j):
        seen.append((j, gate.version))
        return gate.generate([GenerateRequest([1, 5, 9], SamplingParams(max_new_tokens=100, ignore_eos=True))])

    producer = AsyncRolloutProducer(produce, gate, 0, 100, max_staleness=2).start()
    producer.take(0)
    deadline = time.time() + 10
    while len(seen) < 3 and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert [j for j, _ in seen] == [0, 1, 2]  # rollout 3 needs version >= 1
    assert all(j - v <= 2 for j, v in seen)
    t = time.perf_counter()
    producer.close(timeout=20)  # rollout 2 is generating (or done): no hang
    assert time.perf_counter() - t < 20
    assert not any(th.name == "rollout-producer" for th in threading.enumerate())
    assert not engine.has_unfinished()
    assert not engine._interrupted  # resumed for the loop's later use


# ---------------------------------------------------------------------------- the loop


def _loop_cfg(tiny_model_path, out, **extra):
    return load_config(
        None,
        tiny_overrides(
            tiny_model_path,
            out,
            **{"reward.type": "custom", "reward.function_path": "tests.reward_fns:even_first_token", **extra},
        ),
    )


@pytest.mark.parametrize("k,partial", [(1, "false"), (2, "true")])
def test_async_loop_trains_within_the_staleness_bound(tmp_path, tiny_model_path, k, partial):
    out = tmp_path / "run"
    # k=2: an evaluation after rollout 2 pauses the producer mid-run
    evals = {"data.n_eval_prompts": 2, "eval.eval_interval": 2} if k == 2 else {"data.n_eval_prompts": 0}
    cfg = _loop_cfg(
        tiny_model_path,
        out,
        **{
            "rollout.max_staleness": k,
            "rollout.partial_rollout": partial,
            "train.num_rollout": 4,
            "run.save_interval": 2,
            "eval.n_samples_per_eval_prompt": 0,
            "eval.pass_k": "[1]",
            "eval.eval_before_train": "false",
            **evals,
        },
    )
    loop = RLLoop(cfg)
    trained = []
    score = loop.cluster.score

    def checked(batch):
        v = loop.weight_version
        assert v == batch.rollout_id
        for s in (s for g in batch.groups for s in g):
            versions = s.token_versions()
            assert len(versions) == s.response_length
            assert all(v - k <= x <= v for x in versions), (v, versions)
            trained.append(v - min(versions))
        return score(batch)

    loop.cluster.score = checked
    try:
        result = loop.train()
    finally:
        loop.close()
    assert result.last_rollout_id == 3 and len(trained) == 4 * 8
    assert max(trained) >= 1  # generation really ran ahead of training
    rows = [m for m in read_metrics(out) if "train/loss" in m]
    assert [m["weight_version"] for m in rows] == [1.0, 2.0, 3.0, 4.0]
    for m in rows:
        assert m["async/staleness_max"] <= k and m["async/dropped_stale_groups"] == 0
        assert sum(m[f"async/staleness_samples_{d}"] for d in range(k + 1)) == 8
        for key in (
            "async/trainer_wait_s",
            "async/engine_idle_s",
            "async/samples_per_s",
            "async/weight_update_wait_s",
            "train/importance_weight",
        ):
            assert key in m
    assert not any(th.name == "rollout-producer" for th in threading.enumerate())
    if k == 2:
        labels = [json.loads(line)["label"] for line in (out / "eval.jsonl").read_text().splitlines()]
        assert labels == ["rollout_2", "after"]
    # the checkpoint after rollout 1 keeps the rollouts started after it (tests/integration/test_async_resume.py) and
    # records the data position after them
    state = json.loads((next((out / "checkpoints").glob("*1")) / "state.json").read_text())
    assert state["rollout_id"] == 1 and state["weight_version"] == 2
    kept = [b["rollout_id"] for b in state["data"].get("buffered_rollouts", [])]
    assert kept == list(range(2, 2 + len(kept))) and len(kept) <= k + 1
    assert state["data"]["offset"] == (2 + len(kept)) * cfg.rollout.rollout_batch_size


def test_engine_failure_surfaces_in_the_driver_with_the_engine_named(tmp_path, tiny_model_path):
    cfg = _loop_cfg(
        tiny_model_path,
        tmp_path / "run",
        **{"rollout.max_staleness": 1, "train.num_rollout": 3, "eval.eval_before_train": "false"},
    )
    loop = RLLoop(cfg)
    calls = {"n": 0}
    step = loop.engine.step

    def failing_step():
        calls["n"] += 1
        if calls["n"] > 3:
            raise RuntimeError("CUDA error: device-side assert (simulated)")
        step()

    loop.engine.step = failing_step
    try:
        with pytest.raises(RuntimeError, match=r"EmbeddedEngine.*simulated") as info:
            loop.train()
        assert "asynchronous rollout" in str(info.value)
    finally:
        loop.close()
    assert not any(th.name == "rollout-producer" for th in threading.enumerate())


@pytest.mark.slow
def test_zero_staleness_is_the_synchronous_loop(tmp_path, tiny_model_path):
    runs = {}
    for name, extra in (("sync", {}), ("k0", {"rollout.max_staleness": 0, "algo.use_decoupled_loss": "false"})):
        out = tmp_path / name
        loop = RLLoop(
            _loop_cfg(
                tiny_model_path,
                out,
                **extra,
                **{"data.n_eval_prompts": 0, "run.save_final": "false", "train.num_rollout": 2},
            )
        )
        assert isinstance(loop.source, SyncRollouts)
        try:
            loop.train()
        finally:
            loop.close()
        runs[name] = without_timings(read_metrics(out))
    assert runs["sync"] == runs["k0"]
    assert not any(k.startswith("async/") for m in runs["k0"] for k in m)


@pytest.mark.slow
def test_ray_disaggregated_async_with_partial_rollouts(tmp_path, tiny_model_path):
    """A trainer actor and an engine actor (2 processes, gloo weight broadcast): the engine
    generates the next rollout while the trainer trains, interrupted by each weight update."""
    ray = pytest.importorskip("ray")
    out = tmp_path / "run"
    cfg = _loop_cfg(
        tiny_model_path,
        out,
        **{
            "cluster.mode": "ray",
            "cluster.actor_num_gpus_per_node": 1,
            "cluster.rollout_num_gpus": 1,
            "cluster.weight_sync_bucket_mb": 1,
            "rollout.max_staleness": 1,
            "rollout.partial_rollout": "true",
            "rollout.rollout_max_response_len": 24,
            "train.num_rollout": 3,
            "data.n_eval_prompts": 0,
            "run.save_final": "false",
        },
    )
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        result = run_training(cfg)
    finally:
        ray.shutdown()
    assert result.last_rollout_id == 2
    rows = [m for m in read_metrics(out) if "train/loss" in m]
    assert [m["weight_version"] for m in rows] == [1.0, 2.0, 3.0]
    assert all(m["async/staleness_max"] <= 1 and m["async/dropped_stale_groups"] == 0 for m in rows)
    # (a rollout whose groups all have equal rewards trains on no token: importance weight 0)
    assert all(m["async/trainer_wait_s"] >= 0 and m["train/importance_weight"] >= 0 for m in rows)
    assert not any(th.name == "rollout-producer" for th in threading.enumerate())


@pytest.mark.slow
def test_async_example_config_runs_locally(tmp_path, tiny_model_path):
    from pathlib import Path

    out = tmp_path / "run"
    example = Path(__file__).resolve().parents[2] / "examples" / "arith_grpo_async.yaml"
    overrides = tiny_overrides(
        tiny_model_path,
        out,
        **{
            "reward.type": "custom",
            "reward.function_path": "tests.reward_fns:even_first_token",
            "engine.max_num_seqs": 16,
            "data.n_eval_prompts": 0,
            "run.save_final": "false",
            "cluster.mode": "local",
            "cluster.rollout_num_gpus": 1,
            "train.num_rollout": 2,
        },
    )
    cfg = load_config(example, overrides)
    assert cfg.rollout.max_staleness == 1 and cfg.rollout.partial_rollout and cfg.decoupled_loss
    assert run_training(cfg).last_rollout_id == 1
    rows = [m for m in read_metrics(out) if "train/loss" in m]
    assert len(rows) == 2 and all(m["async/staleness_max"] <= 1 for m in rows)


@pytest.mark.slow
def test_async_run_resumes_from_a_checkpoint(tmp_path, tiny_model_path):
    out = tmp_path / "run"
    common = {"rollout.max_staleness": 1, "data.n_eval_prompts": 0, "run.save_interval": 1}
    first = run_training(_loop_cfg(tiny_model_path, out, **common, **{"train.num_rollout": 2}))
    assert first.last_rollout_id == 1
    resumed = run_training(_loop_cfg(tiny_model_path, out, **common, **{"train.num_rollout": 3, "run.load": str(out)}))
    assert resumed.last_rollout_id == 2
    rows = [m for m in read_metrics(out) if "train/loss" in m]
    assert [m["weight_version"] for m in rows] == [1.0, 2.0, 3.0]
    assert rows[-1]["async/staleness_max"] == 0  # the first rollout after a resume is generated afresh


@pytest.mark.slow
def test_ray_shutdown_mid_generation_ends_thread_and_actors(tmp_path, tiny_model_path):
    ray = pytest.importorskip("ray")
    cfg = _loop_cfg(
        tiny_model_path,
        tmp_path / "run",
        **{
            "cluster.mode": "ray",
            "cluster.actor_num_gpus_per_node": 1,
            "cluster.rollout_num_gpus": 1,
            "rollout.max_staleness": 2,
            "rollout.partial_rollout": "true",
            "rollout.rollout_max_response_len": 48,
            "train.num_rollout": 20,
            "data.n_eval_prompts": 0,
        },
    )
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        loop = RLLoop(cfg)
        engines = list(loop.cluster.engine.handles)
        loop.source.start(0, 20)
        loop.source.producer.take(0)  # the engine is generating rollouts 1 and 2 now
        t = time.perf_counter()
        loop.close()
        assert time.perf_counter() - t < 120
        assert not any(th.name == "rollout-producer" for th in threading.enumerate())
        for h in engines:  # ray.kill is asynchronous: a call right after it can still reach the actor
            deadline = time.monotonic() + 60
            with pytest.raises(ray.exceptions.RayActorError):
                while time.monotonic() < deadline:
                    ray.get(h.reseed.remote(0), timeout=60)
                    time.sleep(0.5)
    finally:
        ray.shutdown()
