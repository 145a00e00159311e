"""One context-parallel rank's share of a micro-batch (``train.context_parallel_size`` > 1).

The ranks of a context-parallel group hold the same micro-batch. Each runs the model on ``1 / cp``
of its positions (the model-input rows ``[R, T]`` right-padded to a multiple of ``cp``, rank ``j``
taking columns ``j * T / cp`` to ``(j + 1) * T / cp``; position ids and the packed layout's
sequence ids are those of the whole row, so RoPE and the attention mask are unchanged), attention
runs over the whole row (Ulysses, :mod:`reinforge.models.ulysses`), and the rank computes the
log-probs (or values) of the response tokens whose predicting position it holds.

:meth:`SequenceShard.gather` then gives every rank of the group all N response values: a sum
over the group of each rank's values at its own positions (zeros elsewhere). Every rank then
computes the same loss of the whole micro-batch, so the gradient of the gathered vector is the
same on every rank and the backward pass keeps each rank's own positions of it (no
communication): a rank's parameter gradient is the part that flows through its positions, and
FSDP's reduction over the ``dp x cp`` ranks sums the parts. The loss normalisation (token and
sequence counts of the whole step) is therefore the one-process one.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..models.packing import PackedAttention
from .batching import MicroBatch


class _GatherOwn(torch.autograd.Function):
    """Forward: all-reduce (sum) over ``group`` of values that are zero off this rank's positions.
    Backward: the incoming gradient at this rank's positions (every rank computes the same loss)."""

    @staticmethod
    def forward(ctx, full: torch.Tensor, own: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.save_for_backward(own)
        out = full.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (own,) = ctx.saved_tensors
        return grad * own.view(-1, *([1] * (grad.dim() - 1))).to(grad.dtype), None, None


class SequenceShard:
    """This rank's positions of ``mb`` and what it needs to run on them.

    Attributes:
        input_ids, position_ids: [R, T / cp] int64, this rank's columns of the padded rows.
        ctx: the attention context of the whole padded rows (None: plain causal attention).
        own: [N] bool, the response tokens whose predicting position is on this rank.
        index: (rows, local columns) [n] of those positions, for ``logits_mask``.
    """

    def __init__(self, mb: MicroBatch, rank: int, size: int, group: dist.ProcessGroup, pad_id: int):
        R, T = mb.input_ids.shape
        Tp = -(-T // size) * size
        pad = Tp - T
        dev = mb.input_ids.device
        positions = mb.position_ids if mb.position_ids is not None else torch.arange(T, device=dev).expand(R, T)
        ids = F.pad(mb.input_ids, (0, pad), value=pad_id)
        positions = torch.cat([positions, positions[:, -1:].expand(R, pad)], 1)  # (padding: any valid position)
        t = Tp // size
        lo, hi = rank * t, (rank + 1) * t
        self.input_ids, self.position_ids = ids[:, lo:hi], positions[:, lo:hi].contiguous()
        self.ctx = None
        if mb.packed:
            doc = F.pad(mb.doc_ids, (0, pad), value=-1)
            shared = F.pad(mb.shared, (0, pad), value=False) if mb.shared is not None else None
            self.ctx = PackedAttention(doc, shared)
        self.own = (mb.logit_cols >= lo) & (mb.logit_cols < hi)
        self.index = (mb.logit_rows[self.own], mb.logit_cols[self.own] - lo)
        self.group = group

    def gather(self, values: torch.Tensor) -> torch.Tensor:
        """This rank's values [n, ...] at its own response tokens -> all N values [N, ...], the same
        on every rank of the group (with the gradient rule of the module doc)."""
        full = values.new_zeros((self.own.shape[0], *values.shape[1:]))
        full = full.masked_scatter(self.own.view(-1, *([1] * (values.dim() - 1))), values)
        return _GatherOwn.apply(full, self.own, self.group)
