"""The token permutation around a mixture-of-experts block's grouped matmuls: *dispatch* copies each
token's row to the k places of its (token, expert) pairs sorted by expert, *combine* sums each
token's k expert outputs with their gate weights.

For N tokens with k experts each, ``order`` [N k] is the sort of the flattened (token, slot) pairs
by expert and ``pos = inverse(order).view(N, k)`` the sorted row of pair (n, j):

* ``dispatch(x, order, k)``: ``xs[pos[n, j]] = x[n]`` -> (xs [N k, H], pos [N, k]);
* ``combine(ys, pos, w)``: ``out[n] = sum_j w[n, j] ys[pos[n, j]]`` -> [N, H].

On CUDA with Triton each is one kernel forward and one backward, a program per token that moves
its k rows (``dispatch``'s backward is ``combine`` with unit weights; ``combine``'s backward writes
``w[n, j] g[n]`` to row ``pos[n, j]`` and reduces ``g[n] . ys[pos[n, j]]`` for the weights'
gradient), all math in fp32. PyTorch's advanced indexing does the same in several passes, and its
backward (``index_put_`` with accumulation) sorts the indices: measured on an H200 for the 2.6B
MoE shape at 16k tokens, the dispatch and combine took 2.9 ms of a 6.8 ms block forward + backward,
and the block takes 5.0 ms with these kernels (docs/benchmarks.md, "Training kernels";
``bench/moe_block.py``). The engine's MoE layers run them too (forward only, inside its CUDA
graphs). Elsewhere (CPU, or without Triton) the PyTorch indexing runs.
The permutation layout is Megatron-LM's and torchtitan's token dispatcher's (sort by expert, then
un-permute and weight).
"""

from __future__ import annotations

import torch

from ..utils.triton import tl, triton, triton_available

NUM_WARPS = 4

if triton is not None:

    @triton.jit
    def _dispatch_kernel(X, POS, XS, H, K: tl.constexpr, KP: tl.constexpr, BH: tl.constexpr):
        n = tl.program_id(0).to(tl.int64)
        j = tl.arange(0, KP)
        jk = j < K
        rows = tl.load(POS + n * K + j, mask=jk, other=0)
        for h0 in range(0, H, BH):
            h = h0 + tl.arange(0, BH)
            hm = h < H
            x = tl.load(X + n * H + h, mask=hm, other=0.0)
            tile = tl.broadcast_to(x[None, :], (KP, BH))
            tl.store(XS + rows[:, None] * H + h[None, :], tile, mask=jk[:, None] & hm[None, :])

    @triton.jit
    def _combine_kernel(YS, POS, W, OUT, H, K: tl.constexpr, KP: tl.constexpr, BH: tl.constexpr, HAS_W: tl.constexpr):
        n = tl.program_id(0).to(tl.int64)
        j = tl.arange(0, KP)
        jk = j < K
        rows = tl.load(POS + n * K + j, mask=jk, other=0)
        if HAS_W:
            w = tl.load(W + n * K + j, mask=jk, other=0.0).to(tl.float32)
        for h0 in range(0, H, BH):
            h = h0 + tl.arange(0, BH)
            hm = h < H
            tile = tl.load(YS + rows[:, None] * H + h[None, :], mask=jk[:, None] & hm[None, :], other=0.0)
            tile = tile.to(tl.float32)
            if HAS_W:
                tile = tile * w[:, None]
            tl.store(OUT + n * H + h, tl.sum(tile, 0).to(OUT.dtype.element_ty), mask=hm)

    @triton.jit
    def _combine_backward_kernel(
        G, YS, POS, W, GYS, GW, H, K: tl.constexpr, KP: tl.constexpr, BH: tl.constexpr, HAS_GW: tl.constexpr
    ):
        n = tl.program_id(0).to(tl.int64)
        j = tl.arange(0, KP)
        jk = j < K
        rows = tl.load(POS + n * K + j, mask=jk, other=0)
        w = tl.load(W + n * K + j, mask=jk, other=0.0).to(tl.float32)
        dot = tl.zeros([KP], dtype=tl.float32)
        for h0 in range(0, H, BH):
            h = h0 + tl.arange(0, BH)
            hm = h < H
            m2 = jk[:, None] & hm[None, :]
            g = tl.load(G + n * H + h, mask=hm, other=0.0).to(tl.float32)
            if HAS_GW:
                tile = tl.load(YS + rows[:, None] * H + h[None, :], mask=m2, other=0.0).to(tl.float32)
                dot += tl.sum(tile * g[None, :], 1)
            tl.store(GYS + rows[:, None] * H + h[None, :], (w[:, None] * g[None, :]).to(GYS.dtype.element_ty), mask=m2)
        if HAS_GW:
            tl.store(GW + n * K + j, dot, mask=jk)


def _launch_args(H: int, k: int) -> dict:
    return dict(K=k, KP=triton.next_power_of_2(k), BH=min(1024, triton.next_power_of_2(H)), num_warps=NUM_WARPS)


def _combine_rows(ys: torch.Tensor, pos: torch.Tensor, w: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    N, k = pos.shape
    H = ys.shape[1]
    out = torch.empty(N, H, dtype=dtype, device=ys.device)
    if N:
        _combine_kernel[(N,)](ys, pos, w if w is not None else pos, out, H, HAS_W=w is not None, **_launch_args(H, k))
    return out


class _Dispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, pos):  # noqa: D401 - autograd API
        N, k = pos.shape
        H = x.shape[1]
        xs = x.new_empty(N * k, H)
        if N:
            _dispatch_kernel[(N,)](x, pos, xs, H, **_launch_args(H, k))
        ctx.save_for_backward(pos)
        return xs

    @staticmethod
    def backward(ctx, g):
        (pos,) = ctx.saved_tensors
        return _combine_rows(g.contiguous(), pos, None, g.dtype), None


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ys, pos, w):  # noqa: D401 - autograd API
        ctx.save_for_backward(ys, pos, w)
        return _combine_rows(ys, pos, w, ys.dtype)

    @staticmethod
    def backward(ctx, g):
        ys, pos, w = ctx.saved_tensors
        N, k = pos.shape
        H = ys.shape[1]
        g_ys = torch.empty_like(ys)
        need_w = ctx.needs_input_grad[2]
        g_w = torch.empty(N, k, dtype=torch.float32, device=ys.device) if need_w else None
        if N:
            _combine_backward_kernel[(N,)](
                g.contiguous(), ys, pos, w, g_ys, g_w if need_w else w, H, HAS_GW=need_w, **_launch_args(H, k)
            )
        return g_ys, None, (g_w.to(w.dtype) if need_w else None)


def sort_by_expert(flat: torch.Tensor, num_experts: int) -> torch.Tensor:
    """``order`` [M] int64: the stable sort of the expert ids ``flat`` [M] (values in [0, num_experts)).
    The ids are sorted as the narrowest integer that holds them (uint8 up to 256 experts, int16 up
    to 32768): a GPU radix sort makes one pass per key byte, so int64 ids cost 8 passes where one
    does (the sort was 11% of the 2.6B MoE shape's decode step, docs/benchmarks.md)."""
    if num_experts <= 256:
        flat = flat.to(torch.uint8)
    elif num_experts <= 32768:
        flat = flat.to(torch.int16)
    return torch.argsort(flat, stable=True)


def _fused(t: torch.Tensor) -> bool:
    """Whether the kernels run for tensor ``t`` (CUDA with Triton)."""
    return t.is_cuda and triton_available("cuda")


def dispatch(x: torch.Tensor, order: torch.Tensor, k: int, fused: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens' rows in expert order: x [N, H], order [N k] int64 (the stable sort of the
    flattened [N, k] expert ids) -> (xs [N k, H] in x's dtype with ``xs[i] = x[order[i] // k]``,
    pos [N, k] int64, the row of each (token, slot) pair in xs). Differentiable in x. ``fused``:
    the kernel where it runs (the block's ``model.fused_kernels``)."""
    pos = torch.empty_like(order)
    pos[order] = torch.arange(order.numel(), device=order.device)
    pos = pos.view(-1, k)
    if fused and _fused(x):
        return _Dispatch.apply(x.contiguous(), pos), pos
    return x[order // k], pos


def combine(ys: torch.Tensor, pos: torch.Tensor, weights: torch.Tensor, fused: bool = True) -> torch.Tensor:
    """Each token's k expert outputs weighted and summed: ys [N k, H] (rows in expert order, as
    :func:`dispatch` laid them out), pos [N, k] from :func:`dispatch`, weights [N, k] (any float
    dtype) -> [N, H] in ys's dtype. Differentiable in ys and weights. The fused kernel (``fused``,
    where it runs) multiplies and sums in fp32 and rounds once; the PyTorch path multiplies in
    ys's dtype."""
    if fused and _fused(ys):
        return _Combine.apply(ys.contiguous(), pos, weights.contiguous())
    N, k = pos.shape
    out = ys[pos.reshape(-1)].view(N, k, ys.shape[-1])
    return (out * weights.to(out.dtype).unsqueeze(-1)).sum(1)
