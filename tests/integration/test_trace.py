"""The run's timeline (run.trace, reinforge/utils/trace.py) and the trainer-vs-engine log-prob
mismatch statistics (reinforge/algo/mismatch.py)."""

import json
import math
import threading

import numpy as np
import pytest
import torch

from reinforge.algo.mismatch import mismatch_stats, quantiles, token_log_ratios
from reinforge.config import load_config
from reinforge.loop import run_training
from reinforge.utils import trace
from tests.integration.test_integration import read_metrics, tiny_overrides


# ---------------------------------------------------------------------------------------- trace file
def _spans(events, name=None):
    return [e for e in events if e.get("ph") == "X" and (name is None or e["name"] == name)]


def test_trace_file_is_complete_json_after_every_event(tmp_path):
    path = tmp_path / "trace.json"
    writer = trace.start_trace(path, "test")
    try:
        assert trace.active()
        with trace.span("outer", "loop", step=1) as outer:
            json.loads(path.read_text())  # valid while a span is open (a crash here keeps the file)
            with trace.span("inner", "train"):
                pass
            trace.instant("preempt", "engine", slot=3)
        events = trace.read_trace(path)
        assert json.loads(path.read_text())["displayTimeUnit"] == "ms"  # the object form, no repair needed
    finally:
        trace.stop_trace()
    assert not trace.active() and writer._fd == -1
    inner, out = _spans(events, "inner")[0], _spans(events, "outer")[0]
    assert out["args"] == {"step": 1} and out["cat"] == "loop"
    assert out["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= out["ts"] + out["dur"] + 1e-3  # nested
    assert abs(out["dur"] / 1e6 - outer.seconds) < 1e-3
    assert [e["args"]["slot"] for e in events if e["ph"] == "i"] == [3]
    names = {e["name"]: e["args"] for e in events if e["ph"] == "M"}
    assert names["process_name"] == {"name": "test"} and names["thread_name"] == {"name": "loop"}


def test_trace_continues_an_existing_file_and_replaces_a_foreign_one(tmp_path):
    path = tmp_path / "trace.json"
    trace.start_trace(path)
    with trace.span("first"):
        pass
    trace.stop_trace()
    trace.start_trace(path)  # a resumed run: appended, on the same time axis
    with trace.span("second"):
        pass
    trace.stop_trace()
    first, second = (_spans(trace.read_trace(path), n)[0] for n in ("first", "second"))
    assert second["ts"] >= first["ts"] + first["dur"]
    path.write_text("not a trace")
    trace.start_trace(path)
    trace.stop_trace()
    assert _spans(trace.read_trace(path)) == []


def test_read_trace_accepts_the_array_form_without_its_bracket(tmp_path):
    path = tmp_path / "t.json"
    path.write_text('[{"ph": "X", "name": "a", "ts": 1, "dur": 2, "pid": 1, "tid": 1},\n')
    assert trace.read_trace(path)[0]["name"] == "a"
    path.write_text('{"nothing": 1}')
    with pytest.raises(ValueError, match="traceEvents"):
        trace.read_trace(path)


def test_threads_get_their_own_tracks_and_spans_time_without_a_trace(tmp_path):
    with trace.span("untraced") as s:  # no trace open: still timed, nothing written
        pass
    assert s.seconds >= 0 and not list(tmp_path.iterdir())
    path = tmp_path / "trace.json"
    trace.start_trace(path)
    try:

        def work():
            with trace.span("producer_work"):
                pass

        t = threading.Thread(target=work, name="rollout-producer")
        with trace.span("loop_work"):
            t.start()
            t.join()
        assert list(trace.spans_over("item", ["a", "b"])) == ["a", "b"]
    finally:
        trace.stop_trace()
    events = trace.read_trace(path)
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    loop, producer = _spans(events, "loop_work")[0], _spans(events, "producer_work")[0]
    assert tracks[loop["tid"]] == "loop" and tracks[producer["tid"]] == "rollout-producer"
    assert loop["ts"] <= producer["ts"] <= loop["ts"] + loop["dur"]  # overlapping, on two tracks
    assert [e["args"]["index"] for e in _spans(events, "item")] == [0, 1]


def test_another_process_records_into_memory_and_the_writer_merges_it(tmp_path):
    """The Ray actors' side (start_buffer / drain) and the driver's (merge, collectors), in one process."""
    trace.start_buffer("trainer rank 0", main_thread="train", sort_index=1)
    try:
        assert trace.active() and not trace.writing()
        with trace.span("train_actor", "train"):
            with trace.span("micro_batch", "train"):
                pass
        events = trace.drain()
        assert trace.drain() == []  # handed over once
    finally:
        trace.stop_trace()
    assert trace.drain() == [] and trace.merge(events) == 0  # nothing open: nothing to do
    meta = {e["name"]: e["args"] for e in events if e["ph"] == "M"}
    assert meta["process_name"] == {"name": "trainer rank 0"} and meta["thread_name"] == {"name": "train"}
    assert meta["process_sort_index"] == {"sort_index": 1}
    shift = 1e6  # another node's clock, one second behind: its events move onto this clock

    path = tmp_path / "trace.json"
    calls = []

    def collector():  # runs at stop_trace, before the file is closed
        calls.append(trace.merge([{"ph": "i", "s": "t", "name": "late", "ts": trace.now_us(), "tid": 1}], pid=7))

    trace.add_collector(collector)
    try:
        trace.start_trace(path, "driver")
        assert trace.writing()
        with trace.span("train", "train"):
            pass
        assert trace.merge([dict(e) for e in events], shift_us=shift, pid=4242) == len(events)
        trace.stop_trace()
    finally:
        trace.remove_collector(collector)
    assert calls == [1]
    merged = trace.read_trace(path)  # valid JSON, two processes
    assert {e["pid"] for e in merged} >= {4242, 7} and len({e["pid"] for e in merged}) == 3
    procs = {e["pid"]: e["args"]["name"] for e in merged if e["name"] == "process_name"}
    assert procs[4242] == "trainer rank 0" and "driver" in procs.values()
    moved = {e["name"]: e for e in _spans(merged) if e["pid"] == 4242}
    assert moved["train_actor"]["ts"] == pytest.approx(_spans(events, "train_actor")[0]["ts"] + shift, abs=1e-3)
    trace.start_trace(tmp_path / "other.json")
    trace.stop_trace()
    assert calls == [1]  # removed: not run again


def test_span_depths_and_png(tmp_path):
    from reinforge.utils.trace_plot import plot_trace, span_depths

    spans = [{"ts": 0, "dur": 10}, {"ts": 2, "dur": 3}, {"ts": 5, "dur": 5}, {"ts": 3, "dur": 1}, {"ts": 11, "dur": 1}]
    assert span_depths(spans) == [0, 1, 1, 2, 0]
    path = tmp_path / "trace.json"
    trace.start_trace(path)
    with trace.span("outer"):
        with trace.span("inner"):
            trace.instant("preempt")
    trace.stop_trace()
    out = plot_trace(path, tmp_path / "t.png", title="t")
    assert out.read_bytes()[:4] == b"\x89PNG"
    empty = tmp_path / "empty.json"
    trace.start_trace(empty)
    trace.stop_trace()
    with pytest.raises(ValueError, match="no spans"):
        plot_trace(empty, tmp_path / "e.png")


# ---------------------------------------------------------------------------------------- mismatch
def test_quantiles_match_the_hand_computation_and_numpy():
    x = torch.tensor([0.4, 0.0, 0.2, 0.1, 0.3])
    p50, p90, p99, p100 = quantiles(x, [0.5, 0.9, 0.99, 1.0])
    assert p50 == pytest.approx(0.2) and p100 == pytest.approx(0.4)
    assert p90 == pytest.approx(0.3 + 0.6 * 0.1)  # position 0.9 * 4 = 3.6: between 0.3 and 0.4
    assert p99 == pytest.approx(0.3 + 0.96 * 0.1)
    y = torch.randn(1001, generator=torch.Generator().manual_seed(0))
    qs = [0.0, 0.13, 0.5, 0.9, 0.99, 1.0]
    assert quantiles(y, qs) == pytest.approx(np.quantile(y.double().numpy(), qs).tolist(), abs=1e-12)
    assert quantiles(torch.tensor([1.0, math.inf, math.inf]), [0.9]) == [math.inf]  # not inf - inf
    with pytest.raises(ValueError, match="empty"):
        quantiles(torch.zeros(0), [0.5])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        quantiles(x, [50])


def test_mismatch_stats_by_hand():
    # trainer vs engine log-probs of 2 samples; the masked-out token (a tool output) is left out
    train = [torch.tensor([-1.0, -2.1, -0.5]), torch.tensor([-0.7, -3.0])]
    rollout = [torch.tensor([-1.0, -2.0, -9.0]), torch.tensor([-0.4, -3.2])]
    ratio = token_log_ratios(train, rollout, [[1, 1, 0], [1, 1]])
    assert ratio.tolist() == pytest.approx([0.0, -0.1, -0.3, 0.2])
    stats = mismatch_stats(ratio)
    # |diff| sorted: 0, 0.1, 0.2, 0.3 (positions 0..3); p50 at 1.5, p90 at 2.7, p99 at 2.97
    assert stats["logprob_abs_diff_p50"] == pytest.approx(0.15)
    assert stats["logprob_abs_diff_p90"] == pytest.approx(0.27)
    assert stats["logprob_abs_diff_p99"] == pytest.approx(0.297)
    assert stats["logprob_abs_diff_max"] == pytest.approx(0.3)
    # w sorted: e^-0.3, e^-0.1, 1, e^0.2
    w = [math.exp(-0.3), math.exp(-0.1), 1.0, math.exp(0.2)]
    assert stats["importance_weight_min"] == pytest.approx(w[0])
    assert stats["importance_weight_p50"] == pytest.approx((w[1] + w[2]) / 2)
    assert stats["importance_weight_p90"] == pytest.approx(w[2] + 0.7 * (w[3] - w[2]))
    assert stats["importance_weight_p99"] == pytest.approx(w[2] + 0.97 * (w[3] - w[2]))
    assert stats["importance_weight_max"] == pytest.approx(w[3])
    assert mismatch_stats(torch.zeros(0)) == {}
    assert mismatch_stats(torch.tensor([100.0]))["importance_weight_max"] == pytest.approx(math.exp(20))  # clamped
    with pytest.raises(ValueError, match="sample 1"):
        token_log_ratios(train, rollout, [[1, 1, 0], [1]])
    with pytest.raises(ValueError, match="one of each per sample"):
        token_log_ratios(train, rollout[:1], [[1, 1, 0]])


# ---------------------------------------------------------------------------------------- runs
MISMATCH_KEYS = [
    "train/logprob_abs_diff_p50",
    "train/logprob_abs_diff_p90",
    "train/logprob_abs_diff_p99",
    "train/logprob_abs_diff_max",
    "train/importance_weight_min",
    "train/importance_weight_p50",
    "train/importance_weight_p90",
    "train/importance_weight_p99",
    "train/importance_weight_max",
]


def _check_times(events):
    spans = _spans(events)
    assert spans and all(e["ts"] >= 0 and e["dur"] >= 0 for e in spans)


def test_traced_run_records_every_phase(tmp_path, tiny_model_path):
    out = tmp_path / "run"
    cfg = load_config(
        None,
        tiny_overrides(
            tiny_model_path,
            out,
            **{
                "run.trace": "true",
                "reward.type": "custom",
                "reward.function_path": "tests.reward_fns:even_first_token",
                "run.save_interval": 1,
                "run.tensorboard": "false",
            },
        ),
    )
    run_training(cfg)
    assert not trace.active()
    events = trace.read_trace(out / "trace.json")
    _check_times(events)
    names = {e["name"] for e in _spans(events)}
    assert {
        "rollout_step",
        "rollout",
        "generate",
        "reward",
        "score",
        "train",
        "micro_batch",
        "optimizer_step",
        "weight_sync",
        "update_weights",
        "checkpoint",
        "eval",
    } <= names, names
    steps = _spans(events, "rollout_step")
    assert [e["args"]["rollout_id"] for e in steps] == [0, 1]
    for step in steps:  # inside each step: rollout, then training, then the weight sync, in that order
        start, end = step["ts"], step["ts"] + step["dur"] + 1e-3
        inside = {e["name"]: e for e in _spans(events) if start <= e["ts"] and e["ts"] + e["dur"] <= end}
        assert inside["rollout"]["ts"] <= inside["train"]["ts"] <= inside["weight_sync"]["ts"]
        assert inside["rollout"]["ts"] + inside["rollout"]["dur"] <= inside["train"]["ts"] + 1e-3
    metrics = [m for m in read_metrics(out) if "train/loss" in m]
    for m in metrics:
        # the trainer and the fp32 engine agree: every token's weight is ~1, the p50 <= p90 <= p99 <= max
        values = [m[k] for k in MISMATCH_KEYS[:4]]
        assert values == sorted(values) and values[-1] < 1e-4
        assert m["train/importance_weight_min"] <= m["train/importance_weight_p50"] <= m["train/importance_weight_max"]
        assert abs(m["train/importance_weight_max"] - 1) < 1e-3 and abs(m["train/importance_weight_min"] - 1) < 1e-3
        # time/train is the train span's duration
    train_spans = _spans(events, "train")
    assert [round(e["dur"] / 1e6, 3) for e in train_spans] == [round(m["time/train"], 3) for m in metrics]


def test_async_run_shows_the_producer_beside_training_and_off_writes_nothing(tmp_path, tiny_model_path):
    out = tmp_path / "async"
    cfg = load_config(
        None,
        tiny_overrides(
            tiny_model_path,
            out,
            **{
                "run.trace": "true",
                "rollout.max_staleness": 1,
                "train.num_rollout": 3,
                "train.num_steps_per_rollout": 2,
                "eval.eval_before_train": "false",
                "run.save_final": "false",
                "run.tensorboard": "false",
                "data.n_eval_prompts": 0,
            },
        ),
    )
    run_training(cfg)
    events = trace.read_trace(out / "trace.json")
    _check_times(events)
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    rollouts = _spans(events, "rollout")
    assert {tracks[e["tid"]] for e in rollouts} == {"rollout-producer"}
    assert {tracks[e["tid"]] for e in _spans(events, "train")} == {"loop"}
    assert {"wait_rollout", "weight_sync", "wait_staleness", "engine_generate", "old_log_probs"} <= {
        e["name"] for e in _spans(events)
    }
    # generation of rollout j + 1 overlaps the training on rollout j
    trains = {e["args"]["rollout_id"]: e for e in _spans(events, "train")}
    produced = {e["args"]["rollout_id"]: e for e in rollouts}
    assert any(produced[j + 1]["ts"] < trains[j]["ts"] + trains[j]["dur"] for j in range(2))
    # num_steps_per_rollout=2: the old log-probs were computed first; the mismatch covers every sample
    rows = [m for m in read_metrics(out) if "train/loss" in m]
    assert all(set(MISMATCH_KEYS) <= set(m) for m in rows)

    off = tmp_path / "off"  # run.trace defaults to false: no file
    run_training(
        load_config(
            None,
            tiny_overrides(
                tiny_model_path,
                off,
                **{
                    "train.num_rollout": 1,
                    "eval.eval_before_train": "false",
                    "data.n_eval_prompts": 0,
                    "run.save_final": "false",
                    "run.tensorboard": "false",
                },
            ),
        )
    )
    assert (off / "metrics.jsonl").exists() and not (off / "trace.json").exists()


def test_spans_are_profiler_ranges_and_gpu_gaps_reads_them(tmp_path):
    """Under a torch profiler a span is a record_function range; bench/gpu_gaps.py finds it in the
    exported trace and measures the GPU's idle time and gaps inside it (a synthetic kernel track here:
    the CPU trace has no kernels)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import gpu_gaps
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with trace.span("generate", "rollout"):
            torch.ones(64).sum()
    path = tmp_path / "t.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    (note,) = [e for e in events if e.get("cat") == "user_annotation" and e["name"] == "generate"]
    assert note["dur"] > 0
    assert any(e.get("cat") == "cpu_op" and note["ts"] <= e["ts"] < note["ts"] + note["dur"] for e in events)
    with trace.span("generate"):  # no profiler: no range opened
        pass

    # a phase of 1000 us with kernels over [100, 300) and [250, 400), [900, 950): busy 350, gap 500 at 400
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "generate", "ts": 1000, "dur": 1000, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1450, "dur": 100, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "ts": 1460, "dur": 20, "pid": 1, "tid": 1},  # nested
        {"ph": "X", "cat": "kernel", "name": "k1", "ts": 1100, "dur": 200, "pid": 0, "tid": 7},
        {"ph": "X", "cat": "kernel", "name": "k2", "ts": 1250, "dur": 150, "pid": 0, "tid": 7},
        {"ph": "X", "cat": "gpu_memcpy", "name": "c", "ts": 1900, "dur": 50, "pid": 0, "tid": 8},
    ]
    r = gpu_gaps.analyse(ev, ["generate"], gaps=5)
    assert r["phases"] == [("generate", 1000, 350)]
    assert r["gaps"] == [(400, 500, "generate", [("aten::mm", 100)])]
    assert r["host_ops"] == {"generate": [("aten::mm", 100, 1)]}
    assert "| generate | 1.0 | 0.3 | 0.7 | 35% |" in gpu_gaps.report(r)
