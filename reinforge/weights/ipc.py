"""Transport by CUDA IPC handle: the trainer and the engine share a GPU (colocated), the engine
opens the trainer's memory without a copy. Also SGLang's serialized form of the same handles."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterable
from typing import Any

import torch

Handles = list[tuple[str, Any]]


def to_handles(bucket: Iterable[tuple[str, torch.Tensor]]) -> Handles:
    """(name, (rebuild function, args)) per tensor: picklable, cheap, valid while the sender keeps
    the tensors alive (the caller waits for the receiver before dropping the bucket)."""
    from torch.multiprocessing.reductions import reduce_tensor

    return [(n, reduce_tensor(t.detach())) for n, t in bucket]


def from_handles(handles: Handles, device_index: int | None = None) -> list[tuple[str, torch.Tensor]]:
    """Rebuild the tensors of :func:`to_handles` in this process. ``device_index`` replaces the
    sender's device ordinal where this process numbers the same GPU differently (vLLM workers)."""
    out = []
    for name, (rebuild, args) in handles:
        if device_index is not None:
            args = list(args)
            args[6] = device_index  # rebuild_cuda_tensor's device argument
        out.append((name, rebuild(*args)))
    return out


def serialize_named_tensors(named: list[tuple[str, torch.Tensor]]) -> str:
    """Pickle with torch's ``ForkingPickler`` (CUDA tensors become IPC handles, CPU tensors shared
    memory), base64 text: the ``serialized_named_tensors`` entry SGLang's
    ``/update_weights_from_tensor`` expects."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers torch's tensor reductions with ForkingPickler)

    buf = io.BytesIO()
    ForkingPickler(buf).dump(named)
    return base64.b64encode(buf.getvalue()).decode()
