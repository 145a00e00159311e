"""Plans for many GPUs (reinforge/plan/layout.py, issue 56 item 3): the layouts of `reinforge plan --gpus`,
and the predictions against the multi-GPU runs recorded in docs/multi_gpu.md and docs/benchmarks.md."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from reinforge.config import ConfigError, load_config
from reinforge.plan import GPUS
from reinforge.plan.layout import _plan_one, candidates, format_layouts, plan_layouts

H200 = GPUS["h200"]
BENCH = Path(__file__).resolve().parents[2] / "bench"


def model(tmp_path: Path, arch: str) -> Path:
    """bench/archs.py's ``arch`` with SmolLM2's vocabulary, as bench/grpo_long.py writes it (config only)."""
    sys.path.insert(0, str(BENCH))
    try:
        from archs import ARCHS
    finally:
        sys.path.remove(str(BENCH))
    folder = tmp_path / arch
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {**ARCHS[arch], "vocab_size": 49152, "tie_word_embeddings": True, "architectures": ["Qwen2ForCausalLM"]}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def grpo(path: Path, seqs: int, length: int, *extra: str):
    """bench/grpo_ray.py / bench/async_long.py's workload: 8 samples per prompt, packed, checkpointed."""
    return load_config(
        None,
        [
            f"model.path={path}",
            "model.gradient_checkpointing=true",
            f"rollout.rollout_batch_size={seqs // 8}",
            "rollout.n_samples_per_prompt=8",
            f"rollout.rollout_max_response_len={length}",
            "train.packing=sequences",
            f"train.max_tokens_per_gpu={max(16384, length + 256)}",
            *extra,
        ],
    )


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
    assert p.peaks["setup"] < 141e9 / 2**30  # each rank builds the whole model in fp32 before sharding: fits


def test_reinforge_plan_gpus(tmp_path, capsys):
    from reinforge.cli import main

    path = model(tmp_path, "qwen2.5-1.5b")
    args = ["plan", "--gpu", "h200", "--gpus", "2", "--prompt-len", "64", f"model.path={path}"]
    assert main([*args, "rollout.rollout_batch_size=8", "rollout.rollout_max_response_len=8192"]) == 0
    out = capsys.readouterr().out
    assert "2 x NVIDIA H200 on 1 node(s)" in out and "disaggregated 1+1 async" in out and "chosen:" in out
    assert main(["plan", "--gpus", "2", f"model.path={path}"]) == 2  # no GPU here and none named
