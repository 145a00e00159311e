"""Fused Triton kernels (CUDA) for RMSNorm, RoPE and SiLU-and-multiply, with backward passes.

A decoder layer in eager PyTorch is a chain of small kernels: RMSNorm is seven elementwise and
reduction kernels forward (and more backward), RoPE ten for q and k, SiLU-and-multiply two; at the
sizes of RL post-training (a 135M-1.5B model, micro-batches of ~16k tokens, or a decode step of a
few hundred sequences) the step is bound by kernel launches, not by FLOPs. Here each is one kernel
forward and one backward (plus a column sum for the norm's weight gradient).

Precision: every kernel computes in fp32 and rounds once on store, where eager PyTorch under bf16
rounds after each bf16 op; bf16 results differ from the eager path in the last bits, fp32 results
by ~1e-7. Gradients follow the eager formulas (a cast's gradient passes straight through).

Turned on per model by :meth:`reinforge.models.transformer.CausalLM.use_fused_kernels` (the
rollout engine's copy always on CUDA; the trainer's with ``model.fused_kernels``). Without
gradients the functions call the kernels directly (the engine captures them in CUDA graphs); with
gradients they go through ``torch.autograd.Function``.
"""

from __future__ import annotations

import functools

import torch

from ..utils.triton import tl, triton


if triton is not None:

    @triton.jit
    def _rms_norm_kernel(X, RES, W, Y, RSTD, N, eps, BLOCK: tl.constexpr, STORE_RSTD: tl.constexpr,
                         ADD_RESIDUAL: tl.constexpr):
        # normalises the rows of RES: X itself, or with ADD_RESIDUAL the residual stream RES += X
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        ok = cols < N
        x = tl.load(X + row * N + cols, mask=ok, other=0.0).to(tl.float32)
        if ADD_RESIDUAL:  # rounded to RES's dtype, as eager's add
            x = (x + tl.load(RES + row * N + cols, mask=ok, other=0.0).to(tl.float32)).to(RES.dtype.element_ty)
            tl.store(RES + row * N + cols, x, mask=ok)
            x = x.to(tl.float32)
        r = tl.rsqrt(tl.sum(x * x, 0) / N + eps)
        if STORE_RSTD:
            tl.store(RSTD + row, r)
        y = (x * r).to(RES.dtype.element_ty).to(tl.float32)  # eager: x.to(dtype) before the weight
        w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(Y + row * N + cols, (w * y).to(Y.dtype.element_ty), mask=ok)

    @triton.jit
    def _rms_norm_bwd_kernel(DY, X, W, RSTD, DX, DW, M, N, ROWS, BLOCK: tl.constexpr):
        # each program: ROWS consecutive rows (a runtime value: no recompile per micro-batch size); dx per
        # row, its partial weight gradient summed in DW[pid]
        pid = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        ok = cols < N
        w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
        dw = tl.zeros([BLOCK], dtype=tl.float32)
        for i in range(ROWS):
            row = pid * ROWS + i
            m = ok & (row + cols * 0 < M)  # (a block mask)
            x = tl.load(X + row * N + cols, mask=m, other=0.0).to(tl.float32)
            dy = tl.load(DY + row * N + cols, mask=m, other=0.0).to(tl.float32)
            r = tl.load(RSTD + tl.minimum(row, M - 1))  # rows past M: masked out below
            xh = x * r
            dw += dy * xh.to(X.dtype.element_ty).to(tl.float32)
            g = dy * w
            dx = r * (g - xh * (tl.sum(g * xh, 0) / N))
            tl.store(DX + row * N + cols, dx.to(DX.dtype.element_ty), mask=m)
        tl.store(DW + pid * N + cols, dw, mask=ok)

    @triton.jit
    def _rope_kernel(X, COS, SIN, Y, s_xt, s_xh, s_ct, HALF: tl.constexpr, BACKWARD: tl.constexpr):
        bt = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1)
        i = tl.arange(0, HALF)
        x = X + bt * s_xt + h * s_xh
        x1 = tl.load(x + i).to(tl.float32)
        x2 = tl.load(x + HALF + i).to(tl.float32)
        c = COS + bt * s_ct
        s = SIN + bt * s_ct
        c1, c2 = tl.load(c + i).to(tl.float32), tl.load(c + HALF + i).to(tl.float32)
        s1, s2 = tl.load(s + i).to(tl.float32), tl.load(s + HALF + i).to(tl.float32)
        y = Y + bt * s_xt + h * s_xh
        if BACKWARD:  # the transpose of [[c1, -s1], [s2, c2]]
            tl.store(y + i, (x1 * c1 + x2 * s2).to(Y.dtype.element_ty))
            tl.store(y + HALF + i, (x2 * c2 - x1 * s1).to(Y.dtype.element_ty))
        else:
            tl.store(y + i, (x1 * c1 - x2 * s1).to(Y.dtype.element_ty))
            tl.store(y + HALF + i, (x2 * c2 + x1 * s2).to(Y.dtype.element_ty))

    @triton.jit
    def _silu_mul_kernel(G, U, Y, n, I, S_ROW, BLOCK: tl.constexpr):
        # Y [M, I] contiguous; G and U rows S_ROW apart: two contiguous tensors (S_ROW = I), or the
        # halves of one packed [gate | up] matmul output (S_ROW = 2I)
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < n
        src = (offs // I) * S_ROW + offs % I
        g = tl.load(G + src, mask=ok, other=0.0).to(tl.float32)
        u = tl.load(U + src, mask=ok, other=0.0).to(tl.float32)
        tl.store(Y + offs, (g * tl.sigmoid(g) * u).to(Y.dtype.element_ty), mask=ok)

    @triton.jit
    def _silu_mul_bwd_kernel(DY, G, U, DG, DU, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < n
        dy = tl.load(DY + offs, mask=ok, other=0.0).to(tl.float32)
        g = tl.load(G + offs, mask=ok, other=0.0).to(tl.float32)
        u = tl.load(U + offs, mask=ok, other=0.0).to(tl.float32)
        sg = tl.sigmoid(g)
        tl.store(DU + offs, (dy * g * sg).to(DU.dtype.element_ty), mask=ok)
        tl.store(DG + offs, (dy * u * sg * (1.0 + g * (1.0 - sg))).to(DG.dtype.element_ty), mask=ok)


_SILU_BLOCK = 1024


@functools.lru_cache(maxsize=None)
def _programs(device_index: int | None) -> int:
    """Programs of the norm's backward: 4 per SM (CUDA), 8 elsewhere (the Triton interpreter)."""
    if device_index is None:
        return 8
    return 4 * torch.cuda.get_device_properties(device_index).multi_processor_count


def _needs_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


# ---------------------------------------------------------------------------------------- RMSNorm
def _rms_norm_fwd(x2: torch.Tensor, weight: torch.Tensor, eps: float, dtype: torch.dtype,
                  rstd: torch.Tensor | None = None, residual: torch.Tensor | None = None) -> torch.Tensor:
    """The norm of the rows of ``x2`` [M, N], or with ``residual`` of ``residual += x2`` (in place)."""
    M, N = x2.shape
    y = torch.empty((M, N), dtype=dtype, device=x2.device)
    _rms_norm_kernel[(M,)](x2, x2 if residual is None else residual, weight, y, y if rstd is None else rstd, N, eps,
                           BLOCK=triton.next_power_of_2(N), STORE_RSTD=rstd is not None,
                           ADD_RESIDUAL=residual is not None)
    return y


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, dtype):
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        rstd = torch.empty(x2.shape[0], dtype=torch.float32, device=x.device)
        y = _rms_norm_fwd(x2, weight, eps, dtype, rstd)
        ctx.save_for_backward(x2, weight, rstd)
        ctx.shape = x.shape
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, weight, rstd = ctx.saved_tensors
        M, N = x2.shape
        dy = dy.reshape(M, N).contiguous()
        dx = torch.empty_like(x2)
        programs = min(M, _programs(x2.device.index if x2.is_cuda else None))
        rows = triton.cdiv(M, programs)
        programs = triton.cdiv(M, rows)
        dw = torch.empty((programs, N), dtype=torch.float32, device=x2.device)
        _rms_norm_bwd_kernel[(programs,)](dy, x2, weight, rstd, dx, dw, M, N, ROWS=rows,
                                          BLOCK=triton.next_power_of_2(N))
        return dx.view(ctx.shape), dw.sum(0).to(weight.dtype), None, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)`` over the last dim (Zhang & Sennrich
    2019, computed in fp32 as Llama does) in one kernel; differentiable in ``x`` and ``weight``.

    Args:
        x: [..., N] on CUDA; weight: [N].
        eps: added to the mean square.
        dtype: the output dtype (default: the promoted dtype of ``weight`` and ``x``, as eager
            PyTorch; the trainer passes the autocast dtype, which the next matmul would cast to).

    Returns:
        [..., N] in ``dtype``.
    """
    dtype = dtype or torch.result_type(weight, x)
    if _needs_grad(x, weight):
        return _RMSNorm.apply(x, weight, eps, dtype)
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    return _rms_norm_fwd(x2, weight, eps, dtype).view(x.shape)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 dtype: torch.dtype | None = None) -> torch.Tensor:
    """``residual += x`` in place, then :func:`rms_norm` of the new ``residual``: a decoder layer's
    residual add and the next norm in one kernel (vLLM's ``fused_add_rms_norm``). Inference only.

    Args:
        x: [..., N], a sublayer's output, on CUDA.
        residual: the residual stream, x's shape, contiguous; updated in place. The sum is rounded
            to its dtype, as eager ``residual + x`` with ``residual`` of the wider dtype.
        weight: [N]; eps: added to the mean square.
        dtype: the output dtype (default: the promoted dtype of ``weight`` and ``residual``).

    Returns:
        [..., N] in ``dtype``: the normalised sum.

    Raises:
        RuntimeError: gradients are being recorded (the in-place add has no backward here).
    """
    if _needs_grad(x, residual, weight):
        raise RuntimeError("add_rms_norm is inference-only: call it under torch.no_grad()")
    if not residual.is_contiguous() or residual.shape != x.shape:
        raise ValueError(f"add_rms_norm: residual {tuple(residual.shape)} must be contiguous and of x's shape "
                         f"{tuple(x.shape)}")
    dtype = dtype or torch.result_type(weight, residual)
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    return _rms_norm_fwd(x2, weight, eps, dtype, residual=residual).view(x.shape)


# ------------------------------------------------------------------------------------------- RoPE
def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool) -> torch.Tensor:
    x = x.contiguous()
    B, T, H, D = x.shape
    cos, sin = cos.contiguous(), sin.contiguous()
    y = torch.empty_like(x)
    _rope_kernel[(B * T, H)](x, cos, sin, y, x.stride(1), x.stride(2), cos.stride(1), HALF=D // 2,
                             BACKWARD=backward)
    return y


def rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int) -> torch.Tensor:
    """:func:`rope` in place on heads ``[0, heads)`` of ``x`` [B, T, all heads, D] (contiguous): the
    query and key heads of a fused q/k/v projection's output, in one kernel. Inference only.
    Returns ``x``."""
    if not x.is_contiguous() or heads > x.shape[2]:
        raise ValueError(f"rope_: x {tuple(x.shape)} must be contiguous with at least {heads} heads")
    B, T, _, D = x.shape
    cos, sin = cos.contiguous(), sin.contiguous()
    _rope_kernel[(B * T, heads)](x, cos, sin, x, x.stride(1), x.stride(2), cos.stride(1), HALF=D // 2,
                                 BACKWARD=False)
    return x


class _RoPE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rope(x, cos, sin, False)

    @staticmethod
    def backward(ctx, dy):
        cos, sin = ctx.saved_tensors
        return _rope(dy, cos, sin, True), None, None


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding ``x * cos + rotate_half(x) * sin`` (Su et al. 2021) in one kernel;
    differentiable in ``x`` (the tables are constants).

    Args:
        x: [B, T, heads, D] on CUDA, D even and D / 2 a power of two.
        cos, sin: [B, T, D] (no gradient).

    Returns:
        [B, T, heads, D] in ``x``'s dtype (eager PyTorch would promote to the tables' dtype; the
        attention that follows casts to ``x``'s).
    """
    if _needs_grad(x):
        return _RoPE.apply(x, cos, sin)
    return _rope(x, cos, sin, False)


# ------------------------------------------------------------------------------ SiLU-and-multiply
def _silu_mul(g: torch.Tensor, u: torch.Tensor, row_stride: int | None = None) -> torch.Tensor:
    """``silu(g) * u`` into a new contiguous tensor of g's shape; rows of g and u ``row_stride``
    elements apart (default: contiguous)."""
    y = torch.empty(g.shape, dtype=g.dtype, device=g.device)
    n, I = y.numel(), g.shape[-1]
    _silu_mul_kernel[(triton.cdiv(n, _SILU_BLOCK),)](g, u, y, n, I, row_stride or I, BLOCK=_SILU_BLOCK)
    return y


class _SiLUMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, g, u):
        g, u = g.contiguous(), u.contiguous()
        ctx.save_for_backward(g, u)
        return _silu_mul(g, u)

    @staticmethod
    def backward(ctx, dy):
        g, u = ctx.saved_tensors
        dy = dy.contiguous()
        dg, du = torch.empty_like(g), torch.empty_like(u)
        n = g.numel()
        _silu_mul_bwd_kernel[(triton.cdiv(n, _SILU_BLOCK),)](dy, g, u, dg, du, n, BLOCK=_SILU_BLOCK)
        return dg, du


def silu_mul(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """SwiGLU's ``silu(g) * u`` (Shazeer 2020) in one kernel; differentiable in both.

    Args:
        g, u: the gate and up projections, same shape and dtype, on CUDA.

    Returns:
        a tensor of their shape and dtype.
    """
    if g.shape != u.shape or g.dtype != u.dtype:
        raise ValueError(f"silu_mul: gate {tuple(g.shape)} {g.dtype} and up {tuple(u.shape)} {u.dtype} differ")
    if _needs_grad(g, u):
        return _SiLUMul.apply(g, u)
    return _silu_mul(g.contiguous(), u.contiguous())


def silu_mul_packed(gu: torch.Tensor) -> torch.Tensor:
    """``silu(g) * u`` where ``gu`` [..., 2I] holds ``[g | u]`` along its last dim (a fused gate/up
    projection's output), in one kernel without splitting it. Inference only.

    Returns:
        [..., I] in ``gu``'s dtype.
    """
    gu = gu.contiguous()
    g, u = gu.chunk(2, dim=-1)  # views: the kernel reads both halves of each row in place
    return _silu_mul(g, u, row_stride=gu.shape[-1])
