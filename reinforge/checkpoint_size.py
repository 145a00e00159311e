"""A checkpoint's size for the line a save logs: ``model/``, ``adapter/``, DCP weights, optimizer state."""

from __future__ import annotations

from pathlib import Path

OPTIM_SUFFIX = "_optim"  # dcp/actor_optim: the optimizer state of dcp/actor


def size_summary(ckpt: Path) -> str:
    """``2.2 GB: model/ 0.54 GB, dcp/ weights 0.54 GB, optimizer state 1.1 GB`` for a log line; weights
    stored once in ``model/`` (``dcp/<name>/hf_weights.json`` naming it) are said so, not sized 0."""
    ckpt = Path(ckpt)
    parts = {"model/ (Hugging Face, fp32)": 0, "adapter/": 0, "dcp/ weights": 0, "optimizer state": 0, "other": 0}
    pointers = False
    for f in ckpt.rglob("*"):
        if not f.is_file():
            continue
        rel = f.relative_to(ckpt).parts
        pointer = rel[0] == "dcp" and f.name == "hf_weights.json"
        pointers |= pointer
        key = (
            "other"
            if pointer
            else "model/ (Hugging Face, fp32)"
            if rel[0] == "model"
            else "adapter/"
            if rel[0] == "adapter"
            else ("optimizer state" if rel[1].endswith(OPTIM_SUFFIX) else "dcp/ weights")
            if rel[0] == "dcp"
            else "other"
        )
        parts[key] += f.stat().st_size
    total = sum(parts.values())
    shown = [f"{k} {_gb(v)}" for k, v in parts.items() if v and k != "other"]
    if pointers:  # the trained weights are model/'s, not a second copy (train/model_trainer.py: HF_WEIGHTS)
        shown.insert(1 + bool(parts["adapter/"]), "dcp/ weights: those of model/ (not stored twice)")
    return f"{_gb(total)}: " + ", ".join(shown)


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"
