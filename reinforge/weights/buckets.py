"""Cutting a stream of (name, tensor) pairs into buckets, and a bucket into one flat buffer."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

Named = list[tuple[str, torch.Tensor]]
Meta = list[tuple[str, tuple[int, ...]]]


def bucket_by_bytes(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[Named]:
    """Consecutive groups of (name, tensor) pairs of about ``bucket_bytes`` each (a group closes
    once it reaches the size; every group holds at least one tensor). Lazy, so tensors
    gathered on the fly (FSDP all-gathers) are held one bucket at a time."""
    bucket: Named = []
    size = 0
    for name, t in named:
        bucket.append((name, t))
        size += t.numel() * t.element_size()
        if size >= bucket_bytes:
            yield bucket
            bucket, size = [], 0
    if bucket:
        yield bucket


def flatten_bucket(bucket: Named, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, Meta]:
    """One contiguous 1-D buffer of ``dtype`` holding the bucket's tensors in order, and the
    (name, shape) list that :func:`unflatten_bucket` needs to cut it back."""
    meta = [(n, tuple(t.shape)) for n, t in bucket]
    return torch.cat([t.detach().reshape(-1).to(dtype) for _, t in bucket]), meta


def bucket_numel(meta: Meta) -> int:
    """Elements of the flat buffer of a bucket described by ``meta``."""
    return sum(int(torch.Size(shape).numel()) for _, shape in meta)


def unflatten_bucket(flat: torch.Tensor, meta: Meta) -> Iterator[tuple[str, torch.Tensor]]:
    """Inverse of :func:`flatten_bucket`: (name, view of ``flat``) pairs, no copies."""
    sizes = [int(torch.Size(shape).numel()) for _, shape in meta]
    for (name, shape), part in zip(meta, flat.split(sizes)):
        yield name, part.view(shape)
