"""The run driver (reinforge/run/driver.py) with a job of plain numbers, no model: the eval / save
cadence, the final evaluation and checkpoint, a SIGTERM checkpoint then ``Preempted``, several ranks
agreeing on a recover checkpoint. Milliseconds each; the real jobs are tested in
tests/integration/test_offline_recover.py and tests/integration/test_faults.py."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from reinforge.config import load_config
from reinforge.recover import Preempted
from reinforge.run import Driver, RunSpec
from reinforge.utils.logging import read_metrics


class NumbersJob:
    """Step i's loss is i; a checkpoint holds a file naming its step."""

    def __init__(self, start: int = 0, signal_at: int | None = None):
        self.start, self.signal_at = start, signal_at
        self.evals: list[tuple[str, dict[str, float]]] = []
        self.calls: list[str] = []

    def step(self, i: int) -> dict[str, float]:
        self.calls.append(f"step {i}")
        if i == self.signal_at:
            os.kill(os.getpid(), signal.SIGTERM)  # a preemption while the step runs
        return {"train/loss": float(i)}

    def evaluate(self, label: str, i: int) -> dict[str, float] | None:
        self.calls.append(f"eval {label}")
        return {"eval/loss": float(i)}

    def save(self, directory: Path | None, i: int) -> None:
        self.calls.append(f"save {i}")
        (directory / "weights.txt").write_text(str(i))

    def state(self) -> dict[str, Any]:
        return {"extra": "kept"}

    def begin(self) -> None:
        self.calls.append("begin")

    def finish(self) -> str | None:
        self.calls.append("finish")
        return None

    def cleanup(self) -> None:
        self.calls.append("cleanup")


def _driver(tmp_path, job, total=5, agree=None, **keys) -> Driver:
    overrides = {"run.output_dir": tmp_path / "run", "run.progress": "false", "run.tensorboard": "false"}
    overrides.update({"run.keep_last_n_checkpoints": "null", **keys})
    cfg = load_config(None, [f"{k}={v}" for k, v in overrides.items()])
    spec = RunSpec(
        command="offline",
        unit="step",
        position_key="step",
        total=total,
        trace_title="test",
        progress_desc="test",
        progress_unit="step",
        postfix=lambda m: {},
        summary={"more_key": "offline.num_epochs", "curve_key": "train/loss", "eval_keys": (), "x_label": "step"},
        **({"agree": agree} if agree else {}),
    )
    return Driver(job, cfg, spec)


def _checkpoints(tmp_path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step_*"))


def test_eval_and_save_cadence_then_the_final_ones(tmp_path):
    job = NumbersJob()
    last = _driver(tmp_path, job, **{"eval.eval_interval": 2, "run.save_interval": 2}).run()
    assert last == 4
    assert [label for label, _ in job.evals] == ["before", "step_2", "step_4", "after"]
    assert _checkpoints(tmp_path) == ["step_000001", "step_000003", "step_000004"]  # every 2 steps, and the last
    state = json.loads((tmp_path / "run" / "checkpoints" / "step_000004" / "state.json").read_text())
    assert state["step"] == 4 and state["extra"] == "kept"
    assert [e[0] for e in state["evals"]] == ["before", "step_2", "step_4", "after"]
    assert job.calls[0] == "begin" and job.calls[-1] == "cleanup" and "finish" in job.calls
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2, 3, 4, 5]


def test_sigterm_writes_a_checkpoint_of_the_step_in_flight_and_stops(tmp_path):
    job = NumbersJob(signal_at=2)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Preempted) as stop:
        _driver(tmp_path, job, total=10).run()
    assert stop.value.code == 143 and stop.value.path.name == "step_000002"
    assert _checkpoints(tmp_path) == ["step_000002"]  # (before, offline: killed, nothing saved)
    assert job.calls[-2:] == ["save 2", "cleanup"]
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is the caller's again


def test_a_recover_checkpoint_another_rank_asks_for_is_written_here_too(tmp_path):
    other = iter([True, False] * 2)  # the other rank's answers, in turn: a recover checkpoint due? stopping?
    _driver(
        tmp_path, NumbersJob(), total=3, agree=lambda mine: mine or next(other), **{"run.save_final": "false"}
    ).run()
    assert _checkpoints(tmp_path) == ["step_000000", "step_000001"]  # every step but the last


def test_a_resumed_job_starts_at_its_start_and_logs_from_there(tmp_path):
    _driver(tmp_path, NumbersJob(), total=4).run()
    job = NumbersJob(start=2)
    _driver(tmp_path, job, total=4).run()
    assert [c for c in job.calls if c.startswith("step")] == ["step 2", "step 3"]
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2, 3, 4]  # redone rows replaced, each once
