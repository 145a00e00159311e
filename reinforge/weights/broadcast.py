"""Transport by broadcast: trainer rank 0 sends each bucket over the weight-sync group
(:mod:`.groups`) to engines on other GPUs or nodes (disaggregated placement)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from .buckets import Meta, Named, bucket_numel, flatten_bucket, unflatten_bucket
from .groups import broadcast


def send_flat(group, bucket: Named, announce: Callable[[Meta], Any]) -> Any:
    """Broadcast ``bucket`` from rank 0 as one fp32 buffer.

    ``announce(meta)`` is called first with the (name, shape) list: it must make every receiver
    enter :func:`receive_flat` (e.g. submit the Ray call); its result is returned so the caller
    can wait on it after the broadcast.
    """
    flat, meta = flatten_bucket(bucket)
    pending = announce(meta)
    broadcast(group, flat)
    return pending


def receive_flat(group, meta: Meta, device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
    """Receive the buffer :func:`send_flat` broadcasts; (name, tensor) views of it."""
    flat = torch.empty(bucket_numel(meta), dtype=torch.float32, device=device)
    broadcast(group, flat)
    return unflatten_bucket(flat, meta)


def send_each(group, bucket: Named) -> None:
    """Broadcast the bucket's tensors one by one in order, in their own dtype (the receivers were
    told names, dtypes and shapes beforehand: SGLang's ``/update_weights_from_distributed``)."""
    for _, t in bucket:
        broadcast(group, t.detach().contiguous())
