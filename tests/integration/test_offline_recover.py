"""Offline runs under the run driver (reinforge/run/): a SIGTERM checkpoint and its resume, a crash
relaunched by ``reinforge offline --max-restarts``, ``run.recover=auto`` falling back past a damaged
checkpoint. Small and quick: the tiny random model, 18 SFT examples (3 steps an epoch)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reinforge.config import load_config
from reinforge.utils import faults
from reinforge.utils.logging import read_metrics
from tests.integration.test_offline import offline_overrides, write_data

REPO = Path(__file__).resolve().parents[2]


def _args(model, out, data, **extra) -> list[str]:
    base = {"offline.eval_fraction": 0, "run.save_final": "true", "run.keep_last_n_checkpoints": "null"}
    return offline_overrides(model, out, data, "sft", **{**base, **extra})


def _cli_offline(tmp_path: Path, args: list[str], fault: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop(faults.ENV, None)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    if fault:
        env[faults.ENV] = fault
        env[faults.STATE_ENV] = str(tmp_path / "fault-state")  # fire once, not again after the restart
    return subprocess.Popen(
        [sys.executable, "-m", "reinforge", "offline", *args],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _steps(out: Path) -> list[int]:
    return [int(r["step"]) for r in read_metrics(out / "metrics.jsonl") if "train/loss" in r]


def test_sigterm_writes_a_checkpoint_and_a_rerun_resumes_each_step_once(tmp_path, tiny_model_path):
    files, out = write_data(tmp_path, n=18), tmp_path / "run"
    args = _args(tiny_model_path, out, files["sft"], **{"offline.num_epochs": 30, "run.recover": "auto"})
    proc = _cli_offline(tmp_path, args)
    deadline = time.monotonic() + 300
    while not ((out / "metrics.jsonl").exists() and _steps(out)):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no step finished: {proc.communicate()[0][-3000:]}")
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    log, _ = proc.communicate(timeout=300)
    assert proc.returncode == 143, log[-3000:]  # (before: killed at once, no checkpoint)
    assert "stopped after SIGTERM: checkpoint" in log, log[-3000:]
    done = _steps(out)
    assert len(done) < 90, "the run finished before the signal: nothing tested"
    latest = out / "checkpoints" / (out / "checkpoints" / "latest").read_text().strip()
    saved = json.loads((latest / "state.json").read_text())["step"]
    assert saved == done[-1] - 1  # the checkpoint holds the last step finished: nothing lost
    epochs = saved // 3 + 2  # the rerun trains 1 to 3 more steps (offline.num_epochs may change on resume)
    proc = _cli_offline(tmp_path, args + [f"offline.num_epochs={epochs}"])  # run.recover=auto resumes
    log, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, log[-3000:]
    assert f"resuming from {latest}" in log, log[-3000:]
    assert _steps(out) == list(range(1, 3 * epochs + 1))  # each step once


def test_a_crash_is_relaunched_by_max_restarts_and_the_run_finishes(tmp_path, tiny_model_path):
    files, out = write_data(tmp_path, n=18), tmp_path / "run"
    args = ["--max-restarts", "1", *_args(tiny_model_path, out, files["sft"], **{"run.save_interval": 1})]
    proc = _cli_offline(tmp_path, args, fault="optimizer_step:2")  # SIGKILL inside step 1's optimizer step
    log, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, log[-3000:]
    assert (tmp_path / "fault-state" / "optimizer_step.fired").exists()
    attempts = [json.loads(x) for x in (out / "restarts.jsonl").read_text().splitlines()]
    assert [a["cause"] for a in attempts] == ["killed by SIGKILL", "exit status 0"]
    assert _steps(out) == [1, 2, 3]  # step 1 redone from step 0's checkpoint, its row logged once
    assert "resuming from" in log and "step_000000" in log, log[-3000:]


def test_recover_auto_falls_back_past_a_damaged_checkpoint(tmp_path, tiny_model_path, caplog):
    from reinforge.offline_loop import OfflineLoop

    files, out = write_data(tmp_path, n=18), tmp_path / "run"
    args = _args(tiny_model_path, out, files["sft"], **{"run.save_interval": 1})
    from reinforge.offline_loop import run_offline

    run_offline(load_config(None, args))  # checkpoints step_000000 .. step_000002
    shard = next((out / "checkpoints" / "step_000002" / "dcp" / "model").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:16])  # damaged: its manifest no longer matches
    with caplog.at_level(logging.WARNING):
        loop = OfflineLoop(load_config(None, args + ["run.recover=auto", "offline.num_epochs=2"]))
    try:
        assert loop.start == 2  # resumed after step_000001, the newest intact one
    finally:
        loop.close()
    assert "step_000002" in caplog.text
