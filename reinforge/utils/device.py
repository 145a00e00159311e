"""Choosing the torch device from ``train.device``, and whether this machine has it."""

from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    """``auto`` is ``cuda`` when a GPU is visible, else ``cpu``; anything else is passed to torch."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _visible_devices() -> str:
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return f"cpu and {n} CUDA GPU(s) (cuda:0..cuda:{n - 1})" if n else "cpu only (no CUDA GPU is visible)"


def device_problems(name: str, key: str = "train.device") -> list[str]:
    """``train.device`` (``auto``, ``cpu``, ``cuda``, ``cuda:N``, ``mps``...) against the devices this
    machine has: a type torch does not know, a CUDA device without a visible GPU, an index past the
    GPUs. Empty when the device exists."""
    if name == "auto":
        return []
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        return [
            f"{key}={name!r} is not a device type torch knows; use auto, cpu, cuda or cuda:N (this machine: "
            f"{_visible_devices()})"
        ]
    if dev.type == "cpu":
        return []
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if dev.index is None and n == 0 or dev.index is not None and dev.index >= n:
            return [f"{key}={name!r}: this machine has {_visible_devices()}; use {key}=auto or cpu, or a cuda:N it has"]
        return []
    if dev.type == "mps" and torch.backends.mps.is_available():
        return []
    module = getattr(torch, dev.type, None)  # xpu, ... expose is_available()
    if module is not None and callable(getattr(module, "is_available", None)) and module.is_available():
        return []
    return [
        f"{key}={name!r}: no {dev.type} device is available here (this machine: {_visible_devices()}); use "
        f"{key}=auto or cpu"
    ]
