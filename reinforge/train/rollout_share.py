"""One rollout on the trainer ranks: handed over once, each data-parallel rank's share kept where it is used.

The driver hands a rollout to the trainer ranks once (:class:`RolloutBatch`: in Ray mode one
``ray.put`` per step, every rank reading the same object; in local mode the same Python object).
Each rank takes whole prompt groups (:func:`group_share`, token-balanced over the data-parallel
ranks, as slime splits its rollout data per data-parallel rank), computes their old / reference
log-probs, critic values and advantages, and keeps them (:class:`RolloutShare`) for the optimizer
steps (``TrainWorker.score`` / ``TrainWorker.train``). Per-token data never goes back to the
driver: it receives metrics, reduced over the ranks (:func:`advantage_metrics`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..records import Sample
from .parallel import partition_by_tokens


@dataclass
class RolloutBatch:
    """A rollout as the trainer ranks receive it: the scored groups (``[num_groups][n]`` samples, the
    over-long filter applied) and the rollout's id (it seeds the optimizer steps' shuffles)."""

    groups: list[list[Sample]]
    rollout_id: int


def group_share(groups: list[list[Sample]], dp_rank: int, dp_size: int, shared_prompt: bool = False) -> list[int]:
    """The indices of the groups data-parallel rank ``dp_rank`` of ``dp_size`` holds: whole groups,
    balanced by tokens (:func:`~reinforge.train.parallel.partition_by_tokens`; deterministic, so the
    ranks' shares are disjoint and cover every group). A group's tokens: its samples' prompts and
    responses, with ``shared_prompt`` (``train.packing``) its prompt once. A rank may hold none when
    there are fewer groups than ranks."""
    if dp_size == 1:
        return list(range(len(groups)))
    lengths = [
        (g[0].prompt_length + sum(s.response_length for s in g)) if shared_prompt else sum(len(s.tokens) for s in g)
        for g in groups
    ]
    return partition_by_tokens(lengths, dp_size)[dp_rank]


@dataclass
class RolloutShare:
    """What one trainer rank holds of a rollout between scoring and training.

    Attributes:
        samples: every sample of the rollout, flattened group-major (each rank knows every sample:
            an optimizer step's loss normalisers count the whole step).
        groups: the indices of the groups this rank holds (:func:`group_share`).
        owned: the indices in ``samples`` of their samples (group-major, in ``groups`` order).
        old_log_probs, ref_log_probs, values, advantages, returns: per sample of ``samples``, fp32
            [response_length] on the CPU for the samples ``owned``, None at the others; a field is
            None when the run does not compute it.
    """

    samples: list[Sample]
    groups: list[int]
    owned: list[int]
    old_log_probs: list[torch.Tensor | None] | None = None
    ref_log_probs: list[torch.Tensor | None] | None = None
    values: list[torch.Tensor | None] | None = None
    advantages: list[torch.Tensor | None] | None = None
    returns: list[torch.Tensor | None] | None = None

    @classmethod
    def take(cls, batch: RolloutBatch, dp_rank: int, dp_size: int, shared_prompt: bool = False) -> RolloutShare:
        """Rank ``dp_rank``'s share of ``batch`` (:func:`group_share`)."""
        starts, n = [], 0
        for g in batch.groups:
            starts.append(n)
            n += len(g)
        mine = group_share(batch.groups, dp_rank, dp_size, shared_prompt)
        owned = [starts[g] + j for g in mine for j in range(len(batch.groups[g]))]
        return cls([s for g in batch.groups for s in g], mine, owned)

    def mine(self, rows: list[torch.Tensor | None] | None) -> list[torch.Tensor] | None:
        """The entries of ``rows`` (one per sample) of the samples this rank holds, in ``owned`` order."""
        return None if rows is None else [rows[i] for i in self.owned]  # type: ignore[misc]

    def spread(self, rows: list[torch.Tensor] | None) -> list[torch.Tensor | None] | None:
        """Inverse of :meth:`mine`: one entry per sample, None at the samples of other ranks."""
        if rows is None:
            return None
        out: list[torch.Tensor | None] = [None] * len(self.samples)
        for i, r in zip(self.owned, rows, strict=True):
            out[i] = r
        return out


def advantage_metrics(
    advantages: list[torch.Tensor], total: Callable[[dict[str, float]], dict[str, float]] | None = None
) -> dict[str, float]:
    """``rollout/advantage_{mean,std,abs_mean}`` over every response token of the rollout (the
    standard deviation unbiased; all 0 with no token), from this rank's samples' advantages and
    ``total`` summing a dict of floats over the data-parallel ranks
    (:meth:`~reinforge.train.parallel.ParallelContext.sum_floats`; two collectives) or None when
    they are every sample's. Sums in float64: equal to the statistics of the concatenated
    tokens up to rounding."""
    total = total or (lambda d: d)
    x = torch.cat([a.double().flatten() for a in advantages]) if advantages else torch.zeros(0, dtype=torch.float64)
    s = total({"n": float(x.numel()), "sum": float(x.sum()), "abs": float(x.abs().sum())})
    n = s["n"]
    if n == 0:
        return {"rollout/advantage_mean": 0.0, "rollout/advantage_std": 0.0, "rollout/advantage_abs_mean": 0.0}
    mean = s["sum"] / n
    squares = total({"sq": float(((x - mean) ** 2).sum())})["sq"]
    return {
        "rollout/advantage_mean": mean,
        "rollout/advantage_std": math.sqrt(squares / (n - 1)) if n > 1 else 0.0,
        "rollout/advantage_abs_mean": s["abs"] / n,
    }
