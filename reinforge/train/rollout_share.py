"""One rollout on the trainer ranks: handed over once, each data-parallel rank's share kept where it is used.

The driver hands a rollout to the trainer ranks once (:class:`RolloutBatch`: in Ray mode one
``ray.put`` per step, every rank reading the same object; in local mode the same Python object).
Each rank takes whole prompt groups (:func:`group_share`, token-balanced over the data-parallel
ranks, as slime splits its rollout data per data-parallel rank), computes their old / reference
log-probs, critic values and advantages, and keeps them (:class:`RolloutShare`) for the optimizer
steps (``TrainWorker.score`` / ``TrainWorker.train``). Each optimizer step then splits its samples
over the ranks token-balanced, as before, and the rows a rank runs but does not hold come to it
from the rank that does, rank to rank (:func:`move_rows`). Per-token data never goes back to the
driver: it receives metrics, reduced over the ranks (:func:`advantage_metrics`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..records import Sample
from .collectives import ParallelContext, partition_by_tokens


@dataclass
class RolloutBatch:
    """A rollout as the trainer ranks receive it: the scored groups (``[num_groups][n]`` samples, the
    over-long filter applied) and the rollout's id (it seeds the optimizer steps' shuffles)."""

    groups: list[list[Sample]]
    rollout_id: int


def group_shares(groups: list[list[Sample]], dp_size: int, shared_prompt: bool = False) -> list[list[int]]:
    """The indices of the groups each data-parallel rank of ``dp_size`` holds (ascending): whole groups,
    balanced by tokens (:func:`~reinforge.train.collectives.partition_by_tokens`; deterministic, so every
    rank computes the same disjoint shares covering every group). A group's tokens: its samples' prompts
    and responses, with ``shared_prompt`` (``train.packing``) its prompt once. A rank may hold none when
    there are fewer groups than ranks."""
    if dp_size == 1:
        return [list(range(len(groups)))]
    lengths = [
        (g[0].prompt_length + sum(s.response_length for s in g)) if shared_prompt else sum(len(s.tokens) for s in g)
        for g in groups
    ]
    return partition_by_tokens(lengths, dp_size)


def group_share(groups: list[list[Sample]], dp_rank: int, dp_size: int, shared_prompt: bool = False) -> list[int]:
    """The indices of the groups data-parallel rank ``dp_rank`` of ``dp_size`` holds (:func:`group_shares`)."""
    return group_shares(groups, dp_size, shared_prompt)[dp_rank]


@dataclass
class RolloutShare:
    """What one trainer rank holds of a rollout between scoring and training.

    Attributes:
        samples: every sample of the rollout, flattened group-major (each rank knows every sample:
            an optimizer step's loss normalisers count the whole step).
        groups: the indices of the groups this rank holds (:func:`group_share`, ascending).
        owned: the indices in ``samples`` of their samples (ascending: group-major, in ``groups`` order).
        owner: for every sample, the data-parallel rank that holds it (:func:`owners`).
        old_log_probs, ref_log_probs, values, advantages, returns: per sample of ``samples``, fp32
            [response_length] on the CPU for the samples ``owned``, None at the others; a field is
            None when the run does not compute it.
    """

    samples: list[Sample]
    groups: list[int]
    owned: list[int]
    owner: list[int]
    old_log_probs: list[torch.Tensor | None] | None = None
    ref_log_probs: list[torch.Tensor | None] | None = None
    values: list[torch.Tensor | None] | None = None
    advantages: list[torch.Tensor | None] | None = None
    returns: list[torch.Tensor | None] | None = None

    @classmethod
    def take(cls, batch: RolloutBatch, dp_rank: int, dp_size: int, shared_prompt: bool = False) -> RolloutShare:
        """Rank ``dp_rank``'s share of ``batch`` (:func:`group_share`)."""
        shares = group_shares(batch.groups, dp_size, shared_prompt)
        owner = _sample_owners(batch.groups, shares)
        owned = [i for i, r in enumerate(owner) if r == dp_rank]  # (ascending: group-major, groups ascending)
        return cls([s for g in batch.groups for s in g], shares[dp_rank], owned, owner)

    def mine(self, rows: list[torch.Tensor | None] | None) -> list[torch.Tensor] | None:
        """The entries of ``rows`` (one per sample) of the samples this rank holds, in ``owned`` order."""
        return None if rows is None else [rows[i] for i in self.owned]

    def spread(self, rows: list[torch.Tensor] | None) -> list[torch.Tensor | None] | None:
        """Inverse of :meth:`mine`: one entry per sample, None at the samples of other ranks."""
        if rows is None:
            return None
        out: list[torch.Tensor | None] = [None] * len(self.samples)
        for i, r in zip(self.owned, rows, strict=True):
            out[i] = r
        return out


def owners(groups: list[list[Sample]], dp_size: int, shared_prompt: bool = False) -> list[int]:
    """For each sample of ``groups`` (flattened group-major), the data-parallel rank that holds it
    (:func:`group_shares`; the same on every rank)."""
    return _sample_owners(groups, group_shares(groups, dp_size, shared_prompt))


def _sample_owners(groups: list[list[Sample]], shares: list[list[int]]) -> list[int]:
    group_owner = [0] * len(groups)
    for r, share in enumerate(shares):
        for g in share:
            group_owner[g] = r
    return [group_owner[g] for g, group in enumerate(groups) for _ in group]


def move_rows(
    parallel: ParallelContext,
    fields: dict[str, list[torch.Tensor | None]],
    lengths: list[int],
    owner: list[int],
    dest: list[int],
) -> dict[str, list[torch.Tensor | None]]:
    """Hand per-sample rows from the ranks that hold them to the ranks that train on them.

    The rollout's samples are scored where they are held (whole groups, :func:`group_share`), but
    each optimizer step splits its samples over the data-parallel ranks anew, token-balanced
    (``ModelTrainer.rank_shares``), so that no rank waits for another. This moves each sample's rows
    once, from ``owner[i]`` to ``dest[i]``, rank to rank (one ``all_to_all`` over the ``dp`` group
    for all fields; each rank knows every sample's length and place, so nothing else is exchanged).
    A collective: every rank calls it with the same ``lengths``, ``owner``, ``dest`` and field names.

    Args:
        parallel: this rank's place (``dp_rank``, ``dp_size``).
        fields: name -> one fp32 [lengths[i]] row per sample, present at the samples this rank
            holds (None elsewhere).
        lengths: every sample's row length (its response length).
        owner: the dp rank holding each sample's rows.
        dest: the dp rank that needs each sample's rows, or -1 (none: the sample is not trained).

    Returns:
        name -> one row per sample, present at the samples with ``dest[i]`` this rank (CPU), None
        elsewhere.
    """
    n, keys = len(lengths), sorted(fields)
    if not keys:
        return {}
    if parallel.dp_size == 1:
        return {k: [fields[k][i] if dest[i] == 0 else None for i in range(n)] for k in keys}
    me, ranks = parallel.dp_rank, parallel.dp_size
    send = sorted((i for i in range(n) if owner[i] == me and dest[i] >= 0), key=lambda i: (dest[i], i))
    recv = sorted((i for i in range(n) if dest[i] == me), key=lambda i: (owner[i], i))
    send_sizes, recv_sizes = [0] * ranks, [0] * ranks
    for i in send:
        send_sizes[dest[i]] += lengths[i]
    for i in recv:
        recv_sizes[owner[i]] += lengths[i]
    rows = [torch.stack([fields[k][i].float().reshape(-1) for k in keys], dim=1) for i in send]
    got = parallel.all_to_all(torch.cat(rows) if rows else torch.zeros(0, len(keys)), send_sizes, recv_sizes)
    out: dict[str, list[torch.Tensor | None]] = {k: [None] * n for k in keys}
    for i, part in zip(recv, got.split([lengths[i] for i in recv])):
        for j, k in enumerate(keys):
            out[k][i] = part[:, j].clone()
    return out


def advantage_metrics(
    advantages: list[torch.Tensor], total: Callable[[dict[str, float]], dict[str, float]] | None = None
) -> dict[str, float]:
    """``rollout/advantage_{mean,std,abs_mean}`` over every response token of the rollout (the
    standard deviation unbiased; all 0 with no token), from this rank's samples' advantages and
    ``total`` summing a dict of floats over the data-parallel ranks
    (:meth:`~reinforge.train.collectives.ParallelContext.sum_floats`; two collectives) or None when
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
