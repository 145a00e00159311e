"""Atomic checkpoints that resume a run exactly.

Layout of ``<output_dir>/checkpoints/rollout_000012/``::

    model/           Hugging Face folder of the policy (fp32 safetensors, config, tokenizer)
    trainer.pt       optimizers, LR schedulers, skipped-step counts (actor, critic)
    critic.safetensors  the value model (PPO with a critic only)
    rng.pt           Python, NumPy, torch CPU and CUDA generator states
    state.json       rollout_id, weight_version, data iterator position, config, metric history

A checkpoint is written into a hidden temporary directory beside its final place and
renamed into place only when complete, and ``checkpoints/latest`` (the name of the newest
one) is replaced atomically afterwards, so an interrupted save never damages an existing
checkpoint.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .models.loading import save_hf_folder

LATEST = "latest"


def checkpoint_name(rollout_id: int) -> str:
    return f"rollout_{rollout_id:06d}"


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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


def save_checkpoint(root: Path, rollout_id: int, model: torch.nn.Module, model_source: Path,
                    trainer_state: dict[str, Any], state: dict[str, Any], keep_last: int | None = None,
                    extra_tensors: dict[str, dict[str, torch.Tensor]] | None = None) -> Path:
    """Write checkpoint ``root/rollout_<id>`` atomically and point ``root/latest`` at it.

    Args:
        root: the run's ``checkpoints`` directory.
        model_source: folder whose config/tokenizer files accompany the weights.
        trainer_state: optimizer / scheduler state (``Actor.state_dict()``).
        state: JSON-serialisable loop state (rollout_id, data position, config...).
        keep_last: delete older checkpoints beyond this many (None keeps all).
        extra_tensors: name -> state dict, each written as ``<name>.safetensors`` (the critic).
    Returns:
        the checkpoint directory.
    """
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(rollout_id)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        save_hf_folder(model, tmp / "model", model_source)
        torch.save(trainer_state, tmp / "trainer.pt")
        if extra_tensors:
            from safetensors.torch import save_file

            for name, tensors in extra_tensors.items():
                save_file({k: v.detach().cpu().clone() for k, v in tensors.items()}, str(tmp / f"{name}.safetensors"))
        torch.save(rng_state(), tmp / "rng.pt")
        (tmp / "state.json").write_text(json.dumps(state, indent=1))
        if final.exists():
            old = root / f".old-{final.name}"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _atomic_write_text(root / LATEST, final.name + "\n")
    if keep_last is not None:
        done = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("rollout_"))
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


def load_checkpoint_state(ckpt: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(state.json, trainer state, rng state) of a checkpoint directory."""
    state = json.loads((ckpt / "state.json").read_text())
    trainer = torch.load(ckpt / "trainer.pt", map_location="cpu", weights_only=False)
    rng = torch.load(ckpt / "rng.pt", map_location="cpu", weights_only=False)
    return state, trainer, rng
