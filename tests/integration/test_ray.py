"""Ray placement on a local CPU cluster: 2 trainer actors (FSDP2 over gloo) + 1 engine actor; the
trace of such a run holds every process's own track (reinforge/cluster/ray_trace.py)."""

import json
import operator

import pytest
import torch

from reinforge.cluster.ray_cluster import ClusterError, check_resources, plan
from reinforge.config import load_config
from reinforge.utils import trace
from tests.integration.test_integration import tiny_overrides

ray = pytest.importorskip("ray")


def test_resource_check_reports_shortfall_in_words():
    cfg = load_config(None, ["cluster.mode=ray", "cluster.actor_num_gpus_per_node=4", "cluster.rollout_num_gpus=2"])
    assert plan(cfg) == {"trainers": 4, "engines": 2, "gpus": 6}
    with pytest.raises(
        ClusterError,
        match="disaggregated .* needs 6 GPUs .*actor_num_gpus_per_node = 4 \\+ rollout_num_gpus = 2.* has 4",
    ):
        check_resources(cfg, {"GPU": 4, "CPU": 64})
    cfg = load_config(
        None,
        [
            "cluster.mode=ray",
            "cluster.actor_num_gpus_per_node=4",
            "cluster.rollout_num_gpus=4",
            "cluster.colocate=true",
        ],
    )
    assert check_resources(cfg, {"GPU": 4, "CPU": 8}) is True
    with pytest.raises(ClusterError, match="colocated .* needs 4 GPUs .* has 2"):
        check_resources(cfg, {"GPU": 2, "CPU": 8})
    with pytest.raises(ClusterError, match="has no GPU, 2 CPU cores.*4 worker processes"):
        check_resources(cfg, {"CPU": 2})


def test_a_ray_the_run_starts_runs_its_workers_at_the_drivers_priority(monkeypatch, tmp_path):
    """Ray's default worker niceness is 15: the trainer and engine actors then waited behind every other
    process of a shared machine (minutes to start on the loaded 2-core test machine)."""
    from reinforge.cluster import ray_cluster
    from reinforge.cluster.base import ClusterSpec

    class Started(Exception):
        pass

    def init(**kwargs):
        raise Started(kwargs)

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray_cluster, "check_resources", lambda *a, **k: True)
    cfg = load_config(None, ["cluster.mode=ray", "cluster.actor_num_gpus_per_node=1", "cluster.rollout_num_gpus=1"])
    with pytest.raises(Started) as e:
        ray_cluster.RayCluster(cfg, ClusterSpec(tmp_path, None, None, 0, 64))
    assert e.value.args[0]["_system_config"] == {"worker_niceness": 0}


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=6, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.parametrize("colocate", [True, False])
def test_ray_grpo_two_rollouts(tmp_path, tiny_model_path, ray_cluster, colocate):
    out = tmp_path / "run"
    cfg = load_config(
        None,
        tiny_overrides(
            tiny_model_path,
            out,
            **{
                "cluster.mode": "ray",
                "cluster.actor_num_gpus_per_node": 2,
                "cluster.rollout_num_gpus": 1,
                "cluster.colocate": str(colocate).lower(),
                "cluster.weight_sync_bucket_mb": 1,
                "reward.type": "custom",
                "reward.function_path": "tests.reward_fns:even_first_token",
                "rollout.rollout_top_k": 8,
                "data.n_eval_prompts": 2,
                "run.save_final": "true",
                "run.trace": "true",
            },
        ),
    )
    from reinforge.loop import run_training

    result = run_training(cfg)
    assert result.last_rollout_id == 1
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/loss" in r]
    assert len(train) == 2 and all(r["time/sync"] > 0 for r in train)
    # the engine generated with the trainers' weights: fp32 log-probs agree
    assert all(r["train/logprob_abs_diff"] < 1e-4 for r in train)
    # every sync verified by checksums on both sides (colocated on CPU: by value; else a gloo broadcast)
    assert all(r["sync/verified"] == 1.0 and r["sync/verify_seconds"] >= 0 for r in train)
    assert [r["weight_version"] for r in train] == [1.0, 2.0]
    ckpt = out / "checkpoints" / "rollout_000001"
    assert (ckpt / "dcp" / "actor" / "hf_weights.json").exists() and (ckpt / "model" / "config.json").exists()
    check_merged_trace(out / "trace.json")


SLACK_US = 2000  # two processes of one machine: the same clock, up to rounding and drift between reads


def check_merged_trace(path):
    """One track group per process: the driver, each trainer rank, the engine; the actors' spans
    lie inside the driver's spans that waited for them."""
    events = json.loads(path.read_text())["traceEvents"]  # valid JSON as written
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    pid = {name: p for p, name in procs.items()}
    assert {"reinforge train", "trainer rank 0", "trainer rank 1", "engine 0"} <= set(pid), procs
    assert len(set(procs)) == len(procs) >= 4  # a pid each

    def spans(process, name):
        return [e for e in events if e["ph"] == "X" and e["pid"] == pid[process] and e["name"] == name]

    def inside(e, outer):
        return outer["ts"] - SLACK_US <= e["ts"] and e["ts"] + e["dur"] <= outer["ts"] + outer["dur"] + SLACK_US

    steps = spans("reinforge train", "rollout_step")
    assert [s["args"]["rollout_id"] for s in steps] == [0, 1]
    for step in steps:
        driver_train = next(e for e in spans("reinforge train", "train") if inside(e, step))
        driver_rollout = next(e for e in spans("reinforge train", "rollout") if inside(e, step))
        for rank in ("trainer rank 0", "trainer rank 1"):
            trained = [e for e in spans(rank, "train_actor") if inside(e, driver_train)]
            assert len(trained) == 1, (rank, step)  # the rank's own training, inside the driver's wait for it
            assert any(inside(e, trained[0]) for e in spans(rank, "micro_batch"))  # and its micro-batches
        generated = [e for e in spans("engine 0", "generate") if inside(e, driver_rollout)]
        assert generated and all(e["args"]["samples"] > 0 for e in generated)
    # every generation of the engine ran while the driver waited for one: a rollout, an eval or the
    # weight-sync probe; each eval (the last one, after the last weight sync, too) has the engine's generations
    evals = spans("reinforge train", "eval")
    waits = spans("reinforge train", "rollout") + evals + spans("reinforge train", "probe")
    assert all(any(inside(g, w) for w in waits) for g in spans("engine 0", "generate"))
    assert len(evals) == 2 and all(any(inside(g, e) for g in spans("engine 0", "generate")) for e in evals)
    for update in spans("reinforge train", "update_weights"):  # each rank gathered, the engine loaded
        for rank in ("trainer rank 0", "trainer rank 1"):
            assert any(inside(e, update) for e in spans(rank, "sync_broadcast") + spans(rank, "sync_colocated"))
        loaded = spans("engine 0", "update_weights") + spans("engine 0", "receive_bucket")
        assert any(inside(e, update) for e in loaded)
    assert trace.read_trace(path) == events


HUB_CASES = {
    "grpo-kl": [
        "algo.advantage_estimator=grpo",
        "algo.use_kl_loss=true",
        "algo.kl_loss_coef=0.1",
        "algo.use_kl_in_reward=true",
        "algo.kl_coef=0.1",
    ],
    "grpo": ["algo.advantage_estimator=grpo"],  # no KL: the samples of a group of equal rewards are skipped
    # (no value clipping: a token at the clip boundary would flip with the summation order, and the clip
    # fraction with it)
    "ppo-critic": [
        "algo.advantage_estimator=gae",
        "algo.use_kl_loss=true",
        "algo.kl_loss_coef=0.1",
        "critic.lr=1e-2",
        "critic.value_clip=null",
    ],
}


def hub_rollout(seed: int) -> list:
    """3 groups of 4 samples of varied lengths, rewards and tool tokens (2 ranks hold 2 and 1 groups); the
    second group's rewards are equal."""
    from reinforge.records import Sample

    g = torch.Generator().manual_seed(seed)
    groups = []
    for gi in range(3):
        prompt = torch.randint(10, 40000, (3 + gi,), generator=g).tolist()
        group = []
        for j in range(4):
            R = 3 + (gi * 4 + j * 3) % 8
            mask = [1] * R
            if j == 2:
                mask[1] = 0  # a tool's token
            group.append(
                Sample(
                    prompt="p",
                    tokens=prompt + torch.randint(10, 40000, (R,), generator=g).tolist(),
                    response_length=R,
                    reward=1.0 if gi == 1 else float(torch.rand(1, generator=g) > 0.5) + 0.1 * j,
                    loss_mask=mask,
                    rollout_log_probs=(-1.0 - torch.rand(R, generator=g)).tolist(),
                )
            )
        groups.append(group)
    return groups


@pytest.mark.parametrize("case", list(HUB_CASES))
def test_the_rollout_moves_once_and_trains_as_the_driver_hub_did(tmp_path, tiny_model_path, ray_cluster, case):
    """Cluster.score / train (the rollout put in the object store once, log-probs, values and
    advantages on the ranks that hold the samples, metrics back) against the loop before
    (2026-11-27: the driver pulled the log-probs and values of every sample, computed the advantages
    and sent everything to every rank), on 2 FSDP ranks over gloo: the same metrics and weights
    after 2 rollouts of 2 optimizer steps, with KL (loss and reward), without (a group of equal
    rewards skipped) and with a critic. The "before" flow runs on a twin TrainWorker in each rank's
    process (same process group, same initial weights), called as the old loop called the ranks."""
    from reinforge.cluster.base import ClusterSpec
    from reinforge.cluster.ray_cluster import RayCluster
    from reinforge.models.loading import load_tokenizer
    from reinforge.plan import resolve_config
    from reinforge.train.actor import TrainData
    from reinforge.train.rollout_advantages import compute_advantages
    from reinforge.train.rollout_share import RolloutBatch

    overrides = [
        f"model.path={tiny_model_path}",
        f"run.output_dir={tmp_path}",
        "cluster.mode=ray",
        "cluster.actor_num_gpus_per_node=2",
        "cluster.rollout_num_gpus=1",
        "cluster.colocate=false",
        "rollout.n_samples_per_prompt=4",
        "rollout.rollout_max_response_len=12",
        "train.num_steps_per_rollout=2",
        "train.num_rollout=2",
        "train.max_tokens_per_gpu=32",  # several micro-batches per rank
        "train.lr=1e-2",
        "train.clip_grad=1e9",
        "train.adam_eps=1e-3",  # updates proportional to the gradient: summation-order noise stays noise
        *HUB_CASES[case],
    ]
    cfg, _ = resolve_config(load_config(None, overrides), tiny_model_path)
    tok = load_tokenizer(tiny_model_path)
    cluster = RayCluster(cfg, ClusterSpec(tiny_model_path, None, tok, tok.pad_token_id or 0, 24))
    ranks = cluster.workers

    def make_twin(actor, cfg, path, rank, world):
        from reinforge.train.worker import TrainWorker

        actor.twin = TrainWorker(cfg, path, rank=rank, world_size=world)

    def on_twins(method, *args, **kwargs):  # the loop before: the same call, by value, to every rank
        call = operator.attrgetter(method)  # ("actor.train": the worker's actor's method)
        return ray.get(
            [w.__ray_call__.remote(lambda a, *x, **k: call(a.twin)(*x, **k), *args, **kwargs) for w in ranks]
        )[0]

    def weights(attr):
        def get(actor):
            w = getattr(actor, attr)
            return {
                "actor": w.actor.full_state_dict(),
                "critic": w.critic.full_state_dict() if w.critic is not None else {},
            }

        return ray.get([w.__ray_call__.remote(get) for w in ranks])[0]

    try:
        ray.get([w.__ray_call__.remote(make_twin, cfg, str(tiny_model_path), i, 2) for i, w in enumerate(ranks)])
        for rollout_id in range(2):
            groups = hub_rollout(rollout_id)
            flat = [s for g in groups for s in g]
            # before: the driver as the hub of per-token data
            old = on_twins("actor.compute_log_probs", flat)
            ref = on_twins("actor.compute_log_probs", flat, reference=True) if cluster.has_reference else None
            values = on_twins("critic.compute_values", flat) if cluster.has_critic else None
            adv = compute_advantages(cfg.algo, groups, 12, values=values, old_log_probs=old, ref_log_probs=ref)
            every = torch.cat(adv.advantages)
            before = {
                "rollout/advantage_mean": float(every.mean()),
                "rollout/advantage_std": float(every.std()),
                "rollout/advantage_abs_mean": float(every.abs().mean()),
                "rollout/shaped_reward_mean": float(adv.rewards.mean()),
            }
            hub = [0] * len(flat)  # data-parallel rank 0 holds every sample's rows, as the driver did
            if cluster.has_critic:
                before.update(on_twins("critic.train", flat, adv.returns, values, rollout_id, hub))
            before.update(on_twins("actor.train", TrainData(flat, adv.advantages, old, ref, hub), rollout_id))
            # after: the rollout moves once
            after = cluster.score(RolloutBatch(groups, rollout_id))
            after.update(cluster.train(rollout_id))
            after.pop("time/train_critic", None)
            assert set(after) == set(before)
            for k, v in before.items():
                assert after[k] == pytest.approx(v, rel=1e-4, abs=1e-6), (rollout_id, k)
            assert before["train/grad_norm"] > 0 and ("train/kl" in before) == (case != "grpo")
            if case == "grpo":  # the equal group's 4 samples did not run
                assert 0 < before["train/trained_token_fraction"] < 1
        a, b = weights("twin"), weights("worker")
        assert set(a["actor"]) == set(b["actor"]) and set(a["critic"]) == set(b["critic"])
        assert bool(a["critic"]) == (case == "ppo-critic")
        for part in ("actor", "critic"):
            for name, t in a[part].items():
                torch.testing.assert_close(b[part][name], t, rtol=1e-4, atol=1e-6, msg=f"{part} {name}")
        from safetensors.torch import load_file

        start = load_file(str(tiny_model_path / "model.safetensors"))
        assert max(float((b["actor"][n] - t.float()).abs().max()) for n, t in start.items() if n in b["actor"]) > 1e-3
    finally:
        cluster.shutdown()


class _BrokenEngine:
    def generate(self, requests):
        raise RuntimeError("CUDA error: out of memory")


def test_engine_failure_names_engine_node_and_gpu(ray_cluster):
    from reinforge.cluster.ray_cluster import EnginePool
    from reinforge.records import GenerateRequest, SamplingParams

    handle = ray.remote(_BrokenEngine).remote()
    pool = EnginePool([handle], [{"index": 0, "node": "10.0.0.7", "gpus": ["3"]}])
    with pytest.raises(
        RuntimeError,
        match="rollout engine 0 on node 10.0.0.7 \\(GPU 3\\) failed: RuntimeError: CUDA error: out of memory",
    ):
        pool.generate([GenerateRequest([1, 2], SamplingParams(max_new_tokens=2))])


def test_colocated_ranks_release_their_cached_memory_before_the_engines_wake(monkeypatch):
    """Colocated, each engine is another process on its rank's GPU: the ranks hand their cached blocks back
    to the driver after training, before the engines wake up and allocate their KV caches."""
    from types import SimpleNamespace

    from reinforge.cluster import ray_cluster

    calls = []

    class Remote:
        def __init__(self, name):
            self.name = name

        def remote(self, *args):
            calls.append((self.name, args))
            return None

    cl = ray_cluster.RayCluster.__new__(ray_cluster.RayCluster)
    cl.cfg = SimpleNamespace(cluster=SimpleNamespace(colocate=True))
    cl.workers = [SimpleNamespace(call=Remote("rank")) for _ in range(2)]
    cl.engine = SimpleNamespace(wake_up=lambda: calls.append(("wake_up", ())))
    monkeypatch.setattr(ray_cluster, "get_all", lambda refs: list(refs))
    cl.after_train()
    assert calls == [("rank", ("release_cached_memory",))] * 2 + [("wake_up", ())]
