"""Restarts after a crash (``reinforge train --max-restarts N``, ``reinforge offline --max-restarts N``
/ ``run.max_restarts``).

:func:`supervise` runs the training as a child process (``python -m reinforge train ...``, or ``offline``
with ``run.recover=auto``) and relaunches it when it dies: killed by a signal (OOM killer,
SIGKILL), a crashed trainer rank or engine that ended the run, any non-zero exit other than a
usage error. Each relaunch resumes from the newest complete checkpoint of the same
``run.output_dir``, so at most the rollouts since that checkpoint are redone. Every exit is
recorded in ``<output_dir>/restarts.jsonl`` (exit status, signal, seconds the attempt ran, the
error). Not relaunched: a usage error (exit status 2), a full disk (:data:`DISK_FULL`), a stall with
``run.stall_action=fail`` (:data:`STALLED`; ``restart`` exits 75 and is relaunched), and a
failure whose error (type and first line of the message, which the child writes through
:func:`record_failure`; compared without temporary names' random parts, pids and addresses,
:func:`normalise_error`) repeats that of the attempt before: the same cause twice will not go away
by relaunching (a reward module's syntax error, every reward failing). Deaths by a signal carry no
message and are relaunched up to the limit.

SIGTERM / SIGINT sent to the supervisor are forwarded to the child (which writes a recover
checkpoint and stops) and end supervision: a preempted job is not relaunched here. The child
runs in its own process group (Ctrl-C in a terminal reaches it once, through the supervisor).

If the supervisor itself dies (SIGKILL, OOM killer) the child gets SIGTERM, writes a recover
checkpoint and stops instead of training on unsupervised: on Linux through
``prctl(PR_SET_PDEATHSIG)``, elsewhere (and as a second line) through :func:`watch_parent`, a
thread in the child that polls its parent pid. The child also holds the lock of
``run.output_dir`` (:func:`~reinforge.utils.fs.lock_directory`), so a rerun cannot start a
second trainer in the same directory while it stops.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from .utils.failures import FAILURE_ENV, record_failure  # noqa: F401 (re-exported: the CLI records through here)
from .utils.fs import SUPERVISOR_PID_ENV

log = logging.getLogger(__name__)

USAGE_ERROR = 2  # `reinforge` exits 2 on a config / usage error: relaunching would fail again
DISK_FULL = 74  # `reinforge` exits 74 (sysexits' EX_IOERR) when the disk is full: relaunching would fail again
STALLED = 124  # `reinforge` exits 124 after a stall with run.stall_action=fail (restart: 75, relaunched)
PARENT_ENV = SUPERVISOR_PID_ENV  # set in the child: the supervisor's pid, for watch_parent and the lock's message


# What differs between two attempts that failed for one cause: the random part of temporary names
# (tempfile's 8 characters after `tmp` or after the prefix's `.`: `.rollout_000001.1r9nj8bd`), pids,
# memory addresses.
_RANDOM_PARTS = (
    (re.compile(r"(?<=tmp)[a-z0-9_]{8}\b|(?<=\.)[a-z0-9_]{8}(?=[/'\"\s:),]|$)"), "*"),
    (re.compile(r"\bpid \d+"), "pid N"),
    (re.compile(r"\b0x[0-9a-fA-F]{6,}\b"), "0x*"),
)


def normalise_error(error: str | None) -> str | None:
    """``error`` (``Type: first line``, from :func:`record_failure`) without what differs between
    attempts that failed for one cause: temporary folders' random names, pids, addresses. The
    supervisor compares attempts by this (before, a checkpoint folder that had turned read-only
    named another temporary folder at each attempt, and the run was relaunched until no restarts
    were left)."""
    if error is None:
        return None
    for pattern, replacement in _RANDOM_PARTS:
        error = pattern.sub(replacement, error)
    return error


_PR_SET_PDEATHSIG = 1


def _child_setup(parent: int) -> None:
    """Runs in the child between fork and exec: its own process group, and SIGTERM when the
    supervisor dies (Linux ``prctl``; a no-op where libc has none)."""
    os.setpgid(0, 0)
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the supervisor died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def watch_parent(interval_s: float = 1.0) -> threading.Thread | None:
    """In a supervised child (``REINFORGE_SUPERVISOR_PID`` set): a daemon thread that sends this
    process SIGTERM once when its parent is gone (the parent pid changed), so the run writes a
    recover checkpoint and stops. Returns the thread, or None when not supervised."""
    value = os.environ.get(PARENT_ENV)
    if not value or not value.isdigit():
        return None
    parent = int(value)

    def poll() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        log.warning("the supervisor (pid %d) is gone: stopping after a recover checkpoint", parent)
        os.kill(os.getpid(), signal.SIGTERM)

    t = threading.Thread(target=poll, name="watch-supervisor", daemon=True)
    t.start()
    return t


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def supervise_command(subcommand: str, config: str | None, overrides: list[str], run: Any) -> int:
    """:func:`supervise` for ``reinforge <subcommand> [--config config] <overrides>`` of run section ``run``
    (``output_dir``, ``max_restarts``).

    Raises:
        ConfigError: under torchrun (``WORLD_SIZE`` > 1): the supervisor runs one process; torchrun
            relaunches its ranks itself (its ``--max-restarts``, with ``run.recover=auto``).
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        from .config import ConfigError

        raise ConfigError(
            f"run.max_restarts={run.max_restarts} (--max-restarts) supervises one process; under torchrun "
            f"(WORLD_SIZE={world}) use torchrun's own --max-restarts with run.recover=auto"
        )
    args = ([f"--config={config}"] if config else []) + overrides
    return supervise(args, Path(run.output_dir), run.max_restarts, subcommand=subcommand)


def supervise(
    train_args: list[str],
    output_dir: Path,
    max_restarts: int,
    command: list[str] | None = None,
    subcommand: str = "train",
) -> int:
    """Run ``reinforge <subcommand> <train_args> run.recover=auto run.max_restarts=0 run.overwrite=false`` and
    relaunch it after each crash, at most ``max_restarts`` times.

    Args:
        train_args: the command's arguments (config file option and overrides).
        output_dir: the run directory (``restarts.jsonl`` goes there).
        max_restarts: relaunches allowed (0: run once).
        command: the child's command line instead of ``reinforge <subcommand>`` (tests).
        subcommand: ``train`` (RL) or ``offline``.
    Returns:
        the exit status to end with: 0 when an attempt finished, else the last attempt's
        (128 + signal number when it was killed by a signal).
    """
    cmd = command or [
        sys.executable,
        "-m",
        "reinforge",
        subcommand,
        *train_args,
        "run.recover=auto",
        "run.max_restarts=0",
        "run.overwrite=false",
    ]  # an overwrite was done before; relaunches resume
    output_dir.mkdir(parents=True, exist_ok=True)
    record = output_dir / "restarts.jsonl"
    stop: list[int] = []
    child: list[subprocess.Popen] = []

    def forward(signum: int, frame: object) -> None:
        stop.append(signum)
        if child and child[0].poll() is None:
            child[0].send_signal(signum)

    fd, failure_file = tempfile.mkstemp(prefix="reinforge-failure-")
    os.close(fd)
    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        attempt = 0
        last_error = None
        while True:
            t = time.monotonic()
            me = os.getpid()
            Path(failure_file).write_text("")
            child[:] = [
                subprocess.Popen(
                    cmd,
                    env={**os.environ, PARENT_ENV: str(me), FAILURE_ENV: failure_file},
                    preexec_fn=lambda me=me: _child_setup(me),
                )
            ]
            code = child[0].wait()
            seconds = time.monotonic() - t
            error = Path(failure_file).read_text().strip() or None if code else None
            with record.open("a") as f:
                f.write(
                    json.dumps(
                        {
                            "attempt": attempt,
                            "exit_code": code,
                            "cause": _describe(code),
                            "error": error,
                            "seconds": round(seconds, 3),
                            "time": time.time(),
                        }
                    )
                    + "\n"
                )
            if code == 0:
                if attempt:
                    log.info("training finished after %d restart(s)", attempt)
                return 0
            status = 128 - code if code < 0 else code
            if stop:
                log.warning(
                    "training stopped (%s) after %s: not relaunching", _describe(code), signal.Signals(stop[0]).name
                )
                return status
            if code == USAGE_ERROR:
                log.error("training failed with a usage error (exit status 2): not relaunching")
                return status
            if code == DISK_FULL:
                log.error(
                    "training stopped on a full disk (exit status %d): not relaunching; free space, then resume "
                    "with the same command",
                    DISK_FULL,
                )
                return status
            if code == STALLED:
                log.error("training stalled (run.stall_action=fail, exit status %d): not relaunching", STALLED)
                return status
            if error is not None and normalise_error(error) == normalise_error(last_error):
                log.error(
                    "training failed twice with the same error (%s): not relaunching, a restart would fail again", error
                )
                return status
            if attempt >= max_restarts:
                log.error("training %s; no restarts left (--max-restarts %d)", _describe(code), max_restarts)
                return status
            last_error = error
            attempt += 1
            log.warning(
                "training %s after %.1f s: relaunching (restart %d of %d) from the newest checkpoint in %s",
                _describe(code),
                seconds,
                attempt,
                max_restarts,
                output_dir,
            )
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        Path(failure_file).unlink(missing_ok=True)
