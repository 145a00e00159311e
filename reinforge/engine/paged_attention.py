"""Decode attention over the engine's paged KV cache: one new query token per sequence.

Cache layout per layer: ``[blocks, kv_heads, block_size, head_dim]``; a sequence's key at position
``p`` is ``cache[table[b, p // block_size], :, p % block_size]`` (see :mod:`.kv_cache`).

* :func:`paged_decode_attention_triton` (CUDA): one Triton program per (sequence, KV head) walks
  that sequence's blocks up to its own length with an online softmax (the flash-decoding
  recurrence: Dao et al., "Flash-Decoding for long-context inference", 2023; vLLM's
  ``paged_attention_v1``). It reads each key once and no padding, and all query heads of a GQA
  group share the loads. Scores and the softmax are fp32.
* :func:`masked_decode_attention` (any device): the reference, a batched matmul over a padded key
  range with a mask; :func:`gather_blocks` brings paged keys into that padded form.
"""

from __future__ import annotations

import torch

from ..utils.triton import tl, triton


def masked_decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                            bias: torch.Tensor) -> torch.Tensor:
    """Attention of one query token per sequence over a padded key range.

    Args:
        q: [B, H, D] queries (RoPE applied).
        keys, values: [B, KVH, Lk, D], H a multiple of KVH (grouped-query attention); may be views.
        bias: [B, 1, 1, Lk] fp32, 0 where a key is visible and -inf where it is not.

    Returns:
        [B, H, D] in the values' dtype; scores and softmax in fp32.
    """
    B, H, D = q.shape
    KVH = keys.shape[1]
    qg = q.view(B, KVH, H // KVH, D)
    scores = torch.matmul(qg, keys.transpose(-1, -2)).float() * (D ** -0.5) + bias
    probs = torch.softmax(scores, dim=-1).to(values.dtype)
    return torch.matmul(probs, values).view(B, H, D)


def gather_blocks(cache: torch.Tensor, table: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """The first ``num_blocks`` blocks of each row of ``table`` as one padded key range.

    Args:
        cache: [blocks, KVH, BS, D] one layer's keys or values.
        table: [B, >= num_blocks] integer block ids.

    Returns:
        [B, KVH, num_blocks * BS, D] (a copy).
    """
    B = table.shape[0]
    _, KVH, BS, D = cache.shape
    g = cache[table[:, :num_blocks].long()]  # [B, nb, KVH, BS, D]
    return g.transpose(1, 2).reshape(B, KVH, num_blocks * BS, D)


if triton is not None:

    @triton.jit
    def _paged_decode_kernel(Q, KN, VN, K, V, TABLE, LENS, WBLK, WOFF, O, scale,
                             s_qb, s_qh, s_nb, s_nh, s_kb, s_kh, s_kt, s_tb, s_ob, s_oh,
                             G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                             BLOCK_N: tl.constexpr, IEEE: tl.constexpr):
        b = tl.program_id(0)
        h = tl.program_id(1)
        n_cached = tl.load(LENS + b).to(tl.int32) - 1
        g = tl.arange(0, G_PAD)
        d = tl.arange(0, D)
        t = tl.arange(0, BLOCK_N)
        head_ok = (g < G)[:, None]
        # the new token: written to the cache (for later steps), attended from registers (no race)
        kn = tl.load(KN + b * s_nb + h * s_nh + d)
        vn = tl.load(VN + b * s_nb + h * s_nh + d)
        w = tl.load(WBLK + b).to(tl.int64) * s_kb + h * s_kh + tl.load(WOFF + b).to(tl.int64) * s_kt
        tl.store(K + w + d, kn)
        tl.store(V + w + d, vn)
        q = tl.load(Q + b * s_qb + (h * G + g)[:, None] * s_qh + d[None, :], mask=head_ok, other=0.0)
        m = tl.sum(q.to(tl.float32) * kn.to(tl.float32)[None, :], 1) * scale  # running max = the new score
        denom = tl.full([G_PAD], 1.0, tl.float32)
        acc = tl.zeros([G_PAD, D], tl.float32) + vn.to(tl.float32)[None, :]
        for start in range(0, n_cached, BLOCK_N):
            tok = start + t
            valid = tok < n_cached
            blk = tl.load(TABLE + b * s_tb + tok // BS, mask=valid, other=0).to(tl.int64)
            row = blk * s_kb + h * s_kh + (tok % BS) * s_kt
            k = tl.load(K + row[:, None] + d[None, :], mask=valid[:, None], other=0.0)
            if IEEE:
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = tl.where(valid[None, :], s * scale, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])
            denom = denom * alpha + tl.sum(p, 1)
            v = tl.load(V + row[:, None] + d[None, :], mask=valid[:, None], other=0.0)
            if IEEE:
                pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m = m_new
        out = acc / denom[:, None]
        tl.store(O + b * s_ob + (h * G + g)[:, None] * s_oh + d[None, :], out.to(O.dtype.element_ty), mask=head_ok)


def paged_decode_attention_triton(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, k_cache: torch.Tensor,
                                  v_cache: torch.Tensor, table: torch.Tensor, lens: torch.Tensor,
                                  write_block: torch.Tensor, write_offset: torch.Tensor,
                                  block_n: int = 64) -> torch.Tensor:
    """Paged decode attention with the Triton kernel (CUDA; capturable in a CUDA graph). It also
    stores the new token's key and value in the cache (one kernel instead of two scatters).

    Args:
        q: [B, H, D] queries, contiguous in D.
        k_new, v_new: [B, KVH, D] the new token's key (RoPE applied) and value, contiguous in D.
        k_cache, v_cache: [blocks, KVH, BS, D] one layer's cache, contiguous; D a power of two.
        table: [>= B, max_blocks] int32 block ids; row b lists sequence b's blocks in order.
        lens: [B] int64 keys sequence b attends to: cached positions ``[0, lens[b] - 1)`` and the
            new token (>= 1).
        write_block, write_offset: [B] int64 where the new token's key/value go (a sink block for
            idle rows).
        block_n: cached keys per loop iteration (may span several blocks).

    Returns:
        [B, H, D] in ``q``'s dtype. fp32 inputs use IEEE fp32 dot products (no TF32).
    """
    B, H, D = q.shape
    _, KVH, BS, _ = k_cache.shape
    G = H // KVH
    out = torch.empty_like(q)
    _paged_decode_kernel[(B, KVH)](
        q, k_new, v_new, k_cache, v_cache, table, lens, write_block, write_offset, out, D ** -0.5,
        q.stride(0), q.stride(1), k_new.stride(0), k_new.stride(1), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), table.stride(0), out.stride(0), out.stride(1),
        G=G, G_PAD=max(16, triton.next_power_of_2(G)), D=D, BS=BS, BLOCK_N=block_n,
        IEEE=q.dtype == torch.float32, num_warps=4)
    return out
