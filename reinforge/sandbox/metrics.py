"""What the sandboxes of one episode did, for the fleet metrics (docs/agents.md#metrics).

:func:`reinforge.sandbox.run_python` reports every run here (:func:`record`): its start
latency (launch to the program's first line, None when the program never started) and whether it
was an infrastructure failure. The agent loop opens a :class:`SandboxRuns` per episode
(:func:`recording`); runs are attributed through a context variable, so they reach the episode
whose coroutine started them, from a tool, an environment's ``run_tests`` or any code the episode
awaits (also a plain environment method: the agent runs it in a copy of the episode's context).
A run outside any episode (the trial run of ``check_sandbox``, a benchmark) is not recorded.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = ["SandboxRuns", "record", "recording"]


@dataclass
class SandboxRuns:
    """The sandbox runs of one episode: how many (``runs``), the infrastructure ``failures`` among
    them, and ``start_ms`` of each run whose program started."""

    runs: int = 0
    failures: int = 0
    start_ms: list[float] = field(default_factory=list)


_current: contextvars.ContextVar[SandboxRuns | None] = contextvars.ContextVar("reinforge_sandbox_runs", default=None)


@contextmanager
def recording() -> Iterator[SandboxRuns]:
    """Record the sandbox runs started in this context (and the tasks it starts) into a fresh
    :class:`SandboxRuns` until the block ends."""
    runs = SandboxRuns()
    token = _current.set(runs)
    try:
        yield runs
    finally:
        _current.reset(token)


def record(start_ms: float | None, failed: bool) -> None:
    """One sandbox run of the current episode (nothing when none is recording)."""
    runs = _current.get()
    if runs is None:
        return
    runs.runs += 1
    runs.failures += int(failed)
    if start_ms is not None:
        runs.start_ms.append(float(start_ms))
