"""Transport by tensor: the engine is in this process (local mode), or receives the tensors by
value through Ray's object store (CPU engines in Ray mode)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from ..utils import faults, trace

if TYPE_CHECKING:
    from ..records import RolloutEngine


def sync_in_process(named: Iterable[tuple[str, torch.Tensor]], engine: RolloutEngine, version: int) -> dict[str, float]:
    """Copy the policy's tensors into ``engine`` in place; returns ``{"time/sync": seconds}``."""
    with trace.span("update_weights", "sync", version=version) as s:
        engine.update_weights(with_fault_point(named), version)
    return {"time/sync": s.seconds}


def with_fault_point(named: Iterable[tuple[str, torch.Tensor]]) -> Iterable[tuple[str, torch.Tensor]]:
    """``named`` with the ``weight_sync`` fault point after its first tensor (tests: a crash
    while the engine holds a mix of old and new weights); a plain pass-through otherwise."""
    for i, item in enumerate(named):
        if i == 1:
            faults.hit("weight_sync")
        yield item


def by_value(bucket: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """A bucket to send by value (detached, so no autograd graph travels with it)."""
    return [(n, t.detach()) for n, t in bucket]
