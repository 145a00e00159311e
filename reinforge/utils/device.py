"""Choosing the torch device from ``train.device``."""

from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    """``auto`` is ``cuda`` when a GPU is visible, else ``cpu``; anything else is passed to torch."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)
