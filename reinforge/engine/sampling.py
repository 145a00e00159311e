"""Token sampling on the device, with no host round trip per token."""

from __future__ import annotations

import torch

from ..utils.triton import tl, triton


def sample_tokens(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row and return its log-prob.

    Args:
        logits: [B, V] fp32.
        temperature: [B] fp32; rows with temperature <= 0 are decoded greedily.
        top_k: [B] int64, <= 0 disables (None: no row filters).
        top_p: [B] fp32, >= 1 disables (None: no row filters).
        generator: source of randomness (reproducible runs).

    Returns:
        tokens [B] int64 and log-probs [B] fp32 of those tokens under
        ``log_softmax(logits / T)`` (T = 1 for greedy rows), i.e. the distribution the
        trainer scores the same tokens with. Filters (top-k / top-p) shape what is sampled,
        not the reported log-prob, as in vLLM's default ``logprobs`` mode.

    Draws are exact: :func:`exponential_race` on accelerators (no host sync; Gumbel-max in
    another form), :func:`inverse_cdf` on a CPU (one random number per row).
    """
    greedy = temperature <= 0
    temp = torch.where(greedy, torch.ones_like(temperature), temperature)
    scaled = logits / temp[:, None]
    log_probs = torch.log_softmax(scaled, dim=-1)
    probs = log_probs.exp()
    if top_k is not None or top_p is not None:
        probs = _filter(probs, top_k, top_p)
    draw = inverse_cdf if probs.device.type == "cpu" else exponential_race
    sampled = draw(probs, generator)
    tokens = torch.where(greedy, logits.argmax(dim=-1), sampled)
    return tokens, log_probs.gather(-1, tokens[:, None]).squeeze(-1)


def exponential_race(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One index per row of ``probs`` [B, V] (rows need not be normalised), drawn exactly from it:
    argmax of p_i / E_i with E_i ~ Exp(1). No host sync (CUDA-graph friendly); V random numbers per row.

    E = -log(U), U ~ U[0, 1): U = 0 gives E = inf (that token cannot win), which has probability
    ~2^-24 per entry and biases nothing.
    """
    noise = torch.rand(probs.shape, generator=generator, device=probs.device).log_().neg_()
    return (probs / noise).argmax(dim=-1)


def inverse_cdf(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One index per row of ``probs`` [B, V] (rows need not be normalised), drawn exactly from it:
    the first index whose cumulative probability exceeds U * total, U ~ U[0, 1). One random
    number per row: on a CPU the race's V random numbers cost more than the rest of sampling."""
    cdf = probs.cumsum(dim=-1)
    u = torch.rand(probs.shape[0], 1, generator=generator, device=probs.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def _filter(probs: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """Zero the probabilities outside each row's top-k and top-p nucleus (Holtzman et al. 2020)."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    keep = torch.ones_like(sorted_p, dtype=torch.bool)
    rank = torch.arange(probs.shape[-1], device=probs.device)[None, :]
    if top_k is not None:
        k = torch.where(top_k > 0, top_k, probs.shape[-1])
        keep &= rank < k[:, None]
    if top_p is not None:
        # keep the smallest prefix whose mass reaches top_p (the token crossing it is kept)
        before = sorted_p.cumsum(-1) - sorted_p
        keep &= before < top_p[:, None]
    keep[:, 0] = True
    filtered = torch.zeros_like(probs).scatter_(-1, order, sorted_p * keep)
    return filtered


if triton is not None:

    @triton.jit
    def _inverse_cdf_kernel(LOGITS, TEMP, SEED, TOK, LP, V, s_row, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        t = tl.load(TEMP + row)
        greedy = t <= 0
        inv_t = 1.0 / tl.where(greedy, 1.0, t)
        base = LOGITS + row.to(tl.int64) * s_row
        # pass 1: max, sum of exp (online) and argmax
        m = -float("inf")
        total = 0.0
        best = -float("inf")
        best_i = 0
        for start in range(0, V, BLOCK):
            idx = start + tl.arange(0, BLOCK)
            x = tl.load(base + idx, mask=idx < V, other=-float("inf")).to(tl.float32) * inv_t
            c = tl.max(x, 0)
            m_new = tl.maximum(m, c)
            total = total * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), 0)
            m = m_new
            c_i = tl.argmax(x, 0) + start
            take = c > best
            best_i = tl.where(take, c_i, best_i)
            best = tl.where(take, c, best)
        # pass 2: the first index whose cumulative mass exceeds u * total (one uniform per row)
        target = tl.rand(tl.load(SEED), row) * total
        acc = 0.0
        chosen = -1
        last = 0  # the last token of positive mass: the draw if rounding leaves target above the sum
        for start in range(0, V, BLOCK):
            idx = start + tl.arange(0, BLOCK)
            x = tl.load(base + idx, mask=idx < V, other=-float("inf")).to(tl.float32) * inv_t
            e = tl.exp(x - m)
            s = tl.sum(e, 0)
            if (chosen < 0) & (acc + s > target):
                chosen = tl.min(tl.where(tl.cumsum(e, 0) + acc > target, idx, V), 0)
            last = tl.maximum(last, tl.max(tl.where(e > 0, idx, 0), 0))
            acc += s
        tok = tl.where(greedy, best_i, tl.where(chosen < 0, last, chosen))
        x_tok = tl.load(base + tok).to(tl.float32) * inv_t
        tl.store(TOK + row, tok.to(tl.int64))
        tl.store(LP + row, x_tok - m - tl.log(total))


def sample_tokens_fused(
    logits: torch.Tensor, temperature: torch.Tensor, seed: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sample_tokens` without top-k / top-p in one Triton program per row (CUDA).

    Two passes over the row in the logits' own dtype (no fp32 copy): the first computes the
    maximum, the log-sum-exp (online, Milakov & Gimelshein 2018) and the argmax; the second
    draws by inverse CDF, the first index whose running sum of ``exp(x / T - max)`` exceeds
    ``U * total`` with one uniform ``U`` per row (exact sampling from ``softmax(logits / T)`` up to
    fp32 summation). Per element that is two exps and no random numbers or logs: 2.2x faster
    than the Gumbel-max kernel it replaced at [1024, 151936] (0.44 vs 0.97 ms on an H100,
    bench/sampler.py), where the unfused path makes about ten passes over an fp32 copy. ``U``
    comes from Philox keyed by ``seed``, a device scalar the caller advances between steps (so a
    CUDA graph replays fresh draws), with the row as the counter.

    Args:
        logits: [B, V] bf16/fp16/fp32, rows contiguous.
        temperature: [B] fp32; rows <= 0 are greedy (argmax, log-prob at T = 1).
        seed: [1] int64 on the same device.

    Returns:
        tokens [B] int64 and their log-probs [B] fp32 under ``log_softmax(logits / T)``.
    """
    B, V = logits.shape
    tokens = torch.empty(B, dtype=torch.long, device=logits.device)
    log_probs = torch.empty(B, dtype=torch.float32, device=logits.device)
    _inverse_cdf_kernel[(B,)](
        logits, temperature, seed, tokens, log_probs, V, logits.stride(0), BLOCK=2048, num_warps=8
    )
    return tokens, log_probs
