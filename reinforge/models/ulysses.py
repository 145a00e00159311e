"""Ulysses context parallelism for attention (Jacobs et al. 2023, "DeepSpeed Ulysses: System
Optimizations for Enabling Training of Extreme Long Sequence Transformer Models").

Each of the ``cp`` ranks of a group holds ``1 / cp`` of the positions of a sequence with all of
its heads. Before attention an all-to-all hands every rank all the positions of ``1 / cp`` of the
heads (rank ``j`` gets heads ``j * H / cp`` to ``(j + 1) * H / cp``, its share of the key/value heads
likewise, so grouped-query pairs stay together); attention then runs over the whole sequence,
and a second all-to-all gives the positions back. Both exchanges have gradients (the backward of an
all-to-all is the reverse all-to-all).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _all_to_all(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Chunk ``i`` of dim 0 goes to rank ``i`` of ``group``; chunk ``i`` of the result came from rank ``i``."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor, all_to_all_single_autograd

    out = all_to_all_single_autograd(x.contiguous(), None, None, group)
    return out.wait() if isinstance(out, AsyncCollectiveTensor) else out


def positions_to_heads(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """[B, T / cp, H, D] (this rank's positions, all heads) -> [B, T, H / cp, D] (all positions,
    this rank's heads). ``H`` must be a multiple of the group size."""
    cp = dist.get_world_size(group)
    B, t, H, D = x.shape
    x = x.reshape(B, t, cp, H // cp, D).permute(2, 0, 1, 3, 4)  # [cp (head block), B, t, H/cp, D]
    x = _all_to_all(x, group)  # [cp (source rank = position block), B, t, H/cp, D]
    return x.permute(1, 0, 2, 3, 4).reshape(B, cp * t, H // cp, D)


def heads_to_positions(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Inverse of :func:`positions_to_heads`: [B, T, H / cp, D] -> [B, T / cp, H, D]."""
    cp = dist.get_world_size(group)
    B, T, h, D = x.shape
    x = x.reshape(B, cp, T // cp, h, D).permute(1, 0, 2, 3, 4)  # [cp (position block), B, T/cp, h, D]
    x = _all_to_all(x, group)  # [cp (source rank = head block), B, T/cp, h, D]
    return x.permute(1, 2, 0, 3, 4).reshape(B, T // cp, cp * h, D)


def scatter_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: dist.ProcessGroup
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [B, T/cp, H, D], k and v [B, T/cp, KVH, D] -> the same with all T positions and 1 / cp of
    the heads. Key/value heads that the group size does not divide are first repeated to one per
    query head (grouped-query attention becomes multi-head attention: the same result)."""
    cp = dist.get_world_size(group)
    H, KVH = q.shape[2], k.shape[2]
    if KVH % cp:
        k, v = k.repeat_interleave(H // KVH, dim=2), v.repeat_interleave(H // KVH, dim=2)
    return positions_to_heads(q, group), positions_to_heads(k, group), positions_to_heads(v, group)
