"""Decode attention of multi-head latent attention (MLA, :mod:`reinforge.models.mla`) over the paged latent
cache: one Triton kernel (CUDA; the Triton interpreter in tests), the absorbed form FlashMLA and vLLM's MLA
backends compute.

The cache holds one row per token and layer, ``[c | k_rot]`` of ``R + DR`` values (``kv_lora_rank`` and
``qk_rope_head_dim``); it is every head's key, and its first ``R`` values are every head's value. The
queries arrive in the latent space (``q_nope`` through ``W_UK``, then ``q_rot``): [B, H, R + DR]. So the
kernel is multi-query attention of one KV head whose value is a prefix of its key: each program loads a
tile of latent rows once and uses it for the scores (``q_c . c + q_rot . k_rot``) and for the weighted sum
(``p @ c``). A program takes ``BLOCK_H`` query heads of one sequence (all heads' scores from one tile) and
one of ``S`` splits of its keys (flash-decoding, as :func:`~.paged_attention.paged_decode_attention_triton`,
whose split combination it shares); it also stores the new token's row (split 0 of head block 0).

Bytes per decode step and layer: ``(R + DR) x dtype`` per cached token, read once per head block
(``ceil(H / BLOCK_H)`` times: once for Moonlight's 16 heads, 8 times for DeepSeek-V3's 128 at
``BLOCK_H = 16``; the second and later reads mostly hit L2 when the blocks run together).

The reference: :class:`~.attention.GatherDecode` / :class:`~.attention.SlotDecode` over the same cache
(``tests/integration/test_deepseek_v3.py``).
"""

from __future__ import annotations

import torch

from ..utils.triton import num_sms, tl, triton
from .kv_cache import FP8_DTYPES
from .paged_attention import MIN_KEYS_PER_SPLIT, RESCALE_LOG2, combine_splits, decode_splits, split_partials

BLOCK_H = 16  # query heads per program (tl.dot's smallest M)

if triton is not None:

    @triton.jit
    def _mla_decode_kernel(
        Q,
        KN,
        C,
        TABLE,
        LENS,
        WBLK,
        WOFF,
        O,  # noqa: E741
        PM,
        PL,
        PACC,
        scale,
        s_qb,
        s_qh,
        s_nb,
        s_cb,
        s_ct,
        s_tb,
        s_ob,
        s_oh,
        H: tl.constexpr,
        R: tl.constexpr,
        DR: tl.constexpr,
        BH: tl.constexpr,
        BS: tl.constexpr,
        BLOCK_N: tl.constexpr,
        SPLITS: tl.constexpr,
        MIN_KEYS: tl.constexpr,
        IEEE: tl.constexpr,
        KV_FP8: tl.constexpr,
        FP8_MAX: tl.constexpr,
        RESCALE: tl.constexpr,
    ):
        # program (b, hb, sp): sequence b, query heads [hb * BH, hb * BH + BH), split sp of its cached keys
        b = tl.program_id(0)
        hb = tl.program_id(1)
        sp = tl.program_id(2)
        n_cached = tl.load(LENS + b).to(tl.int32) - 1
        if SPLITS == 1:
            lo = 0
            hi = n_cached
        else:
            per = tl.maximum(tl.cdiv(tl.cdiv(n_cached, SPLITS), BLOCK_N) * BLOCK_N, MIN_KEYS)
            lo = sp * per
            hi = tl.minimum(lo + per, n_cached)
        heads = hb * BH + tl.arange(0, BH)
        head_ok = heads < H
        dl = tl.arange(0, R)
        dr = tl.arange(0, DR)
        t = tl.arange(0, BLOCK_N)
        q_c = tl.load(Q + b * s_qb + heads[:, None] * s_qh + dl[None, :], mask=head_ok[:, None], other=0.0)
        q_r = tl.load(Q + b * s_qb + heads[:, None] * s_qh + R + dr[None, :], mask=head_ok[:, None], other=0.0)
        # the new token's row: stored once (split 0 of head block 0), attended from registers by split 0
        kn_c = tl.load(KN + b * s_nb + dl)
        kn_r = tl.load(KN + b * s_nb + R + dr)
        if KV_FP8:
            kn_c = tl.minimum(tl.maximum(kn_c.to(tl.float32), -FP8_MAX), FP8_MAX).to(C.dtype.element_ty)
            kn_r = tl.minimum(tl.maximum(kn_r.to(tl.float32), -FP8_MAX), FP8_MAX).to(C.dtype.element_ty)
        if (sp == 0) & (hb == 0):
            w = tl.load(WBLK + b).to(tl.int64) * s_cb + tl.load(WOFF + b).to(tl.int64) * s_ct
            tl.store(C + w + dl, kn_c)
            tl.store(C + w + R + dr, kn_r)
        if KV_FP8 and not IEEE:  # products in fp16 over an 8-bit cache (see paged_attention.py)
            q_c = tl.minimum(tl.maximum(q_c.to(tl.float32), -65504.0), 65504.0).to(tl.float16)
            q_r = tl.minimum(tl.maximum(q_r.to(tl.float32), -65504.0), 65504.0).to(tl.float16)
        first = sp == 0
        scale = scale * 1.4426950408889634  # log2 units: exp2 below
        s_new = (
            tl.sum(q_c.to(tl.float32) * kn_c.to(tl.float32)[None, :], 1)
            + tl.sum(q_r.to(tl.float32) * kn_r.to(tl.float32)[None, :], 1)
        ) * scale
        m = tl.where(first, s_new, float("-inf"))
        denom = tl.where(first, 1.0, 0.0) + tl.zeros([BH], tl.float32)
        acc = tl.where(first, 1.0, 0.0) * kn_c.to(tl.float32)[None, :] + tl.zeros([BH, R], tl.float32)
        for start in range(lo, hi, BLOCK_N):
            tok = start + t
            valid = tok < hi
            blk = tl.load(TABLE + b * s_tb + tok // BS, mask=valid, other=0).to(tl.int64)
            row = blk * s_cb + (tok % BS) * s_ct
            c = tl.load(C + row[:, None] + dl[None, :], mask=valid[:, None], other=0.0)
            kr = tl.load(C + row[:, None] + R + dr[None, :], mask=valid[:, None], other=0.0)
            if KV_FP8:
                c = c.to(q_c.dtype)
                kr = kr.to(q_r.dtype)
            if IEEE:
                s = tl.dot(q_c, tl.trans(c), input_precision="ieee") + tl.dot(q_r, tl.trans(kr), input_precision="ieee")
            else:
                s = tl.dot(q_c, tl.trans(c)) + tl.dot(q_r, tl.trans(kr))
            s = tl.where(valid[None, :], s * scale, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            if tl.max(m_new - m, 0) > RESCALE:  # lazy rescaling, as the GQA kernel
                alpha = tl.exp2(m - m_new)
                denom = denom * alpha
                acc = acc * alpha[:, None]
                m = m_new
            p = tl.exp2(s - m[:, None])
            denom = denom + tl.sum(p, 1)
            if IEEE:
                acc = acc + tl.dot(p.to(c.dtype), c, input_precision="ieee")
            else:
                acc = acc + tl.dot(p.to(c.dtype), c)
        if SPLITS == 1:
            out = acc / denom[:, None]
            tl.store(
                O + b * s_ob + heads[:, None] * s_oh + dl[None, :], out.to(O.dtype.element_ty), mask=head_ok[:, None]
            )
        else:
            part = (b * H + heads) * SPLITS + sp
            tl.store(PM + part, m, mask=head_ok)
            tl.store(PL + part, denom, mask=head_ok)
            tl.store(PACC + part[:, None] * R + dl[None, :], acc, mask=head_ok[:, None])


def mla_decode_attention_triton(
    q: torch.Tensor,
    latent_new: torch.Tensor,
    cache: torch.Tensor,
    kv_lora_rank: int,
    table: torch.Tensor,
    lens: torch.Tensor,
    write_block: torch.Tensor,
    write_offset: torch.Tensor,
    max_len: int | None = None,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int = 4,
    num_stages: int = 2,
) -> torch.Tensor:
    """Decode attention over a paged MLA latent cache, storing the new token's row (module docstring).

    Args:
        q: [B, H, R + DR] queries in the latent space, contiguous in the last dimension (scaled so that the
            kernel's ``(R + DR) ** -0.5`` gives the model's softmax scale, as every engine context).
        latent_new: [B, R + DR] the new token's row ``[c | k_rot]`` (RoPE applied), contiguous in its last dim.
        cache: [blocks, 1, BS, R + DR] one layer's latent cache, contiguous; R and DR powers of two; in ``q``'s
            dtype or an 8-bit float (scale 1, as :func:`~.paged_attention.paged_decode_attention_triton`).
        kv_lora_rank: R.
        table, lens, write_block, write_offset, max_len: as :func:`~.paged_attention.paged_decode_attention_triton`.
        num_splits: programs per (sequence, head block); None: :func:`~.paged_attention.decode_splits`.
        block_n: cached rows per iteration (None: 32 for R >= 256, else 64: a [BLOCK_N, R] tile in registers).

    Returns:
        [B, H, R] in ``q``'s dtype: each head's attention-weighted latent (``W_UV`` is applied by the caller).

    Raises:
        ValueError: R or DR not a power of two, or the shapes disagree.
    """
    B, H, D = q.shape
    R, DR = kv_lora_rank, D - kv_lora_rank
    if R & (R - 1) or DR < 1 or DR & (DR - 1) or cache.shape[1] != 1 or cache.shape[-1] != D:
        raise ValueError(
            f"mla_decode_attention_triton: kv_lora_rank={R} and qk_rope_head_dim={DR} must be powers of two and the "
            f"cache [blocks, 1, block_size, {D}] (got {tuple(cache.shape)})"
        )
    BS = cache.shape[2]
    head_blocks = -(-H // BLOCK_H)
    if num_splits is None:
        num_splits = decode_splits(
            B, head_blocks, max_len if max_len is not None else table.shape[1] * BS, num_sms(q.device)
        )
    block_n = block_n or (32 if R >= 256 else 64)
    fp8 = cache.dtype in FP8_DTYPES
    out = torch.empty(B, H, R, device=q.device, dtype=q.dtype)
    pm, pl, pacc = split_partials(out, num_splits)
    _mla_decode_kernel[(B, head_blocks, num_splits)](
        q,
        latent_new,
        cache,
        table,
        lens,
        write_block,
        write_offset,
        out,
        pm,
        pl,
        pacc,
        D**-0.5,
        q.stride(0),
        q.stride(1),
        latent_new.stride(0),
        cache.stride(0),
        cache.stride(2),
        table.stride(0),
        out.stride(0),
        out.stride(1),
        H=H,
        R=R,
        DR=DR,
        BH=BLOCK_H,
        BS=BS,
        BLOCK_N=block_n,
        SPLITS=num_splits,
        MIN_KEYS=-(-MIN_KEYS_PER_SPLIT // block_n) * block_n,
        IEEE=q.dtype == torch.float32,
        KV_FP8=fp8,
        FP8_MAX=torch.finfo(cache.dtype).max if fp8 else 0.0,
        RESCALE=RESCALE_LOG2,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    combine_splits(pm, pl, pacc, out)
    return out
