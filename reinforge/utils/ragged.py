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


def right_padded(vectors: Sequence[torch.Tensor | Sequence[float]], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Per-sample vectors (tensors or lists of numbers) -> a right-padded [N, max length] grid of
    ``dtype``, 0 on padding; [N, 1] when every vector is empty.

    Raises:
        ValueError: a tensor with more than one dimension.
    """
    lengths = torch.tensor([len(v) for v in vectors], dtype=torch.long)
    grid = torch.zeros(len(vectors), max(int(lengths.max()) if len(vectors) else 0, 1), dtype=dtype)
    if not vectors or int(lengths.sum()) == 0:
        return grid
    if any(isinstance(v, torch.Tensor) and v.dim() > 1 for v in vectors):
        raise ValueError("right_padded takes 1-D vectors")
    if all(isinstance(v, torch.Tensor) for v in vectors):
        values = torch.cat([v.to(dtype) for v in vectors])
    else:  # lists of numbers (tensors among them as lists)
        values = flat_tensor([v.tolist() if isinstance(v, torch.Tensor) else v for v in vectors], np.float64).to(dtype)
    grid[torch.arange(grid.shape[1]) < lengths[:, None]] = values.to(grid.device)
    return grid


def unpad_rows(grid: torch.Tensor, lengths: Sequence[int]) -> list[torch.Tensor]:
    """The first ``lengths[i]`` values of each row of ``grid`` [N, L], as N tensors (:func:`split_owned`)."""
    mask = torch.arange(grid.shape[1], device=grid.device) < torch.tensor(lengths, device=grid.device)[:, None]
    return split_owned(grid[mask], lengths)


def split_owned(flat: torch.Tensor, lengths: Sequence[int]) -> list[torch.Tensor]:
    """``flat`` [sum(lengths), ...] cut into ``len(lengths)`` tensors, each with its own storage: a view
    pickles (to another rank, to a Ray actor) with the whole storage it views."""
    return [v.clone() for v in flat.split(list(lengths))]
