"""The summaries of issue 26's multi-GPU bench scripts (bench/async_vs_sync.py, grpo_ray.py, tp_fsdp.py,
archs.py): pure functions, no processes started."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import archs  # noqa: E402
import async_vs_sync  # noqa: E402
import grpo_ray  # noqa: E402
import tp_fsdp  # noqa: E402


def result(k, seed, acc, sps=10.0):
    return {
        "max_staleness": k,
        "seed": seed,
        "partial_rollout": k > 0,
        "samples": 100,
        "wall_s": 10.0,
        "samples_per_s": sps,
        "tokens_per_s": 50 * sps,
        "trainer_wait_s": 1.0,
        "staleness_mean": 0.5 * k,
        "greedy_accuracy": acc,
    }


def test_accuracy_spread_per_staleness_over_seeds():
    rows = [result(0, 1, 0.30), result(0, 2, 0.26), result(2, 1, 0.28), result(2, 2, None)]
    table = async_vs_sync.accuracy_spread(rows)
    assert "| 0 | 2 | 28.0% | 4.0 points |" in table
    assert "| 2 | 1 | 28.0% | 0.0 points |" in table  # a run without an eval is left out
    assert "| 2 | 1 | yes |" in async_vs_sync.format_table(rows)


def test_grpo_ray_summary_skips_the_first_step_and_divides_by_gpus():
    def step(s, length):
        return {
            "rollout/num_samples": 8,
            "rollout/response_len_mean": length,
            "time/generate": s / 2,
            "time/logprob": 1.0,
            "time/train": 2.0,
            "time/sync": 0.5,
            "time/rollout_step": s,
            "train/logprob_abs_diff": 0.01,
        }

    r = grpo_ray.summarize([step(100.0, 10), step(4.0, 100), step(4.0, 100)], gpus=4)
    assert r["tok_s_gpu"] == pytest.approx(8 * 100 / 4.0 / 4) and r["step_s"] == 4.0 and r["train_s"] == 3.0
    assert grpo_ray.summarize([step(4.0, 100)], gpus=1)["tok_s_gpu"] == pytest.approx(200.0)  # one step: that one


def test_tp_fsdp_fingerprint_sees_a_permutation_the_norm_does_not():
    w = torch.arange(12.0).reshape(3, 4)
    a, b = tp_fsdp.fingerprint("w", w), tp_fsdp.fingerprint("w", w.flip(0))
    assert a[0] == pytest.approx(b[0]) and abs(a[1] - b[1]) > 1e-3
    diff, where = tp_fsdp.projection_diff({"w": b, "v": a}, {"w": a, "v": a})
    assert where == "w" and diff > 0


def test_tiny_overrides_keep_the_family():
    assert "num_experts" in archs.tiny_overrides("qwen3-moe-30b-a3b")
    assert "num_experts" not in archs.tiny_overrides("qwen2.5-7b")
    cfg = archs.hf_config("qwen3-moe-30b-a3b", **archs.tiny_overrides("qwen3-moe-30b-a3b"))
    assert cfg.model_type == "qwen3_moe" and cfg.num_hidden_layers == 2
    assert archs.ARCHS["qwen3-moe-15b-a1.8b"]["num_hidden_layers"] == 24
