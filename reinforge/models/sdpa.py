"""Scaled dot-product attention as every model path here calls it: :func:`sdpa` (grouped-query, a mask or
causal, a scale, attention sinks) and the causal / sliding-window masks (:func:`causal_mask`,
:func:`window_mask`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# SDPA's backends on a GPU: every one but cuDNN's, which builds an execution plan at each new shape
# (~45 ms of host time on an H200, torch 2.11: bench/prefill_sdpa.py) while the GPU idles, and the engine's
# prompt batches and `packing: none` micro-batches take a new width at almost every rollout
SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of q [B, T, H, D] over k, v [B, S, KVH, D] (H a multiple of KVH: grouped-query),
    causal when ``mask`` is None, else under ``mask`` ([T, S] or broadcastable to [B, H, T, S]; True:
    attend). Returns [B, T, H, D] in q's dtype. ``F.scaled_dot_product_attention`` without its cuDNN
    backend on a GPU (:data:`SDPA_BACKENDS`).

    ``scale``: the factor on q.k (None: ``D ** -0.5``); v may be narrower than q and k (multi-head latent
    attention's value heads). ``sinks``: [H] logits, one per query head, that
    join each softmax's denominator and attend to nothing (GPT-OSS's attention sinks: the weights of a
    row are ``exp(s_j) / (sum_j exp(s_j) + exp(sink_h))``). They run as one more key per row, visible
    to every query, of value 0 whose score is the head's sink: the queries get an extra dimension
    holding ``sink_h / scale`` and that key a 1 there, the other keys 0 (so SDPA's memory-efficient
    kernels and autograd, gradient to ``sinks`` included, apply unchanged; the extra dimensions are
    padded to 8 for the kernels' alignment).
    """
    if sinks is not None:
        return _sdpa_sinks(q, k, v, mask, scale, sinks)
    if not q.is_cuda:
        args = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        kw = dict(attn_mask=mask, is_causal=mask is None, enable_gqa=q.shape[2] != k.shape[2], scale=scale)
        return F.scaled_dot_product_attention(*args, **kw).transpose(1, 2)
    args, gqa = kernel_args(q, k, v, mask)
    with sdpa_kernel(SDPA_BACKENDS):
        out = F.scaled_dot_product_attention(*args, attn_mask=mask, is_causal=mask is None, enable_gqa=gqa, scale=scale)
    return out[..., : v.shape[-1]].transpose(1, 2)


def kernel_args(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], bool]:
    """q, k, v ([B, T, H, D] as :func:`sdpa` takes them) as SDPA's fused GPU kernels accept them, [B, H, T, D],
    and whether ``enable_gqa`` is still needed. Flash attention takes no mask and one head dim for q, k and v;
    the memory-efficient kernel takes a mask but not ``enable_gqa`` (torch 2.11): so a narrower v is padded with
    zero columns (the caller cuts them off the output), and under a mask grouped-query k and v are expanded
    to the query heads. Otherwise SDPA falls to its math backend: fp32 [B, H, T, S] scores, O(T^2) memory
    (GPT-OSS's prefill with sinks and Gemma 3's windows, seen in bench/gpt_oss_gpu.py --profile)."""
    D, Dv = q.shape[-1], v.shape[-1]
    if Dv < D:
        v = F.pad(v, (0, D - Dv))
    gqa = q.shape[2] != k.shape[2]
    if gqa and mask is not None:
        r = q.shape[2] // k.shape[2]
        k, v = k.repeat_interleave(r, 2), v.repeat_interleave(r, 2)
        gqa = False
    return (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)), gqa


SINK_DIMS = 8  # the extra query/key dimensions that carry the sink logits (one used, padded for alignment)


def _sdpa_sinks(q, k, v, mask, scale, sinks):
    B, T, H, D = q.shape
    S, KVH = k.shape[1], k.shape[2]
    if sinks.shape != (H,):
        raise ValueError(f"attention sinks of shape {tuple(sinks.shape)}, expected [{H}] (one per query head)")
    scale = D**-0.5 if scale is None else scale
    sink_q = (sinks.to(q.dtype) / scale).view(1, 1, H, 1).expand(B, T, H, 1)
    q = torch.cat([q, F.pad(sink_q, (0, SINK_DIMS - 1))], dim=-1)
    sink_k = torch.zeros(B, 1, KVH, D + SINK_DIMS, dtype=k.dtype, device=k.device)
    sink_k[..., D] = 1.0
    k = torch.cat([F.pad(k, (0, SINK_DIMS)), sink_k], dim=1)
    v = torch.cat([v, v.new_zeros(B, 1, KVH, v.shape[-1])], dim=1)
    if mask is None:
        mask = causal_mask(T, S, q.device)
    mask = torch.cat([mask, torch.ones_like(mask[..., :1]).expand(*mask.shape[:-1], 1)], dim=-1)
    return sdpa(q, k, v, mask, scale=scale)


def causal_mask(T: int, S: int, device: torch.device | str | None = None, window: int = 0) -> torch.Tensor:
    """[T, S] bool, True where query ``i`` (position ``i``, top-left aligned as SDPA's ``is_causal``)
    sees key ``j``: ``j <= i``, and with a sliding ``window`` > 0 also ``j > i - window``."""
    i = torch.arange(T, device=device)[:, None]
    j = torch.arange(S, device=device)[None, :]
    return window_mask(i, j, window)


def window_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int = 0) -> torch.Tensor:
    """Causal visibility of keys at positions ``k_pos`` from queries at ``q_pos`` (broadcast against
    each other): ``k_pos <= q_pos``, and with ``window`` > 0 also ``k_pos > q_pos - window`` (the last
    ``window`` positions, the query's own included: transformers' sliding-window mask)."""
    visible = k_pos <= q_pos
    if window:
        visible = visible & (k_pos > q_pos - window)
    return visible
