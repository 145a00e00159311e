"""Predicted vs measured (issue 37 item 2, reinforge/plan/report.py): the long-tail estimate, the
bottleneck's choice and its message on synthetic numbers for a GPU of given bandwidth and FLOP/s, the
CPU fallback, and a short real run whose metrics, summary and trace carry the plan."""

from __future__ import annotations

import math

import pytest

from reinforge.config import load_config
from reinforge.loop import run_training
from reinforge.plan import GPU, GPUS, planner, resolve_config
from reinforge.plan import model as M
from reinforge.plan.report import PlanReport, predict, tail_share
from reinforge.records import Sample
from reinforge.utils import trace
from tests.integration.test_integration import read_metrics, tiny_overrides
from tests.unit.test_plan import M139, folder, grpo16k

GPU_X = GPU("Test GPU", 80 * 10**9, bandwidth=2.0e12, bf16_flops=500e12)  # round figures for the formulas


def samples(lengths: list[int], prompt: int = 30) -> list[Sample]:
    return [Sample("p", [1] * (prompt + n), n) for n in lengths]


def test_tail_share_by_hand():
    # 4 slots, three sequences of 10 tokens and one of 100: after step 10 one slot of 4 is busy
    assert tail_share([10, 10, 10, 100], 4) == pytest.approx(0.9)
    assert tail_share([50] * 8, 4) == 0.0  # equal lengths: every slot busy to the end
    # 2 slots, lengths 10, 30, 10: slot ends at 20 and 30; fewer than half busy means none: no tail
    assert tail_share([10, 30, 10], 2) == 0.0
    assert tail_share([], 8) == 0.0 and tail_share([7], 8) == 0.0


def _report(tmp_path, *extra: str) -> PlanReport:
    path = folder(tmp_path, M139)
    cfg = grpo16k(path, "train.num_rollout=3", *extra)
    return PlanReport(resolve_config(cfg, path, gpu=GPU_X, prompt_len=30)[1])


def _feed(report: PlanReport, gen: list[Sample], fractions: dict[str, float], rollouts: int = 3) -> list[dict]:
    """Rollouts whose measured seconds put each phase at the given share of its limit."""
    _, limit, _ = predict(report.plan.workload, report.plan.cfg, gen, gen)
    metrics = {"time/generate": 0.0, "time/logprob": 0.0, "time/train": 0.0, "time/sync": 0.0}
    for phase, key in (("generation", "time/generate"), ("training", "time/train"), ("sync", "time/sync")):
        metrics[key] = limit[phase] / fractions[phase]
    return [report.rollout(dict(metrics), [gen], gen) for _ in range(rollouts)]


def test_generation_with_a_long_tail_is_named_with_over_sampling(tmp_path):
    report = _report(tmp_path)
    w = report.plan.workload
    assert w.gpu is GPU_X and w.recompute == 6
    gen = samples([2000] * 120 + [16000] * 8)  # 8 of 128 run long: most decode steps have few sequences busy
    out = _feed(report, gen, {"generation": 0.41, "training": 0.35, "sync": 0.5})
    m = out[-1]
    assert m["plan/generation_limit_fraction"] == pytest.approx(0.41)
    assert m["plan/training_limit_fraction"] == pytest.approx(0.35)
    # the fraction's formula: decode bytes / bandwidth + prefill FLOPs / peak (no host time), over the measured seconds
    lengths = [s.response_length for s in gen]
    bound = M.generation_seconds(M.with_(w, num_seqs=len(gen)), lengths, efficiency=1.0, mfu=1.0, host_step_s=0.0)
    assert m["plan/generation_limit_fraction"] == pytest.approx(bound / m["plan/generation_measured_s"])
    assert m["plan/generation_predicted_s"] == pytest.approx(M.generation_seconds(M.with_(w, num_seqs=128), lengths))
    assert m["plan/generation_ratio"] == pytest.approx(
        m["plan/generation_measured_s"] / m["plan/generation_predicted_s"]
    )
    # MFU: 6 x active parameters per token + causal attention (no recomputation) over peak x seconds
    seqs = [len(s.tokens) for s in gen]
    flops = 3 * M.forward_flops(M.with_(w, prompt_len=0), seqs)
    assert m["plan/training_limit_fraction"] == pytest.approx(
        flops / (GPU_X.bf16_flops * m["plan/training_measured_s"])
    )
    assert 0.5 < m["plan/generation_tail_share"] < 1
    assert "plan/logprob_predicted_s" not in m and "plan/logprob_limit_fraction" not in m  # no log-prob pass ran
    line = report.end_line()
    assert line.startswith("plan: generation at 41% of the bandwidth limit (")
    assert f"the long tail is {m['plan/generation_tail_share']:.0%} of it: consider over-sampling" in line
    assert "rollout.over_sampling_batch_size > rollout.rollout_batch_size=16" in line


def test_training_far_from_peak_is_named_with_the_recompute_that_fits(tmp_path):
    report = _report(tmp_path, "model.recompute_num_layers=28")  # every layer where 6 would do
    gen = samples([12000] * 128)  # equal lengths: no tail
    _feed(report, gen, {"generation": 0.9, "training": 0.18, "sync": 0.5})
    phase, totals = report.bottleneck()
    assert phase == "training" and totals.fraction == pytest.approx(0.18)
    w = report.plan.workload
    fits = M.min_recompute_that_fits(w, 16640, w.usable * planner.AUTO_HEADROOM)
    assert 0 < fits < 28
    assert report.end_line().startswith("plan: training at 18% MFU (")
    assert report.end_line().endswith(f": recompute {fits} of 28 layers (model.recompute_num_layers={fits}; now 28)")


def test_the_phase_with_most_seconds_above_its_limit_wins_not_the_lowest_share(tmp_path):
    report = _report(tmp_path)
    gen = samples([12000] * 128)
    # weight sync at 5% of its limit is a fraction of a second; generation at 60% is minutes
    _feed(report, gen, {"generation": 0.6, "training": 0.5, "sync": 0.05})
    assert report.bottleneck()[0] == "generation"
    line = report.end_line()
    assert "generation at 60% of the bandwidth limit" in line and "long tail" not in line


def test_a_phase_faster_than_its_limit_did_less_work_and_is_not_predicted(tmp_path):
    """H100, SWE environment, every reward 0 (2026-11-25): the training step skipped its passes (all
    advantages zero) and measured 0.012 s against a 0.1 s limit, a limit fraction of 9: such a rollout
    gets no prediction for the phase and leaves the end line alone."""
    report = _report(tmp_path)
    gen = samples([12000] * 128)
    m = _feed(report, gen, {"generation": 0.5, "training": 9.0, "sync": 0.5})[-1]
    assert "plan/training_measured_s" in m
    assert not any(k.startswith(("plan/training_limit", "plan/training_pred", "plan/training_ratio")) for k in m)
    assert report.bottleneck()[0] == "generation"


def test_first_rollout_left_out_when_there_are_more(tmp_path):
    report = _report(tmp_path)
    gen = samples([12000] * 128)
    _feed(report, gen, {"generation": 0.05, "training": 0.5, "sync": 0.5}, rollouts=1)  # start-up: slow
    assert report.end_line().startswith("plan: generation at 5%")
    _feed(report, gen, {"generation": 0.9, "training": 0.2, "sync": 0.5}, rollouts=2)
    assert report.end_line().startswith("plan: training at 20% MFU")


def test_without_a_gpu_only_measured_times_and_the_reason(tmp_path):
    path = folder(tmp_path, M139)
    report = PlanReport(resolve_config(grpo16k(path), path, gpu=None)[1])
    out = report.rollout({"time/generate": 2.0, "time/logprob": 0.5, "time/train": 1.0, "time/sync": 0.1}, [[]], [])
    assert out == {
        "plan/generation_measured_s": 2.0,
        "plan/logprob_measured_s": 0.5,
        "plan/training_measured_s": 1.0,
        "plan/sync_measured_s": 0.1,
    }
    line = report.end_line()
    assert line.startswith("plan: no hardware limit given (no GPU (a CPU run)")
    assert "generation 2.00 s" in line
    unknown = GPU("Some GPU", 48 * 10**9, None, None, "torch only")
    report = PlanReport(resolve_config(grpo16k(path), path, gpu=unknown, prompt_len=30)[1])
    report.rollout({"time/generate": 2.0}, [[]], [])
    assert "Some GPU is not in the planner's table" in report.end_line()


def test_run_logs_plan_metrics_prints_and_traces_the_bottleneck(tmp_path, tiny_model_path, monkeypatch, capsys):
    """A tiny CPU run planned as if on an H100 (a CPU has no limits): every rollout's metrics carry
    plan/* for each phase with finite values; the summary and the trace name the bottleneck."""
    monkeypatch.setattr(planner, "detect", lambda device=None: GPUS["h100"])
    out = tmp_path / "run"
    cfg = load_config(
        None,
        tiny_overrides(
            tiny_model_path,
            out,
            **{
                "algo.use_kl_loss": "true",  # a reference log-prob pass
                "algo.kl_loss_coef": 0.01,
                "run.trace": "true",
                "run.tensorboard": "false",
                "data.n_eval_prompts": 0,
                "run.save_final": "false",
            },
        ),
    )
    run_training(cfg)
    rows = [m for m in read_metrics(out) if "time/train" in m]
    assert len(rows) == 2
    for m in rows:
        for phase in ("generation", "logprob", "training", "sync"):
            for kind in ("predicted_s", "measured_s", "ratio", "limit_fraction"):
                key = f"plan/{phase}_{kind}"
                assert key in m and math.isfinite(m[key]) and m[key] > 0, key
        assert m["plan/training_measured_s"] == m["time/train"] and m["plan/logprob_measured_s"] == m["time/logprob"]
        assert 0 <= m["plan/generation_tail_share"] < 1
    printed = capsys.readouterr().out
    assert "\nplan: " in printed and "% " in printed
    events = trace.read_trace(out / "trace.json")
    plans = [e for e in events if e.get("ph") == "i" and e["name"] == "plan"]
    assert len(plans) == 2 and plans[0]["args"]["training_measured_s"] == pytest.approx(rows[0]["time/train"], abs=1e-5)
    end = [e for e in events if e.get("ph") == "i" and e["name"] == "plan_bottleneck"]
    assert len(end) == 1 and end[0]["args"]["message"] in printed and end[0]["args"]["phase"] in printed


def _disaggregated(tmp_path, staleness: int) -> PlanReport:
    cfg_extra = (
        "cluster.mode=ray",
        "cluster.colocate=false",
        "cluster.actor_num_gpus_per_node=1",
        "cluster.rollout_num_gpus=1",
        f"rollout.max_staleness={staleness}",
        "cluster.offload_rollout=false",  # (grpo16k's, for one GPU)
    )
    return _report(tmp_path, *cfg_extra)


def test_separate_gpus_name_the_overlap_and_the_longer_side(tmp_path):
    """Run 1a of docs/multi_gpu.md (2026-11-28): generation 30 s, training 15 s per rollout."""
    gen = samples([8000] * 64)
    metrics = {"time/generate": 30.0, "time/logprob": 0.0, "time/train": 15.0, "time/sync": 0.1}
    sync = _disaggregated(tmp_path, 0)
    assert not sync.plan.workload.colocated
    for _ in range(3):
        sync.rollout(dict(metrics), [gen], gen)
    assert sync.balance_line() == (
        "plan: generation (30.00 s per rollout) and the trainer (15.00 s) take turns on separate GPUs: "
        "rollout.max_staleness=1 overlaps them (a step of the longer instead of the sum: up to 1.50x)"
    )
    assert sync.finish().endswith(sync.balance_line())
    # asynchronous: the producer's generation seconds, the longer side named with its GPUs' key
    lag = _disaggregated(tmp_path, 2)
    for _ in range(3):
        lag.rollout({**metrics, "time/generate": 2.0, "async/producer_generate_s": 30.0}, [gen], gen)
    assert lag.balance_line() == (
        "plan: asynchronous on separate GPUs, a step is at least its longer side: generation (30.00 s per "
        "rollout) is 2.0x the trainer (15.00 s); more GPUs for it (cluster.rollout_num_gpus) would shorten the step"
    )
    even = _disaggregated(tmp_path, 2)
    for _ in range(3):
        even.rollout({**metrics, "async/producer_generate_s": 16.0}, [gen], gen)
    assert even.balance_line() is None  # within BALANCE
    assert _report(tmp_path).balance_line() is None  # colocated: nothing to balance


def test_engine_slots_are_counted_against_each_engines_share(tmp_path):
    """Run 2 of docs/multi_gpu.md (4 H200s, 2026-11-28): 128 sequences over 4 colocated engines of 32
    slots each all decode at once; the end line said "only 32 of 128 sequences decode at once"."""
    ray4 = (
        "cluster.mode=ray",
        "cluster.actor_num_gpus_per_node=4",
        "cluster.rollout_num_gpus=4",
        "cluster.colocate=true",
        "cluster.offload_rollout=false",
    )
    gen = samples([12000] * 128)
    for slots, expected in (
        (32, "engine.kv_cache_dtype=fp8 halves the KV cache each decode step reads"),
        (16, "only 16 of the 32 sequences of each of 4 engines decode at once: raise engine.max_num_seqs"),
    ):
        report = _report(tmp_path, *ray4, f"engine.max_num_seqs={slots}", "engine.kv_cache_dtype=auto")
        w = report.plan.workload
        assert w.engines == 4  # the start-of-run table: the engines generate their shares at the same time
        assert M.times(w)["generation"] == pytest.approx(M.generation_seconds(M.with_(w, engines=1, num_seqs=32)))
        _feed(report, gen, {"generation": 0.3, "training": 0.9, "sync": 0.9})
        assert report.bottleneck()[0] == "generation"
        assert expected in report.end_line()
    one = _report(tmp_path, "engine.max_num_seqs=64", "engine.kv_cache_dtype=auto")  # one engine: the whole rollout
    _feed(one, gen, {"generation": 0.3, "training": 0.9, "sync": 0.9})
    assert "only 64 of the 128 sequences decode at once" in one.end_line()
    auto = _report(tmp_path, *ray4, "engine.max_num_seqs=auto").plan  # the choice counts one engine's share
    choice = next(c for c in auto.choices if c.key == "engine.max_num_seqs")
    assert choice.value == 32 and "all 32 of the 32 sequences of each of 4 engines" in choice.reason
