"""Token log-probs and entropy from logits as two Triton kernels (CUDA): one read of the logits
forward, one read and one write backward.

The chunked PyTorch path (:mod:`reinforge.algo.logprobs`) makes about five passes over an fp32
copy of each chunk forward (the cast, the temperature, ``logsumexp``'s max / exp / sum) and eight
backward; for a 152k vocabulary and 16k tokens each pass moves ~10 GB. Here each row of ``[N, V]``
logits (any float dtype, math in fp32) is streamed once by one program:

* forward: the online softmax normaliser (Milakov & Gimelshein 2018, "Online normalizer
  calculation for softmax"): a running max ``m`` and sum ``s = sum exp(z - m)``, with
  ``t = sum exp(z - m) z`` beside it for the entropy; then ``lse = m + log s``,
  ``log p(target) = z_target - lse`` and ``H = lse - t / s``, where ``z = logits / T``;
* backward: ``d lp / dz = onehot(target) - p`` and ``d H / dz = -p (log p + H)``, with
  ``p = exp(z - lse)``, times the incoming gradients, divided by ``T``, stored in the logits'
  dtype (what the chunked path computes, element for element).

An out-of-range target reads nothing and yields a NaN log-prob (no out-of-bounds read).
"""

from __future__ import annotations

import torch

from ..utils.triton import tl, triton

BLOCK = 4096  # vocabulary entries per loop iteration of a row's program
NUM_WARPS = 8

if triton is not None:

    @triton.jit
    def _forward_kernel(X, TGT, LP, LSE, ENT, V, stride, temperature, BLOCK: tl.constexpr, ENTROPY: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        x_row = X + row * stride
        cols = tl.arange(0, BLOCK)
        m = float("-inf")
        s = 0.0
        t = 0.0
        for start in range(0, V, BLOCK):
            ok = start + cols < V
            z = tl.load(x_row + start + cols, mask=ok, other=float("-inf")).to(tl.float32) / temperature
            m_new = tl.maximum(m, tl.max(z, 0))
            alpha = tl.exp(m - m_new)
            e = tl.exp(z - m_new)
            s = s * alpha + tl.sum(e, 0)
            if ENTROPY:
                t = t * alpha + tl.sum(tl.where(ok, e * z, 0.0), 0)
            m = m_new
        lse = m + tl.log(s)
        tgt = tl.load(TGT + row)
        valid = (tgt >= 0) & (tgt < V)
        zt = tl.load(x_row + tgt, mask=valid, other=float("nan")).to(tl.float32) / temperature
        tl.store(LP + row, zt - lse)
        tl.store(LSE + row, lse)
        if ENTROPY:
            tl.store(ENT + row, lse - t / s)

    @triton.jit
    def _backward_kernel(
        X,
        TGT,
        LSE,
        ENT,
        G_LP,
        G_ENT,
        GX,
        V,
        stride,
        g_stride,
        temperature,
        BLOCK: tl.constexpr,
        HAS_LP: tl.constexpr,
        HAS_ENT: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        x_row = X + row * stride
        gx_row = GX + row * g_stride
        cols = tl.arange(0, BLOCK)
        lse = tl.load(LSE + row)
        tgt = tl.load(TGT + row)
        g = 0.0
        if HAS_LP:
            g = tl.load(G_LP + row)
        ge = 0.0
        h = 0.0
        if HAS_ENT:
            ge = tl.load(G_ENT + row)
            h = tl.load(ENT + row)
        for start in range(0, V, BLOCK):
            idx = start + cols
            ok = idx < V
            logp = tl.load(x_row + idx, mask=ok, other=0.0).to(tl.float32) / temperature - lse
            p = tl.exp(logp)
            gz = tl.where(idx == tgt, g, 0.0) - p * g
            if HAS_ENT:
                gz -= ge * p * (logp + h)
            tl.store(gx_row + idx, (gz / temperature).to(GX.dtype.element_ty), mask=ok)


class _FusedTokenLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, temperature, with_entropy):  # noqa: D401 - autograd API
        logits = logits if logits.stride(-1) == 1 else logits.contiguous()
        n, v = logits.shape
        lp = torch.empty(n, dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(lp)
        ent = torch.empty_like(lp) if with_entropy else lp.new_zeros(0)
        if n:
            _forward_kernel[(n,)](
                logits,
                targets,
                lp,
                lse,
                ent,
                v,
                logits.stride(0),
                temperature,
                BLOCK,
                with_entropy,
                num_warps=NUM_WARPS,
            )
        ctx.save_for_backward(logits, targets, lse, ent)
        ctx.temperature, ctx.with_entropy = temperature, with_entropy
        ctx.set_materialize_grads(False)  # an output the loss does not use gets None: no work for it
        return lp, ent

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        logits, targets, lse, ent = ctx.saved_tensors
        use_ent = ctx.with_entropy and g_ent is not None
        if g_lp is None and not use_ent:
            return None, None, None, None
        grad = torch.empty_like(logits)
        n, v = logits.shape
        if n:
            _backward_kernel[(n,)](
                logits,
                targets,
                lse,
                ent,
                g_lp.contiguous() if g_lp is not None else lse,
                g_ent.contiguous() if use_ent else lse,
                grad,
                v,
                logits.stride(0),
                grad.stride(0),
                ctx.temperature,
                BLOCK,
                g_lp is not None,
                use_ent,
                num_warps=NUM_WARPS,
            )
        return grad, None, None, None


def fused_token_log_probs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs [N] fp32 of ``targets`` [N] int64 under ``softmax(logits / temperature)`` and the
    entropy [N] fp32 (an empty tensor unless ``with_entropy``), for ``logits`` [N, V] on CUDA in any
    float dtype; differentiable in ``logits``. Callers go through
    :func:`reinforge.algo.logprobs.token_log_probs`, which checks the arguments."""
    return _FusedTokenLogProbs.apply(logits, targets.contiguous(), float(temperature), bool(with_entropy))
