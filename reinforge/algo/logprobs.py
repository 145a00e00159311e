"""Token log-probs and entropy from logits, in chunks over the tokens, without an [N, V] fp32 copy.

A 152k-vocabulary model's logits for 16k tokens are 4.9 GB in bf16; ``log_softmax(logits.float())``
keeps a 9.7 GB fp32 copy for the backward pass and allocates two more on the way. Here the forward
pass keeps only the logits (in their own dtype) and one log-sum-exp per token, and the backward pass
recomputes the softmax chunk by chunk. Values equal ``log_softmax(logits.float() / T)`` gathered at
the targets (up to fp32 rounding), gradients equal autograd's through that expression.

On CUDA with Triton, :func:`token_log_probs` runs the same math as two fused kernels instead
(:mod:`reinforge.algo.fused_logprobs`: one read of the logits forward, one read and one write
backward; no fp32 chunk at all).
"""

from __future__ import annotations

import torch

from ..utils.triton import triton_available


def _chunk_stats(
    z: torch.Tensor, t: torch.Tensor, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    lse = torch.logsumexp(z, dim=-1)
    lp = z.gather(-1, t[:, None]).squeeze(-1) - lse
    ent = None
    if with_entropy:
        p = torch.softmax(z, dim=-1)
        ent = lse - (p * z).sum(-1)
    return lp, lse, ent


class _ChunkedTokenLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, temperature, chunk, with_entropy):  # noqa: D401 - autograd API
        n = logits.shape[0]
        lp = torch.empty(n, dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(lp)
        ent = torch.empty_like(lp) if with_entropy else lp.new_zeros(0)
        for s in range(0, n, chunk):
            z = logits[s : s + chunk].float() / temperature
            lp[s : s + chunk], lse[s : s + chunk], e = _chunk_stats(z, targets[s : s + chunk], with_entropy)
            if with_entropy:
                ent[s : s + chunk] = e
        ctx.save_for_backward(logits, targets, lse, ent)
        ctx.temperature, ctx.chunk, ctx.with_entropy = temperature, chunk, with_entropy
        ctx.set_materialize_grads(False)  # an output the loss does not use gets None: no work for it
        return lp, ent

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        logits, targets, lse, ent = ctx.saved_tensors
        T, chunk = ctx.temperature, ctx.chunk
        use_ent = ctx.with_entropy and g_ent is not None
        if g_lp is None and not use_ent:
            return None, None, None, None, None
        grad = torch.empty_like(logits)
        for s in range(0, logits.shape[0], chunk):
            logp = logits[s : s + chunk].float() / T - lse[s : s + chunk, None]
            p = logp.exp()
            if g_lp is not None:
                g = g_lp[s : s + chunk, None]
                gz = -p * g  # d lp / dz = onehot(target) - p
                gz.scatter_add_(-1, targets[s : s + chunk, None], g)
            else:
                gz = torch.zeros_like(p)
            if use_ent:  # d H / dz = -p (log p + H)
                gz -= g_ent[s : s + chunk, None] * p * (logp + ent[s : s + chunk, None])
            grad[s : s + chunk] = (gz / T).to(logits.dtype)
        return grad, None, None, None, None


def token_log_probs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    chunk: int = 2048,
    with_entropy: bool = False,
    fused: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of ``targets`` under ``softmax(logits / temperature)`` and, optionally, the entropy
    of that distribution: by the fused Triton kernels (CUDA, ``fused``), else ``chunk`` tokens at a
    time in PyTorch.

    Args:
        logits: [N, V], any float dtype (bf16 logits stay bf16 in memory; math is fp32).
        targets: [N] int64 token ids.
        temperature: the sampling temperature (> 0).
        chunk: tokens per chunk of the PyTorch path (peak extra memory ~ 3 x chunk x V x 4 bytes);
            the fused kernels need none.
        with_entropy: also return the entropy [N] (differentiable).
        fused: use the kernels where they run (the trainer passes ``model.fused_kernels``).
    Returns:
        (log-probs [N] fp32, entropy [N] fp32 or ``None``). Differentiable in ``logits``.
    Raises:
        ValueError: ``chunk < 1`` or ``temperature <= 0``.
    """
    if chunk < 1 or temperature <= 0:
        raise ValueError(f"chunk must be >= 1 and temperature > 0, got {chunk}, {temperature}")
    if fused and logits.is_cuda and triton_available("cuda"):
        from .fused_logprobs import fused_token_log_probs

        lp, ent = fused_token_log_probs(logits, targets, temperature, with_entropy)
        return lp, (ent if with_entropy else None)
    lp, ent = _ChunkedTokenLogProbs.apply(logits, targets, float(temperature), int(chunk), bool(with_entropy))
    return lp, (ent if with_entropy else None)
