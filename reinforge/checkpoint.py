"""Atomic checkpoints that resume a run exactly.

Layout of ``<output_dir>/checkpoints/rollout_000012/``::

    model/              the policy as a Hugging Face folder (fp32 safetensors, config, tokenizer)
    dcp/actor/          policy + optimizer, torch.distributed.checkpoint (sharded: loads on any
                        number of trainer ranks)
    dcp/critic/         the same for the critic (PPO with a critic only)
    trainer_state.pt    LR schedulers and skipped-step counters
    rng.pt              the driver's Python, NumPy, torch CPU and CUDA generator states
    state.json          rollout_id, weight_version, data iterator position, config, metric history

A checkpoint is written into a hidden temporary directory beside its final place (every
trainer rank writes its shards there: multi-node runs need a shared filesystem) and renamed
into place only when complete; ``checkpoints/latest`` (the name of the newest one) is replaced
atomically afterwards, so an interrupted save never damages an existing checkpoint.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from .utils.fs import atomic_directory, atomic_write_text

LATEST = "latest"


def checkpoint_name(index: int, prefix: str = "rollout") -> str:
    """``rollout_000012`` (RL: the rollout id) or ``step_000012`` (offline: the optimizer step)."""
    return f"{prefix}_{index:06d}"


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(root: Path, index: int, write: Callable[[Path], None], state: dict[str, Any],
                    keep_last: int | None = None, prefix: str = "rollout") -> Path:
    """Write checkpoint ``root/<prefix>_<index>`` atomically and point ``root/latest`` at it.

    Args:
        root: the run's ``checkpoints`` directory.
        write: fills the temporary directory with the trainers' part (model, dcp/, trainer_state.pt).
        state: JSON-serialisable loop state (rollout_id or step, data position, config...).
        keep_last: delete older checkpoints of this prefix beyond this many (None keeps all).
    Returns:
        the checkpoint directory.
    """
    final = root / checkpoint_name(index, prefix)
    with atomic_directory(final) as tmp:
        write(tmp)
        torch.save(rng_state(), tmp / "rng.pt")
        (tmp / "state.json").write_text(json.dumps(state, indent=1))
    atomic_write_text(root / LATEST, final.name + "\n")
    if keep_last is not None:
        done = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(f"{prefix}_"))
        for p in done[:-keep_last]:
            shutil.rmtree(p, ignore_errors=True)
    return final


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory from ``run.load``: the checkpoint itself, a ``checkpoints``
    directory (its ``latest``) or a run directory (its ``checkpoints/latest``).

    Raises:
        FileNotFoundError: nothing resumable there.
    """
    p = Path(path)
    for candidate in (p, p / "checkpoints"):
        if (candidate / "state.json").is_file():
            return candidate
        latest = candidate / LATEST
        if latest.is_file():
            ckpt = candidate / latest.read_text().strip()
            if (ckpt / "state.json").is_file():
                return ckpt
    raise FileNotFoundError(f"run.load={str(path)!r}: no checkpoint there (expected state.json, or a "
                            f"'latest' file naming one)")


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run directory, or ``None`` when it has none."""
    try:
        return resolve_checkpoint(run_dir)
    except FileNotFoundError:
        return None


def load_checkpoint_state(ckpt: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(state.json, driver rng state) of a checkpoint directory."""
    state = json.loads((ckpt / "state.json").read_text())
    rng = torch.load(ckpt / "rng.pt", map_location="cpu", weights_only=False)
    return state, rng
