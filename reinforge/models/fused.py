"""Fused Triton kernels (CUDA) for RMSNorm, RoPE and SiLU-and-multiply.

A decoder layer in eager PyTorch is a chain of small kernels: RMSNorm is seven elementwise and
reduction kernels forward (and more backward), RoPE ten for q and k, SiLU-and-multiply two; at the
sizes of RL post-training (a 135M-1.5B model, micro-batches of ~16k tokens, or a decode step of a
few hundred sequences) the step is bound by kernel launches, not by FLOPs.

Two sources, one function per operation:

* **without gradients** (the rollout engine, captured in CUDA graphs; the trainer's no-grad
  log-prob passes): reinforge's forward kernels below, including the inference-only ones that
  have no equivalent elsewhere (the residual add inside the next norm, RoPE in place on a fused
  q/k/v output, SiLU-and-multiply on a packed gate/up output);
* **with gradients** (the trainer, ``model.fused_kernels``): Liger-Kernel's autograd functions
  (``liger-kernel`` on PyPI, used by verl, TRL and OpenRLHF). Measured on an H100 against the
  backward kernels this module had (docs/benchmarks.md, "Liger-Kernel against our training
  kernels"), Liger's were within 4-7% on a 1.5B model's micro-batch, so the project uses them and
  keeps no copy of its own, except the RMSNorm of hidden sizes up to ``RMS_BWD_MAX_HIDDEN``
  (:class:`_RMSNormFunction`): Liger's backward walks whole rows with one program per SM, 8-10% of the
  bandwidth limit at SmolLM2's 576, where ours over tiles of rows is 1.8-2.9x faster.

Precision: every kernel computes in fp32 and rounds once on store, where eager PyTorch under bf16
rounds after each bf16 op; bf16 results differ from the eager path in the last bits, fp32 results
by ~1e-7 (``tests/unit/test_fused.py``).

Turned on per model by :meth:`reinforge.models.transformer.CausalLM.set_variant`.
"""

from __future__ import annotations

import functools

import torch

from ..utils.triton import num_sms, tl, triton

if triton is not None:

    @triton.jit
    def _rms_norm_kernel(
        X,
        RES,
        W,
        Y,
        RSTD,
        N,
        eps,
        BLOCK: tl.constexpr,
        STORE_RSTD: tl.constexpr,
        ADD_RESIDUAL: tl.constexpr,
        OFFSET: tl.constexpr = 0.0,
    ):
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
        w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
        if OFFSET != 0.0:  # the zero-centred norm: x * r * (offset + w) in fp32, one rounding (Qwen3-Next, Gemma)
            tl.store(Y + row * N + cols, ((x * r) * (OFFSET + w)).to(Y.dtype.element_ty), mask=ok)
        else:
            y = (x * r).to(RES.dtype.element_ty).to(tl.float32)  # eager: x.to(dtype) before the weight
            tl.store(Y + row * N + cols, (w * y).to(Y.dtype.element_ty), mask=ok)

    @triton.jit
    def _rms_norm_bwd_kernel(
        DY, X, W, RSTD, DX, DW, M, N, BLOCK: tl.constexpr, ROWS: tl.constexpr, PROGRAMS: tl.constexpr
    ):
        # program p: row blocks p, p + PROGRAMS, ... of ROWS rows each (none past M: a zero part); its part of
        # dW (fp32) to DW[p]. PROGRAMS is fixed per device, so no micro-batch size compiles the kernel again.
        p = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        ok = cols < N
        w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
        dw = tl.zeros([BLOCK], tl.float32)
        for start in range(p * ROWS, M, PROGRAMS * ROWS):
            rows = start + tl.arange(0, ROWS)
            live = rows < M
            at = rows.to(tl.int64)[:, None] * N + cols[None, :]
            mask = live[:, None] & ok[None, :]
            dy = tl.load(DY + at, mask=mask, other=0.0).to(tl.float32)
            x = tl.load(X + at, mask=mask, other=0.0).to(tl.float32)
            r = tl.load(RSTD + rows, mask=live, other=0.0)[:, None]
            m = dy * w[None, :]
            dx = r * m - r * (r * r / N) * tl.sum(m * x, 1)[:, None] * x
            tl.store(DX + at, dx.to(DX.dtype.element_ty), mask=mask)
            dw += tl.sum(dy * (x * r).to(X.dtype.element_ty).to(tl.float32), 0)  # the forward's rounding
        tl.store(DW + p.to(tl.int64) * N + cols, dw, mask=ok)

    @triton.jit
    def _rope_kernel(X, COS, SIN, Y, s_xt, s_xh, s_ct, HALF: tl.constexpr):
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


_SILU_BLOCK = 1024


def _needs_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


@functools.cache
def _liger():
    """``liger_kernel.ops``: the training kernels (forward and backward).

    Raises:
        ImportError: Liger-Kernel is not installed; names the fix.
    """
    try:
        from liger_kernel import ops
    except ImportError as e:
        raise ImportError(
            "model.fused_kernels trains with Liger-Kernel's kernels: `pip install liger-kernel` "
            "(or set model.fused_kernels=false)"
        ) from e
    return ops


# ---------------------------------------------------------------------------------------- RMSNorm
def _rms_norm_fwd(
    x2: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    dtype: torch.dtype,
    residual: torch.Tensor | None = None,
    rstd: torch.Tensor | None = None,
    offset: float = 0.0,
) -> torch.Tensor:
    """The norm of the rows of ``x2`` [M, N], or with ``residual`` of ``residual += x2`` (in place); with
    ``rstd`` ([M] fp32) each row's 1 / rms is stored there (for the backward); ``offset`` (inference): the
    zero-centred form, ``x * rsqrt(...) * (offset + weight)`` in fp32."""
    M, N = x2.shape
    y = torch.empty((M, N), dtype=dtype, device=x2.device)
    _rms_norm_kernel[(M,)](
        x2,
        x2 if residual is None else residual,
        weight,
        y,
        y if rstd is None else rstd,
        N,
        eps,
        BLOCK=triton.next_power_of_2(N),
        STORE_RSTD=rstd is not None,
        ADD_RESIDUAL=residual is not None,
        OFFSET=float(offset),
    )
    return y


_RMS_BWD_ROWS = 4  # rows per iteration of a backward program: a [4, BLOCK] tile
# widest hidden size trained with _RMSNormFunction; wider ones run Liger's (H200, fwd + bwd, 65,536 x 576:
# 0.46 against 0.82 ms; 16,384 x 1,536: 0.26 against 0.77; 16,384 x 4,096: 2.16 against 0.65, where a
# [4, 4096] tile spills registers; bench/rms_norm_train.py, docs/benchmarks.md)
RMS_BWD_MAX_HIDDEN = 2048


class _RMSNormFunction(torch.autograd.Function):
    """:func:`rms_norm` with gradients: the forward kernel (keeping each row's 1 / rms), and a backward
    kernel over tiles of rows with a few programs per SM, each summing its rows' part of dW in fp32.
    The arithmetic of Liger-Kernel's ``LigerRMSNormFunction`` in its ``llama`` casting mode, whose
    backward runs one program per SM over whole rows one at a time (65,536 x 576: 8% of the bandwidth
    limit on an H200; ``bench/rms_norm_train.py``). The output is stored in ``dtype`` (the gradient
    arrives in it); dX has x's dtype, dW the weight's."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float, dtype: torch.dtype) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        rstd = torch.empty(x2.shape[0], dtype=torch.float32, device=x.device)
        y = _rms_norm_fwd(x2, weight, eps, dtype, rstd=rstd)
        ctx.save_for_backward(x2, weight, rstd)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x2, weight, rstd = ctx.saved_tensors
        M, N = x2.shape
        dy2 = dy.reshape(M, N).contiguous()
        dx = torch.empty_like(x2)
        programs = 4 * num_sms(x2.device)
        dw = torch.empty(programs, N, dtype=torch.float32, device=x2.device)
        _rms_norm_bwd_kernel[(programs,)](
            dy2, x2, weight, rstd, dx, dw, M, N, BLOCK=triton.next_power_of_2(N), ROWS=_RMS_BWD_ROWS, PROGRAMS=programs
        )
        return dx.view(dy.shape), dw.sum(0).to(weight.dtype), None, None


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, dtype: torch.dtype | None = None, offset: float = 0.0
) -> torch.Tensor:
    """``weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)`` over the last dim (Zhang & Sennrich
    2019, computed in fp32 as Llama does) in one kernel; differentiable in ``x`` and ``weight``.
    ``offset`` (inference only): the zero-centred norm of Qwen3-Next / Qwen3.5 / Gemma,
    ``x * rsqrt(mean(x^2) + eps) * (offset + weight)`` all in fp32 and rounded once (their transformers code).

    Without gradients: one kernel (the engine captures it in CUDA graphs). With gradients:
    :class:`_RMSNormFunction` up to ``RMS_BWD_MAX_HIDDEN`` (Liger-Kernel's arithmetic in its ``llama``
    casting mode, with a faster backward kernel at these widths), Liger's ``LigerRMSNormFunction``
    above, then one cast to ``dtype``.

    Under autocast the trainer passes the autocast dtype, so the norm's output is rounded once, as
    the next matmul would round it: the values are those of an fp32 output that autocast casts, but
    the q, k and v (or gate and up) projections share one bf16 tensor instead of each casting the fp32
    one, and backward has no casts of their gradients (measured: ``docs/benchmarks.md``, "the trainer's
    casts"). Their gradients are then summed in ``dtype``, as in Megatron's bf16 layers.

    Args:
        x: [..., N] on CUDA; weight: [N].
        eps: added to the mean square.
        dtype: the output dtype (default: without gradients the promoted dtype of ``weight`` and ``x``,
            as eager PyTorch; with gradients ``x``'s dtype, as Liger's ``llama`` mode).

    Returns:
        [..., N].

    Raises:
        ImportError: gradients are needed for N > ``RMS_BWD_MAX_HIDDEN`` and Liger-Kernel is not installed.
        RuntimeError: gradients are needed with an ``offset`` (no backward kernel for it: the trainer runs it
            eagerly).
    """
    if _needs_grad(x, weight):
        if offset:
            raise RuntimeError("rms_norm with an offset is inference-only: call it under torch.no_grad()")
        if x.shape[-1] <= RMS_BWD_MAX_HIDDEN:
            return _RMSNormFunction.apply(x, weight, eps, dtype or x.dtype)
        y = _liger().LigerRMSNormFunction.apply(x, weight, eps, 0.0, "llama", False)
        return y if dtype is None else y.to(dtype)
    dtype = dtype or torch.result_type(weight, x)
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    return _rms_norm_fwd(x2, weight, eps, dtype, offset=offset).view(x.shape)


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    dtype: torch.dtype | None = None,
    offset: float = 0.0,
) -> torch.Tensor:
    """``residual += x`` in place, then :func:`rms_norm` of the new ``residual`` (``offset``: its zero-centred
    form): a decoder layer's residual add and the next norm in one kernel (vLLM's ``fused_add_rms_norm``).
    Inference only.

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
        raise ValueError(
            f"add_rms_norm: residual {tuple(residual.shape)} must be contiguous and of x's shape {tuple(x.shape)}"
        )
    dtype = dtype or torch.result_type(weight, residual)
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    return _rms_norm_fwd(x2, weight, eps, dtype, residual=residual, offset=offset).view(x.shape)


# ------------------------------------------------------------------------------------------- RoPE
def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    B, T, H, D = x.shape
    cos, sin = cos.contiguous(), sin.contiguous()
    y = torch.empty_like(x)
    _rope_kernel[(B * T, H)](x, cos, sin, y, x.stride(1), x.stride(2), cos.stride(1), HALF=D // 2)
    return y


def rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int) -> torch.Tensor:
    """:func:`rope_qk` in place on heads ``[0, heads)`` of ``x`` [B, T, all heads, D] (contiguous): the
    query and key heads of a fused q/k/v projection's output, in one kernel. Inference only.
    Returns ``x``."""
    if not x.is_contiguous() or heads > x.shape[2]:
        raise ValueError(f"rope_: x {tuple(x.shape)} must be contiguous with at least {heads} heads")
    B, T, _, D = x.shape
    cos, sin = cos.contiguous(), sin.contiguous()
    _rope_kernel[(B * T, heads)](x, cos, sin, x, x.stride(1), x.stride(2), cos.stride(1), HALF=D // 2)
    return x


def rope_qk(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding ``x * cos + rotate_half(x) * sin`` (Su et al. 2021) of the queries and keys;
    differentiable in both (the tables are constants).

    Without gradients: reinforge's kernel, one per tensor. With gradients: Liger-Kernel's
    ``LigerRopeFunction`` (both in one kernel, written into their storage: q and k must not be
    needed elsewhere, which holds for the projection outputs the attention passes).

    Args:
        q: [B, T, H, D], k: [B, T, KVH, D] on CUDA, D even and D / 2 a power of two.
        cos, sin: [B, T, D] (no gradient), each the concatenation of two equal halves as RoPE tables
            are (:func:`~reinforge.models.transformer.rope_tables`; Liger reads the first half).

    Returns:
        (q, k) rotated, in their dtypes.

    Raises:
        ImportError: gradients are needed and Liger-Kernel is not installed.
    """
    if _needs_grad(q, k):
        q, k = _liger().LigerRopeFunction.apply(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        return q.transpose(1, 2), k.transpose(1, 2)
    return _rope(q, cos, sin), _rope(k, cos, sin)


# ------------------------------------------------------------------------------ SiLU-and-multiply
def _silu_mul(g: torch.Tensor, u: torch.Tensor, row_stride: int | None = None) -> torch.Tensor:
    """``silu(g) * u`` into a new contiguous tensor of g's shape; rows of g and u ``row_stride``
    elements apart (default: contiguous)."""
    y = torch.empty(g.shape, dtype=g.dtype, device=g.device)
    n, I = y.numel(), g.shape[-1]
    _silu_mul_kernel[(triton.cdiv(n, _SILU_BLOCK),)](g, u, y, n, I, row_stride or I, BLOCK=_SILU_BLOCK)
    return y


def silu_mul(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """SwiGLU's ``silu(g) * u`` (Shazeer 2020) in one kernel; differentiable in both (with gradients:
    Liger-Kernel's ``LigerSiLUMulFunction``).

    Args:
        g, u: the gate and up projections, same shape and dtype, on CUDA.

    Returns:
        a tensor of their shape and dtype.

    Raises:
        ValueError: shapes or dtypes differ. ImportError: gradients are needed and Liger-Kernel
        is not installed.
    """
    if g.shape != u.shape or g.dtype != u.dtype:
        raise ValueError(f"silu_mul: gate {tuple(g.shape)} {g.dtype} and up {tuple(u.shape)} {u.dtype} differ")
    if _needs_grad(g, u):
        return _liger().LigerSiLUMulFunction.apply(g, u)
    return _silu_mul(g.contiguous(), u.contiguous())


def silu_mul_packed(gu: torch.Tensor) -> torch.Tensor:
    """``silu(g) * u`` where ``gu`` [..., 2I] holds ``[g | u]`` along its last dim (a fused gate/up
    projection's output), in one kernel without splitting it. With gradients: Liger-Kernel's
    ``LigerFusedGateUpSiLUMulFunction`` (its arithmetic is that of ``LigerSiLUMulFunction``, which
    :func:`silu_mul` uses), or with a Liger-Kernel that lacks it the two halves through :func:`silu_mul`.

    Returns:
        [..., I] in ``gu``'s dtype.

    Raises:
        ImportError: gradients are needed and Liger-Kernel is not installed.
    """
    if _needs_grad(gu):
        packed = getattr(_liger(), "LigerFusedGateUpSiLUMulFunction", None)
        if packed is None:
            g, u = gu.chunk(2, dim=-1)
            return silu_mul(g, u)
        rows = gu.reshape(-1, gu.shape[-1]).contiguous()  # (its backward returns the gradient as [rows, 2I])
        return packed.apply(rows, False).view(*gu.shape[:-1], gu.shape[-1] // 2)  # False: the gradient not in gu
    gu = gu.contiguous()
    g, u = gu.chunk(2, dim=-1)  # views: the kernel reads both halves of each row in place
    return _silu_mul(g, u, row_stride=gu.shape[-1])
