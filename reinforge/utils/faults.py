"""Fault injection for tests: named points in production code that do nothing unless asked.

The environment variable ``REINFORGE_FAULT`` arms points, comma-separated, each
``point:n[:action]``: the ``n``-th time this process reaches ``point`` (counting from 1) the
``action`` happens:

* ``kill`` (default): the process sends itself SIGKILL (no cleanup, no ``finally``: a crash);
* ``raise``: :class:`InjectedFault` is raised;
* ``nan``: :func:`hit` returns True and the caller poisons its value (e.g. the loss);
* ``hang``: the thread sleeps forever (a hung kernel, a lost peer: what the stall doctor,
  ``run.stall_timeout_s``, is for).
* ``corrupt``: :func:`hit` returns True and the caller damages what passes (the default of
  ``corrupt_bucket`` and ``drop_lora_merge``).

With ``REINFORGE_FAULT_STATE=<dir>`` each armed fault fires once across processes (a marker
file records that it fired), so a restarted run does not crash again at the same point.

Points (grep ``faults.hit(``): ``ckpt_write`` (a checkpoint's files are half written),
``optimizer_step`` (inside ``ModelTrainer.optimizer_step``, before the update), ``nan_loss``
(the policy loss of one step), ``weight_sync`` (between weight buckets), ``rollout`` (after
generation, before reward), ``engine_generate`` (inside a Ray engine actor's ``generate``),
``engine_step`` (the embedded engine's ``step``, before its decode steps), ``corrupt_bucket`` (a
weight-sync bucket's last tensor has its first element negated after the sender's checksum: a
damaging transport; counted per bucket), ``drop_lora_merge`` (one pass of
``merged_named_weights`` yields the LoRA base weights without ``B A * scaling``; counted per pass).

Without ``REINFORGE_FAULT`` every :func:`hit` is a dictionary lookup returning False.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

ENV = "REINFORGE_FAULT"
STATE_ENV = "REINFORGE_FAULT_STATE"
POINTS = (
    "ckpt_write",
    "optimizer_step",
    "nan_loss",
    "weight_sync",
    "rollout",
    "engine_generate",
    "engine_step",
    "corrupt_bucket",
    "drop_lora_merge",
)
ACTIONS = ("kill", "raise", "nan", "hang", "corrupt")
DEFAULT_ACTION = {"corrupt_bucket": "corrupt", "drop_lora_merge": "corrupt"}  # others: kill

_counts: dict[str, int] = {}
_lock = threading.Lock()


class InjectedFault(RuntimeError):
    """Raised at a point armed with the ``raise`` action."""


def parse(spec: str) -> dict[str, tuple[int, str]]:
    """``"ckpt_write:2,nan_loss:1:nan"`` -> ``{"ckpt_write": (2, "kill"), "nan_loss": (1, "nan")}``.

    Raises:
        ValueError: unknown point or action, or ``n`` not a positive integer.
    """
    out: dict[str, tuple[int, str]] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        parts = item.split(":")
        point, n = parts[0], parts[1] if len(parts) > 1 else "1"
        action = parts[2] if len(parts) > 2 else DEFAULT_ACTION.get(point, "kill")
        if point not in POINTS:
            raise ValueError(f"{ENV}: unknown fault point {point!r}; points: {', '.join(POINTS)}")
        if action not in ACTIONS:
            raise ValueError(f"{ENV}: unknown action {action!r} in {item!r}; actions: {', '.join(ACTIONS)}")
        if not n.isdigit() or int(n) < 1:
            raise ValueError(f"{ENV}: {item!r}: the count must be a positive integer")
        out[point] = (int(n), action)
    return out


def hit(point: str) -> bool:
    """Reached ``point``: act when ``REINFORGE_FAULT`` arms it for this time; returns True when
    the action is ``nan`` or ``corrupt`` (the caller injects it), False otherwise (the normal case).

    Raises:
        InjectedFault: the point is armed with ``raise`` and this is its ``n``-th hit.
    """
    spec = os.environ.get(ENV)
    if not spec:
        return False
    armed = parse(spec).get(point)
    if armed is None:
        return False
    with _lock:
        _counts[point] = _counts.get(point, 0) + 1
        if _counts[point] != armed[0]:
            return False
    state = os.environ.get(STATE_ENV)
    if state:
        marker = Path(state) / f"{point}.fired"
        marker.parent.mkdir(parents=True, exist_ok=True)
        try:  # created atomically: of several processes reaching the point, one fires
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.write(fd, f"{os.getpid()}\n".encode())
        os.close(fd)
    action = armed[1]
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "raise":
        raise InjectedFault(f"injected fault at {point} (hit {armed[0]})")
    while action == "hang":
        time.sleep(3600)
    return True


def reset() -> None:
    """Forget the hit counts (tests that arm faults in-process)."""
    with _lock:
        _counts.clear()
