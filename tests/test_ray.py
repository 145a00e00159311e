"""Ray placement on a local CPU cluster: 2 trainer actors (FSDP2 over gloo) + 1 engine actor; the
trace of such a run holds every process's own track (reinforge/cluster/ray_trace.py)."""

import json

import pytest

from reinforge.cluster.ray_cluster import ClusterError, check_resources, plan
from reinforge.config import load_config
from reinforge.utils import trace
from tests.test_integration import tiny_overrides

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
    assert [r["weight_version"] for r in train] == [1.0, 2.0]
    ckpt = out / "checkpoints" / "rollout_000001"
    assert (ckpt / "dcp" / "actor" / ".metadata").exists() and (ckpt / "model" / "config.json").exists()
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
    # every generation of the engine ran while the driver waited for one: a rollout or an eval;
    # each eval (the last one, after the last weight sync, too) has the engine's generations
    evals = spans("reinforge train", "eval")
    assert all(
        any(inside(g, w) for w in spans("reinforge train", "rollout") + evals) for g in spans("engine 0", "generate")
    )
    assert len(evals) == 2 and all(any(inside(g, e) for g in spans("engine 0", "generate")) for e in evals)
    for update in spans("reinforge train", "update_weights"):  # each rank gathered, the engine loaded
        for rank in ("trainer rank 0", "trainer rank 1"):
            assert any(inside(e, update) for e in spans(rank, "sync_broadcast") + spans(rank, "sync_colocated"))
        loaded = spans("engine 0", "update_weights") + spans("engine 0", "receive_bucket")
        assert any(inside(e, update) for e in loaded)
    assert trace.read_trace(path) == events


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
