"""Expert parallelism: a mixture-of-experts block whose experts are split over a process group.

Each of the ``ep`` ranks of the group holds ``El = E / ep`` consecutive experts (rank ``r``:
experts ``[r El, (r+1) El)``; :func:`reinforge.train.mesh.apply_expert_parallel` shards them) and
routes its own tokens locally (the router is replicated). A block's forward then runs, for the
``N`` tokens of this rank with their ``k`` chosen experts each (GShard, Lepikhin et al. 2020;
the dispatch / combine of Megatron-LM's and torchtitan's all-to-all token dispatchers):

1. the ``N k`` (token, expert) pairs are sorted by expert (a stable argsort): the pairs for rank
   ``r`` are then one contiguous run, sorted by its local experts;
2. the per-expert counts ``[E]`` are exchanged (``all_to_all_single`` of ``ep`` chunks of ``El``):
   rank ``r`` learns ``recv[s, e]``, how many pairs rank ``s`` sends to its local expert ``e``;
3. the pairs' hidden states go out with ``all_to_all_single`` (split sizes from the counts; a
   host read of the counts, as the split sizes must be Python ints);
4. the received rows (ordered by source rank, then local expert) are regrouped by local expert,
   run through the local experts (``torch._grouped_mm`` or the loop, as without expert
   parallelism) and put back in the received order;
5. a second ``all_to_all_single`` returns each output to the rank of its token, where the ``k``
   outputs of a token are weighted and summed.

The all-to-alls are differentiable (:class:`_AllToAll`: the backward pass is the all-to-all with
the split sizes swapped). Every rank issues the same collectives in the same order whatever its
tokens: one count exchange and two all-to-alls per block in the forward pass, two in the
backward; a rank that sends or receives nothing passes empty tensors, and the local experts take
part in the autograd graph even with no rows (zero gradients), so FSDP's reductions of the expert
gradients stay aligned.

Gradient scale: an expert's gradient on its rank is already the sum over the tokens of all ``ep``
ranks, but the trainer scales every loss by its number of data-parallel ranks so that FSDP's
average gives a sum (:attr:`reinforge.train.model_trainer.ModelTrainer.loss_scale`); the local
expert weights therefore pass through :class:`_ScaleGrad` (identity forward, gradient times
``1 / ep``), so that with FSDP over the ``dp / ep`` ranks that hold the same experts (or none)
the expert gradients equal one process's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from .moe_dispatch import combine, dispatch, sort_by_expert

__all__ = ["all_to_all", "expert_parallel_experts", "local_experts"]


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with autograd: rows ``[sum(send), ...]`` -> ``[sum(recv), ...]``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, send: list[int], recv: list[int], group: dist.ProcessGroup) -> torch.Tensor:
        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = x.new_empty((sum(recv), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out = grad.new_empty((sum(ctx.send), *grad.shape[1:]))
        dist.all_to_all_single(
            out, grad.contiguous(), output_split_sizes=ctx.send, input_split_sizes=ctx.recv, group=ctx.group
        )
        return out, None, None, None


def all_to_all(x: torch.Tensor, send: list[int], recv: list[int], group: dist.ProcessGroup) -> torch.Tensor:
    """Send ``x[sum(send[:j]) : sum(send[:j+1])]`` to rank ``j`` of ``group`` and receive
    ``recv[j]`` rows from each (in rank order); differentiable. ``send`` / ``recv``: one int per
    rank of ``group`` (they must agree across the ranks: what ``i`` sends to ``j`` is what ``j``
    receives from ``i``)."""
    return _AllToAll.apply(x, send, recv, group)


class _ScaleGrad(torch.autograd.Function):
    """Identity in the forward pass; the gradient times ``scale`` in the backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.scale, None


def local_experts(t: torch.Tensor) -> torch.Tensor:
    """The local block of an expert-sharded parameter (a DTensor ``Shard(0)`` over the expert
    dimension: its ``to_local()``, differentiable), or ``t`` itself when it is a plain tensor."""
    return t.to_local() if hasattr(t, "to_local") else t


def expert_parallel_experts(
    group: dist.ProcessGroup,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    x: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    dtype: torch.dtype,
    compute: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
    fused: bool = False,
) -> torch.Tensor:
    """``sum_j weights[:, j] * expert_{ids[:, j]}(x)`` with the experts split over ``group``
    (see the module docstring).

    Args:
        group: the expert-parallel group (E / ep experts on each of its ep ranks, in rank order).
        gate_up: [E, 2I, H] sharded by experts (a DTensor ``Shard(0)``) or this rank's [E/ep, 2I, H];
        down: [E, H, I] likewise (the parameters as the FSDP unit of the experts presents them).
        x: [N, H] this rank's tokens (N may be 0); ids: [N, k] int64 global expert ids in [0, E);
        weights: [N, k] gate weights; dtype: the compute dtype of the experts.
        compute: ``(rows [M, H] sorted by local expert, gate_up [El, 2I, H], down [El, H, I],
            ends [El] int64 cumulative row counts) -> [M, H]``, the block's local expert product.
        fused: the token permutation's Triton kernels (:mod:`.moe_dispatch`) where they run.
    Returns:
        [N, H] in ``dtype``.
    Raises:
        ValueError: the local experts times the group size is not E (the number of experts the
            ids refer to, ``gate_up``'s global first dimension).
    """
    ep = dist.get_world_size(group)
    E = gate_up.shape[0] if hasattr(gate_up, "to_local") else gate_up.shape[0] * ep
    gate_up, down = local_experts(gate_up), local_experts(down)
    n_local = gate_up.shape[0]
    if n_local * ep != E:
        raise ValueError(
            f"expert parallelism: {n_local} local experts x {ep} ranks != num_experts={E} (the "
            f"experts' parameters are not split evenly over the expert-parallel group)"
        )
    scale = 1.0 / ep
    gate_up, down = _ScaleGrad.apply(gate_up, scale).to(dtype), _ScaleGrad.apply(down, scale).to(dtype)
    k = ids.shape[1]
    flat = ids.reshape(-1)
    order = sort_by_expert(flat, E)  # (token, slot) pairs by expert: one run per destination rank
    counts = torch.bincount(flat, minlength=E)  # [E] pairs per global expert
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts, group=group)  # [ep * El]: from rank s to local expert e
    send = counts.view(ep, n_local).sum(1).tolist()
    recv_grid = recv_counts.view(ep, n_local)
    recv = recv_grid.sum(1).tolist()
    xs, pos = dispatch(x.to(dtype), order, k, fused)
    xs = all_to_all(xs, send, recv, group)  # [M, H], by source rank then local expert
    local_ids = torch.repeat_interleave(torch.arange(n_local, device=x.device).repeat(ep), recv_counts)
    by_expert = torch.argsort(local_ids, stable=True)
    ends = torch.cumsum(recv_grid.sum(0), 0)
    ys_sorted = compute(xs[by_expert], gate_up, down, ends)
    ys = torch.empty_like(ys_sorted)
    ys = ys.index_copy(0, by_expert, ys_sorted)  # back to the received order
    back = all_to_all(ys, recv, send, group)  # [N*k, H] in `order`
    return combine(back, pos, weights, fused)
