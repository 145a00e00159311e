"""Rollbacks: ``--load`` of one of the run's own older checkpoints makes the run continue from it.

Before, a crash after such a rollback resumed the newest checkpoint of the line the user had
rolled away from (``run.recover=auto``, ``--max-restarts`` and ``--load RUN_DIR`` pick the newest).
:func:`follow_load` runs once per ``reinforge train`` / ``offline`` command, before anything is
built; :func:`retire_newer` makes the loaded checkpoint ``latest`` and moves the newer ones into
``checkpoints/abandoned/<UTC time>-after-<name>/`` (kept, not deleted). The moves are recorded first
in ``checkpoints/retiring.json``; :func:`finish_retiring`, which every resume calls, completes them
if a crash cut them short.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from . import checkpoint as ckpt
from .checkpoint_line import ABANDONED, RETIRING, finish_retiring
from .utils.fs import SUPERVISOR_PID_ENV, atomic_write_text

__all__ = ["ABANDONED", "RETIRING", "finish_retiring", "follow_load", "retire_newer"]

if TYPE_CHECKING:
    from .config import RunConfig

log = logging.getLogger(__name__)


def _index(p: Path, prefix: str) -> int:
    return int(p.name[len(prefix) + 1 :])


def retire_newer(root: Path, kept: Path, prefix: str = "rollout") -> list[Path]:
    """Make checkpoint ``kept`` (a checkpoint of ``root``) the newest of ``root``: ``latest`` names
    it and every checkpoint of ``prefix`` with a higher index (intact or not) is moved into
    ``root/abandoned/<UTC time>-after-<kept name>/`` (kept, not deleted: the user may want them
    back). The plan is written to ``root/retiring.json`` before anything moves, so an interruption
    is completed by the next :func:`finish_retiring`; nothing else changes.

    Returns:
        the checkpoints' new paths (empty: none was newer).
    """
    root, kept = Path(root), Path(kept)
    newer = [p for p in ckpt.list_checkpoints(root, prefix) if _index(p, prefix) > _index(kept, prefix)]
    if not newer:
        if (root / ckpt.LATEST).is_file() and (root / ckpt.LATEST).read_text().strip() != kept.name:
            atomic_write_text(root / ckpt.LATEST, kept.name + "\n")
        return []
    into = f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-after-{kept.name}"
    plan = {"kept": kept.name, "into": into, "checkpoints": [p.name for p in newer]}
    atomic_write_text(root / RETIRING, json.dumps(plan, indent=1))
    return finish_retiring(root)


def _inside(path: Path, folder: Path) -> bool:
    path, folder = path.expanduser().resolve(), folder.expanduser().resolve()
    return path == folder or folder in path.parents


def follow_load(run: RunConfig, prefix: str = "rollout") -> list[Path]:
    """Make the run continue from ``run.load`` where it names a checkpoint of ``run.output_dir``
    (the checkpoint, its ``checkpoints`` folder or the run directory: its newest intact one): every
    newer checkpoint of the run is moved into ``checkpoints/abandoned/<time>-after-<name>/`` and
    ``checkpoints/latest`` names the loaded one (:func:`retire_newer`), with a
    warning naming them. Without this, a crash after the rollback resumed the newest checkpoint of
    the line the user had rolled away from (``run.recover=auto``, ``--max-restarts``, ``--load RUN_DIR``).

    ``run.load`` outside ``run.output_dir`` while the run has checkpoints of its own, with
    ``run.recover=auto`` (or ``--max-restarts``): those are resumed, as a restarted run must; a
    warning says that ``run.load`` is not used and how to start from it instead.

    Call it once per command, before the run is built (not in a supervised relaunch: the
    relaunch resumes the line chosen here).

    Returns:
        the abandoned checkpoints' new paths.
    Raises:
        FileNotFoundError: nothing resumable at ``run.load``.
        CheckpointError: the checkpoint named is damaged, or every one of the run directory is.
    """
    if not run.load:
        return []
    out = Path(run.output_dir)
    root = out / "checkpoints"
    if not ckpt.list_checkpoints(root, prefix):
        return []
    if not _inside(Path(run.load), out):
        if run.recover == "auto" or run.max_restarts > 0:
            log.warning(
                "run.load=%s is not used: %s already holds checkpoints of this run, which run.recover=auto "
                "(and --max-restarts) resumes (run.load is only the starting point of a run that has none). To "
                "start from run.load instead, choose a new run.output_dir; to roll this run back, load one of "
                "its own checkpoints",
                run.load,
                root,
            )
        return []
    chosen = ckpt.load_candidates(run.load, prefix, warn=log.warning)[0]
    if chosen.parent.resolve() != root.resolve():
        return []
    moved = retire_newer(root, chosen, prefix)
    if moved:
        log.warning(
            "run.load=%s: rolling back to %s; its %d newer checkpoint(s) (%s) were moved to %s, so a crash, "
            "run.recover=auto and --max-restarts continue from %s, not from the line rolled away from (delete "
            "that folder once you do not need them)",
            run.load,
            chosen.name,
            len(moved),
            ", ".join(p.name for p in moved),
            moved[0].parent,
            chosen.name,
        )
    return moved


def follow_load_once(run: RunConfig, prefix: str = "rollout") -> list[Path]:
    """:func:`follow_load` once per command: not in a relaunch by the supervisor (``--max-restarts``,
    ``REINFORGE_SUPERVISOR_PID`` set), which resumes the line chosen when the command started."""
    return [] if os.environ.get(SUPERVISOR_PID_ENV) else follow_load(run, prefix)
