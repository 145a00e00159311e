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
import pickle
import random
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from .utils import faults
from .utils.fs import atomic_directory, atomic_write_text

LATEST = "latest"


def checkpoint_name(index: int, prefix: str = "rollout") -> str:
    """``rollout_000012`` (RL: the rollout id) or ``step_000012`` (offline: the optimizer step)."""
    return f"{prefix}_{index:06d}"


def rng_state() -> dict[str, Any]:
    """The driver's generator states in types ``torch.load(weights_only=True)`` accepts
    (the NumPy key array as a tensor)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": random.getstate(), "numpy": (name, torch.from_numpy(keys.astype(np.int64)), int(pos),
                                                    int(has_gauss), float(cached)),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    keys = keys.numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)
    np.random.set_state((name, keys.astype(np.uint32), pos, has_gauss, cached))
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
        faults.hit("ckpt_write")  # fault injection (tests): the model is written, rng / state not yet
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
    try:
        rng = torch.load(ckpt / "rng.pt", map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # written before rng_state() stored NumPy's keys as a tensor
        with torch.serialization.safe_globals(_NUMPY_RNG_GLOBALS):
            rng = torch.load(ckpt / "rng.pt", map_location="cpu", weights_only=True)
    return state, rng


# What an older rng.pt (NumPy's state as an ndarray) needs beyond weights_only's defaults:
# array reconstruction only, still through torch's restricted unpickler.
_NUMPY_RNG_GLOBALS = [np.ndarray, np.dtype, type(np.dtype(np.uint32)),
                      (np._core if hasattr(np, "_core") else np.core).multiarray._reconstruct]


# Files every complete RL / offline checkpoint has (``dcp/actor/.metadata`` is written last by DCP).
REQUIRED_FILES = ("state.json", "rng.pt", "trainer_state.pt", "model/config.json", "dcp/actor/.metadata")


def checkpoint_problem(ckpt: Path) -> str | None:
    """Why ``ckpt`` cannot be resumed from (a missing or unreadable file), or None when it looks
    complete. Reads ``state.json`` and ``rng.pt``; shard contents are checked when loaded."""
    for name in REQUIRED_FILES:
        if not (ckpt / name).is_file():
            return f"{name} is missing"
    try:
        load_checkpoint_state(ckpt)
        torch.load(ckpt / "trainer_state.pt", map_location="cpu", weights_only=True)
    except Exception as e:  # any damage: truncated pickle, bad JSON, unsupported type
        return f"unreadable ({type(e).__name__}: {e})"
    return None


def list_checkpoints(root: Path, prefix: str = "rollout") -> list[Path]:
    """Checkpoint directories ``<prefix>_NNNNNN`` under ``root``, newest (highest index) first;
    hidden temporary folders of interrupted saves are not listed."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(f"{prefix}_")
             and p.name[len(prefix) + 1:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(prefix) + 1:]), reverse=True)


def remove_partial_saves(root: Path) -> list[str]:
    """Delete the hidden temporary folders interrupted saves left in ``root`` (``.rollout_*``,
    ``.old-*``); returns their names."""
    root = Path(root)
    if not root.is_dir():
        return []
    gone = [p.name for p in root.iterdir() if p.is_dir() and p.name.startswith(".")]
    for name in gone:
        shutil.rmtree(root / name, ignore_errors=True)
    return gone


def find_resumable(root: Path, prefix: str = "rollout", warn: Callable[[str], None] | None = None) -> list[Path]:
    """Complete checkpoints under ``root`` to resume from, newest first. Incomplete or damaged
    ones are skipped with a warning through ``warn`` (the caller falls back to the next one
    if loading the first still fails)."""
    good = []
    for p in list_checkpoints(root, prefix):
        problem = checkpoint_problem(p)
        if problem is None:
            good.append(p)
        elif warn is not None:
            warn(f"checkpoint {p} is not usable ({problem}): falling back to an older one")
    return good
