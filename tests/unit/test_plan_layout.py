"""Plans for many GPUs (reinforge/plan/layout.py, issue 56 item 3): the layouts of `reinforge plan --gpus`,
and the predictions against the multi-GPU runs recorded in docs/multi_gpu.md and docs/benchmarks.md."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from reinforge.config import ConfigError
from reinforge.plan import GPUS
from reinforge.plan.layout import _plan_one, candidates, format_layouts, plan_layouts

H200 = GPUS["h200"]
BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
try:  # the recorded runs' workloads, shared with bench/plan_multi_vs_measured.py
    import plan_multi_vs_measured as bench
    from plan_multi_vs_measured import grpo, model
finally:
    sys.path.remove(str(BENCH))


def test_candidates_place_trainers_in_whole_nodes():
    names = [n for n, _ in candidates(4, 2)]
    assert names[0] == "colocated" and "disaggregated 2+2 async" in names
    assert "disaggregated 1+3" not in names  # 3 trainers do not fill whole nodes of 2
    keys = dict(candidates(4, 2))["disaggregated 2+2"]
    assert (keys["cluster.actor_num_nodes"], keys["cluster.actor_num_gpus_per_node"]) == (1, 2)
    with pytest.raises(ConfigError, match="--nodes=3"):
        candidates(4, 3)


def test_the_recorded_async_run_on_two_h200s_within_25_percent(tmp_path):
    """Run 1a of docs/benchmarks.md (2026-11-28): 64 x 8k (mean 7,100-7,900 tokens) on 1 engine GPU + 1
    trainer GPU, steady-state step 45.9 s synchronous (generation 30.1, training 15.6), 33.2 s with
    `max_staleness` 2 and partial rollouts: predicted at a mean of 7,500 tokens, within 25%."""
    path = model(tmp_path, "qwen2.5-1.5b")
    cfg = grpo(path, 64, 8192, "engine.kv_cache_memory_fraction=0.85")
    lengths = [7500] * 64
    plans = {n: _plan_one(cfg, path, H200, 64, n, k, lengths) for n, k in candidates(2, 1)}
    sync, run_async = plans["disaggregated 1+1"], plans["disaggregated 1+1 async"]
    assert sync.times["generation"] / 30.1 == pytest.approx(1.0, abs=0.25)
    assert (sync.times["log-probs"] + sync.times["training"]) / 15.6 == pytest.approx(1.0, abs=0.25)
    assert sync.step / 45.9 == pytest.approx(1.0, abs=0.25)
    assert run_async.step / 33.2 == pytest.approx(1.0, abs=0.25)
    assert 1.2 < sync.step / run_async.step <= 1.6  # measured 1.38x; the bound (gen + train) / gen: 1.52x
    best = plan_layouts(cfg, path, H200, 2, 1, 64)
    assert best[0].name == "colocated" and best[0].problem is None  # on 2 GPUs neither side idles colocated
    text = format_layouts(best, H200, 2, 1)
    assert "chosen: cluster.mode=ray" in text and "cluster.colocate=true" in text


def test_the_recorded_7b_run_on_four_h200s(tmp_path):
    """Run 2 `co4k` (2026-11-28, 4 H200s, two Ray nodes' worth of trainers): generation 23.3 s, log-probs +
    training 13.4 s, weight sync 0.69 s. Generation and the sync within 25%; training is the known miss
    (57% MFU measured against the 38% the planner assumes: docs/planner.md), so the step is 1.3x."""
    path = model(tmp_path, "qwen2.5-7b")
    cfg = grpo(path, 128, 4096, "engine.kv_cache_memory_fraction=0.3")
    (name, keys) = candidates(4, 2)[0]
    p = _plan_one(cfg, path, H200, 64, name, keys)
    assert p.problem is None and p.times["generation"] / 23.3 == pytest.approx(1.0, abs=0.25)
    assert p.times["weight sync"] / 0.69 == pytest.approx(1.0, abs=0.25)
    assert 1.25 < (p.times["log-probs"] + p.times["training"]) / 13.4 < 1.6  # the miss, pinned
    assert "setup" not in p.peaks  # plain FSDP2: each rank loads only its shard (train/shard_load.py)


def test_reinforge_plan_gpus(tmp_path, capsys):
    from reinforge.cli import main

    path = model(tmp_path, "qwen2.5-1.5b")
    args = ["plan", "--gpu", "h200", "--gpus", "2", "--prompt-len", "64", f"model.path={path}"]
    assert main([*args, "rollout.rollout_batch_size=8", "rollout.rollout_max_response_len=8192"]) == 0
    out = capsys.readouterr().out
    assert "2 x NVIDIA H200 on 1 node(s)" in out and "disaggregated 1+1 async" in out and "chosen:" in out
    assert main(["plan", "--gpus", "2", f"model.path={path}"]) == 2  # no GPU here and none named


# The rows of bench/plan_multi_vs_measured.py outside 25%, each with its reason (docs/benchmarks.md, "The planner on
# several GPUs"): (run, phase) -> (lowest, highest) predicted / measured.
MISSES = {
    ("2 co4k 7B", "trainer"): (1.25, 1.45),  # 57% MFU measured against the 38% fit on one GPU
    ("5 di SmolLM2 2 nodes", "trainer"): (0.1, 0.2),  # a 135M model: fixed per-step costs, not FLOPs
    ("5 di SmolLM2 2 nodes", "weight sync"): (0.1, 0.2),  # the cross-node broadcast's fixed cost
    ("5 di SmolLM2 2 nodes", "step"): (0.3, 0.5),
    **{(f"3 {r} 15B MoE", "weight sync"): (2.2, 3.0) for r in ("fsdp", "ep", "ep-rr")},  # not bound by bytes
    **{(f"pipeline {r}", "trainer"): (0.05, 0.3) for r in bench.PIPELINE_ROWS},  # a 0.5B model: fixed costs
    **{("placement colocated", ph): (0.04, 0.2) for ph in ("generation", "trainer", "step")},  # 135M: fixed costs
    **{("placement disaggregated", ph): (0.05, 0.25) for ph in ("generation", "trainer", "step")},
    ("fsdp2 two GPUs", "trainer"): (0.15, 0.35),
    **{(f"pipeline {r}", bench.RELATIVE): (0.4, 0.65) for r in ("pp2-tp2 (2)", "tp2 (2)", "tp2-sp (2)")},  # DTensor TP
}


def test_every_recorded_multi_gpu_run_within_25_percent_or_a_named_miss(tmp_path):
    """bench/plan_multi_vs_measured.py's table: each measured phase of every multi-GPU run recorded, predicted
    from its settings, within 25% except the misses of :data:`MISSES`, each pinned to its range."""
    table = bench.rows(tmp_path)
    seen = set()
    for run, _, phase, pred, meas in table:
        lo, hi = MISSES.get((run.name, phase), (0.75, 1.25))
        seen.add((run.name, phase))
        assert lo <= pred / meas <= hi, (run.name, phase, pred, meas)
    assert set(MISSES) <= seen
    ep = {r.name: p for r, _, phase, p, _ in table if phase == "trainer" and "15B" in r.name}
    assert 1.05 < ep["3 ep 15B MoE"] / ep["3 fsdp 15B MoE"] < 1.3  # the all-to-all: measured 1.14x
    rel = {r.name: p / m for r, _, phase, p, m in table if phase == bench.RELATIVE}
    assert all(0.85 < rel[f"pipeline {r} (1)"] < 1.1 for r in ("pp2", "pp2-vpp2", "pp4"))  # the bubble


def test_the_ladder_offers_expert_and_pipeline_parallelism_only_where_the_trainer_runs_them(tmp_path):
    moe = model(tmp_path, "qwen3-moe-15b-a1.8b")
    from reinforge.plan.layout import ladder

    assert {"train.expert_model_parallel_size": 4} in ladder(True, 4)
    assert {"train.expert_model_parallel_size": 8} not in ladder(True, 4)  # within a node
    assert not any("train.expert_model_parallel_size" in x for x in ladder(False, 8))
    assert {"train.pipeline_model_parallel_size": 2} in ladder(False, 8)
    cfg = grpo(moe, 128, 2048, "engine.kv_cache_memory_fraction=0.3")
    keys = dict(candidates(4, 1))["colocated"]
    p = _plan_one(cfg, moe, H200, 64, "colocated", keys, only={"train.expert_model_parallel_size": 2})
    assert p.problem is None and p.keys["train.expert_model_parallel_size"] == 2
    bad = _plan_one(cfg, moe, H200, 64, "colocated", keys, only={"train.expert_model_parallel_size": 3})
    assert bad.problem is not None  # 3 divides neither the 4 data-parallel ranks nor the 128 experts
    odd = model(tmp_path, "smollm2")  # 30 layers: 4 pipeline stages do not divide them
    p4 = _plan_one(
        grpo(odd, 64, 1024), odd, H200, 64, "colocated", keys, only={"train.pipeline_model_parallel_size": 4}
    )
    assert p4.problem is not None and "num_hidden_layers" in p4.problem


def test_the_layouts_step_is_the_simulation_and_async_chooses_max_staleness(tmp_path):
    path = model(tmp_path, "qwen2.5-1.5b")
    cfg = grpo(path, 64, 8192, "engine.kv_cache_memory_fraction=0.85")
    plans = {p.name: p for p in plan_layouts(cfg, path, H200, 2, 1, 64)}
    sync, run_async = plans["disaggregated 1+1"], plans["disaggregated 1+1 async"]
    t = sync.times
    assert sync.step == pytest.approx(t["generation"] + t["log-probs"] + t["training"] + t["weight sync"])
    assert run_async.keys["rollout.max_staleness"] >= 1 and run_async.sim is not None
    assert run_async.sim.trainer_idle > run_async.sim.engine_idle  # generation is the longer side at 8k
    assert "idle e/t" in format_layouts(list(plans.values()), H200, 2, 1)


def test_an_async_choice_names_the_side_that_idles():
    from reinforge.plan.layout import LayoutPlan
    from reinforge.plan.simulate import SimResult

    times = {"generation": 86.0, "log-probs": 0.0, "training": 52.0, "weight sync": 4.9}
    keys = {"cluster.colocate": False, "rollout.max_staleness": 1}
    plan = LayoutPlan(
        "disaggregated 4+4 async", keys, times, 92.9, 1412.0, {}, sim=SimResult(64, 6000, 92.9, 0.01, 0.4, 1)
    )
    text = format_layouts([plan], H200, 8, 1)
    assert "max_staleness=1: the smallest" in text
    assert "the trainers idle 40% of the step: the engines' side is the longer" in text
