"""Learning-rate schedules."""

from __future__ import annotations

import math


def lr_multiplier(step: int, warmup: int, total: int, style: str, min_ratio: float) -> float:
    """Factor on the peak learning rate after ``step`` optimizer steps.

    Linear warm-up from 1/warmup to 1 over ``warmup`` steps, then ``constant``, or a decay to
    ``min_ratio`` (= min_lr / lr) at step ``total``: ``linear`` or half-``cosine``
    (Loshchilov & Hutter 2017, without restarts), as Megatron's ``--lr-decay-style``.

    Raises:
        ValueError: unknown style.
    """
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if style == "constant":
        return 1.0
    span = max(total - warmup, 1)
    progress = min(max(step - warmup, 0) / span, 1.0)
    if style == "linear":
        return min_ratio + (1.0 - min_ratio) * (1.0 - progress)
    if style == "cosine":
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr_decay_style {style!r}; choose constant, linear or cosine")
