"""Restarts after a crash (``reinforge train --max-restarts N`` / ``run.max_restarts``).

:func:`supervise` runs the training as a child process (``python -m reinforge train ...``
with ``run.recover=auto``) and relaunches it when it dies: killed by a signal (OOM killer,
SIGKILL), a crashed trainer rank or engine that ended the run, any non-zero exit other than a
usage error. Each relaunch resumes from the newest complete checkpoint of the same
``run.output_dir``, so at most the rollouts since that checkpoint are redone. Every exit is
recorded in ``<output_dir>/restarts.jsonl`` (exit status, signal, seconds the attempt ran).

SIGTERM / SIGINT sent to the supervisor are forwarded to the child (which writes a recover
checkpoint and stops) and end supervision: a preempted job is not relaunched here.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path

log = logging.getLogger(__name__)

USAGE_ERROR = 2  # `reinforge` exits 2 on a config / usage error: relaunching would fail again


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def supervise(train_args: list[str], output_dir: Path, max_restarts: int) -> int:
    """Run ``reinforge train <train_args> run.recover=auto run.max_restarts=0 run.overwrite=false`` and relaunch it
    after each crash, at most ``max_restarts`` times.

    Args:
        train_args: the ``train`` command's arguments (config file option and overrides).
        output_dir: the run directory (``restarts.jsonl`` goes there).
        max_restarts: relaunches allowed (0: run once).
    Returns:
        the exit status to end with: 0 when an attempt finished, else the last attempt's
        (128 + signal number when it was killed by a signal).
    """
    cmd = [sys.executable, "-m", "reinforge", "train", *train_args, "run.recover=auto", "run.max_restarts=0",
           "run.overwrite=false"]  # an overwrite was done before supervising; relaunches resume
    output_dir.mkdir(parents=True, exist_ok=True)
    record = output_dir / "restarts.jsonl"
    stop: list[int] = []
    child: list[subprocess.Popen] = []

    def forward(signum: int, frame: object) -> None:
        stop.append(signum)
        if child and child[0].poll() is None:
            child[0].send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        attempt = 0
        while True:
            t = time.monotonic()
            child[:] = [subprocess.Popen(cmd)]
            code = child[0].wait()
            seconds = time.monotonic() - t
            with record.open("a") as f:
                f.write(json.dumps({"attempt": attempt, "exit_code": code, "cause": _describe(code),
                                    "seconds": round(seconds, 3), "time": time.time()}) + "\n")
            if code == 0:
                if attempt:
                    log.info("training finished after %d restart(s)", attempt)
                return 0
            status = 128 - code if code < 0 else code
            if stop:
                log.warning("training stopped (%s) after %s: not relaunching", _describe(code),
                            signal.Signals(stop[0]).name)
                return status
            if code == USAGE_ERROR:
                log.error("training failed with a usage error (exit status 2): not relaunching")
                return status
            if attempt >= max_restarts:
                log.error("training %s; no restarts left (--max-restarts %d)", _describe(code), max_restarts)
                return status
            attempt += 1
            log.warning("training %s after %.1f s: relaunching (restart %d of %d) from the newest checkpoint in %s",
                        _describe(code), seconds, attempt, max_restarts, output_dir)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
