"""Ragged per-sample data (token lists, per-token tensors) to and from dense CPU tensors, in one pass.

A GRPO step handles hundreds of samples; building a tensor per sample and field costs ~35 us each on
the host, which added up to ~30 ms per micro-batch build and to the host overhead of a small step on a
GPU (docs/benchmarks.md, "Host work of the step", bench/host_work.py). These helpers make one tensor
per field.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import torch


def flat_tensor(lists: Sequence[Sequence[int] | Sequence[float]], dtype: type = np.int64) -> torch.Tensor:
    """The concatenation of ``lists`` as one 1-D CPU tensor of numpy ``dtype`` (int64: torch.long,
    float32: torch.float32). numpy reads the chained iterator ~5x faster than ``torch.tensor`` reads a
    list of Python numbers."""
    n = sum(len(x) for x in lists)
    return torch.from_numpy(np.fromiter(itertools.chain.from_iterable(lists), dtype=dtype, count=n))


def prefix_mask(
    lengths: Sequence[int], width: int | None = None, device: torch.device | str | None = None
) -> torch.Tensor:
    """[N, width] bool, True at column j < ``lengths[i]`` of row i: the cells a right-padded grid of
    these lengths fills. ``width`` defaults to the longest length, at least 1 (the width of every
    grid built here)."""
    if width is None:
        width = max(max(lengths, default=0), 1)
    return torch.arange(width, device=device) < torch.tensor(list(lengths), dtype=torch.long, device=device)[:, None]


def right_padded(vectors: Sequence[torch.Tensor | Sequence[float]], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Per-sample vectors (tensors or lists of numbers) -> a right-padded [N, max length] grid of
    ``dtype``, 0 on padding; [N, 1] when every vector is empty.

    Raises:
        ValueError: a tensor with more than one dimension.
    """
    mask = prefix_mask([len(v) for v in vectors])
    grid = torch.zeros(mask.shape, dtype=dtype)
    if not bool(mask.any()):
        return grid
    if any(isinstance(v, torch.Tensor) and v.dim() > 1 for v in vectors):
        raise ValueError("right_padded takes 1-D vectors")
    if all(isinstance(v, torch.Tensor) for v in vectors):
        values = torch.cat([v.to(dtype) for v in vectors])
    else:  # lists of numbers (tensors among them as lists)
        values = flat_tensor([v.tolist() if isinstance(v, torch.Tensor) else v for v in vectors], np.float64).to(dtype)
    grid[mask] = values.to(grid.device)
    return grid


def unpad_rows(grid: torch.Tensor, lengths: Sequence[int]) -> list[torch.Tensor]:
    """The first ``lengths[i]`` values of each row of ``grid`` [N, L], as N tensors (:func:`split_owned`)."""
    return split_owned(grid[prefix_mask(lengths, grid.shape[1], grid.device)], lengths)


def split_owned(flat: torch.Tensor, lengths: Sequence[int]) -> list[torch.Tensor]:
    """``flat`` [sum(lengths), ...] cut into ``len(lengths)`` tensors, each with its own storage: a view
    pickles (to another rank, to a Ray actor) with the whole storage it views."""
    return [v.clone() for v in flat.split(list(lengths))]
