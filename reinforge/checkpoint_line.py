"""The run's line of checkpoints: ``checkpoints/latest`` and the pending moves of a rollback.

``latest`` names the newest checkpoint of ``<output_dir>/checkpoints`` (replaced atomically after
each save). A rollback (:mod:`reinforge.rollback`) records its moves in ``retiring.json`` before
making them; :func:`finish_retiring`, called by every resume, completes them after a crash. This
module imports nothing of reinforge's but :mod:`reinforge.utils.fs`, so the checkpoint code and
the recovery code can both call it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .utils.fs import atomic_write_text

LATEST = "latest"
ABANDONED = "abandoned"  # checkpoints/abandoned/<time>-after-<name>/: the line a rollback left
RETIRING = "retiring.json"  # a rollback's moves, written before them (finish_retiring completes them)


def finish_retiring(root: Path) -> list[Path]:
    """Complete the rollback recorded in ``root/retiring.json`` (:func:`retire_newer`): point
    ``latest`` at the kept checkpoint, move the listed checkpoints still in ``root`` into
    ``root/abandoned/<into>/``, delete the record. Returns the checkpoints' new paths (empty:
    nothing was pending)."""
    root = Path(root)
    try:
        plan = json.loads((root / RETIRING).read_text())
    except FileNotFoundError:
        return []
    except ValueError:  # cut short while written: atomic_write_text makes this unlikely; nothing moved yet
        (root / RETIRING).unlink(missing_ok=True)
        return []
    atomic_write_text(root / LATEST, plan["kept"] + "\n")
    into = root / ABANDONED / plan["into"]
    into.mkdir(parents=True, exist_ok=True)
    moved = []
    for name in plan["checkpoints"]:
        if (root / name).is_dir():
            os.replace(root / name, into / name)
        if (into / name).is_dir():
            moved.append(into / name)
    (root / RETIRING).unlink()
    return moved
