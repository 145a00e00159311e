"""Fused inference kernels (Triton, CUDA) for the rollout engine's copy of the model.

A decode step at a few hundred sequences is a chain of small kernels; RMSNorm (seven elementwise
and reduction kernels in eager PyTorch) and RoPE (ten for q and k) each become one here. They
compute in fp32 and round once, where eager PyTorch rounds after each bf16 op, so bf16 results
differ from the eager path in the last bit (fp32: ~1e-7). Only the engine turns them on
(:meth:`reinforge.models.transformer.CausalLM.use_fused_kernels`); the trainer's forward and
backward stay on eager PyTorch.
"""

from __future__ import annotations

import torch

from ..utils.triton import tl, triton


if triton is not None:

    @triton.jit
    def _rms_norm_kernel(X, W, Y, N, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        ok = cols < N
        x = tl.load(X + row * N + cols, mask=ok, other=0.0).to(tl.float32)
        r = tl.rsqrt(tl.sum(x * x, 0) / N + eps)
        y = (x * r).to(X.dtype.element_ty).to(tl.float32)  # eager: x.to(dtype) before the weight
        w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(Y + row * N + cols, (w * y).to(Y.dtype.element_ty), mask=ok)

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


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)`` over the last dim in one kernel.

    Args:
        x: [..., N] on CUDA; weight: [N].

    Returns:
        [..., N] in the promoted dtype of ``weight`` and ``x`` (as eager PyTorch).
    """
    x = x.contiguous()
    N = x.shape[-1]
    y = torch.empty(x.shape, dtype=torch.result_type(weight, x), device=x.device)
    _rms_norm_kernel[(x.numel() // N,)](x, weight, y, N, eps, BLOCK=triton.next_power_of_2(N))
    return y


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding ``x * cos + rotate_half(x) * sin`` (Su et al. 2021) in one kernel.

    Args:
        x: [B, T, heads, D] on CUDA, D even and D / 2 a power of two.
        cos, sin: [B, T, D].

    Returns:
        [B, T, heads, D] in ``x``'s dtype.
    """
    x = x.contiguous()
    B, T, H, D = x.shape
    cos, sin = cos.contiguous(), sin.contiguous()
    y = torch.empty_like(x)
    _rope_kernel[(B * T, H)](x, cos, sin, y, x.stride(1), x.stride(2), cos.stride(1), HALF=D // 2)
    return y
