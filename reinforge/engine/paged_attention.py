"""Decode attention over the engine's paged KV cache: one new query token per sequence.

Cache layout per layer: ``[blocks, kv_heads, block_size, head_dim]``; a sequence's key at position
``p`` is ``cache[table[b, p // block_size], :, p % block_size]`` (see :mod:`.kv_cache`).

* :func:`paged_decode_attention_triton` (CUDA): Triton programs walk each sequence's blocks up to
  its own length with an online softmax (the flash-decoding recurrence: Dao et al.,
  "Flash-Decoding for long-context inference", 2023; vLLM's ``paged_attention_v1`` / ``_v2``).
  They read each key once and no padding, and all query heads of a GQA group share the loads.
  Scores and the softmax are fp32. Few sequences with long contexts are split (split-K, as in
  flash-decoding): several programs per (sequence, KV head) each take a piece of the keys and
  write a partial softmax, and a second kernel combines them; :func:`decode_splits` picks the
  number of pieces from the batch, the KV heads and the context capacity (1 for short contexts
  and big batches: one program walks all the keys, no second kernel).
* :func:`masked_decode_attention` (any device): the reference, a batched matmul over a padded key
  range with a mask; :func:`gather_blocks` brings paged keys into that padded form.
"""

from __future__ import annotations

import torch

from ..utils.triton import num_sms, tl, triton
from .kv_cache import FP8_DTYPES, cache_read


def masked_decode_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    bias: torch.Tensor,
    scale: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of one query token per sequence over a padded key range.

    Args:
        q: [B, H, D] queries (RoPE applied).
        keys, values: [B, KVH, Lk, D], H a multiple of KVH (grouped-query attention); may be views.
        bias: [B, 1, 1, Lk] fp32, 0 where a key is visible and -inf where it is not (a sliding window is
            -inf before it).
        scale: the factor on q.k (None: ``D ** -0.5``).
        sinks: [H] logits that join each head's softmax denominator and attend to nothing (attention
            sinks, GPT-OSS); None: none.

    Returns:
        [B, H, D] in the values' dtype; scores and softmax in fp32.
    """
    B, H, D = q.shape
    KVH = keys.shape[1]
    qg = q.view(B, KVH, H // KVH, D)
    scores = torch.matmul(qg, keys.transpose(-1, -2)).float() * (D**-0.5 if scale is None else scale) + bias
    if sinks is not None:  # one more column per head: the sink's logit, its value 0
        sink = sinks.float().view(1, KVH, H // KVH, 1).expand(B, -1, -1, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1].to(values.dtype)
    else:
        probs = torch.softmax(scores, dim=-1).to(values.dtype)
    return torch.matmul(probs, values).view(B, H, D)


def gather_blocks(
    cache: torch.Tensor, table: torch.Tensor, num_blocks: int, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """The first ``num_blocks`` blocks of each row of ``table`` as one padded key range.

    Args:
        cache: [blocks, KVH, BS, D] one layer's keys or values (an 8-bit float cache too).
        table: [B, >= num_blocks] integer block ids.
        dtype: of the result (None: the cache's).

    Returns:
        [B, KVH, num_blocks * BS, D] (a copy).
    """
    B = table.shape[0]
    _, KVH, BS, D = cache.shape
    g = cache_read(cache, (table[:, :num_blocks].long(),), dtype or cache.dtype)  # [B, nb, KVH, BS, D]
    return g.transpose(1, 2).reshape(B, KVH, num_blocks * BS, D)


# Split-K ("flash-decoding") choice. One program per (sequence, KV head) leaves most SMs idle when
# few sequences have long contexts (16 sequences x 2 KV heads = 32 programs on 132 SMs), so each
# sequence's keys are split over several programs whose partial softmaxes are then combined.
TARGET_PROGRAMS_PER_SM = 4  # programs the split aims for, per SM (several per SM hide memory latency)
MIN_KEYS_PER_SPLIT = 256  # a split covers at least this many cached keys (a multiple of block_n)
MAX_SPLITS = 64
BLOCK_N_128_MAX_SPLITS = 8  # bf16: 128 keys per iteration up to this many splits (64+ sequences), else 64
# Heads of 64 (SmolLM2, Llama-3.2-1B) in one pass over a bf16 cache: 64 keys per iteration on 2 warps
# (H200, 256 sequences x 128-384 keys, 9 / 3 heads: 7.7 / 13.4 / 23.2 us per call against 9.1 / 18.1 /
# 28.0 with 128 keys on 4 warps; bench/decode_attention.py, docs/benchmarks.md)
SMALL_HEAD_DIM = 64
RESCALE_LOG2 = 8.0  # the decode kernel's lazy rescaling threshold (log2 units: p <= 256 between rescales)


def decode_splits(
    num_seqs: int,
    kv_heads: int,
    max_len: int,
    num_sms: int,
    target_per_sm: int = TARGET_PROGRAMS_PER_SM,
    min_keys: int = MIN_KEYS_PER_SPLIT,
    max_splits: int = MAX_SPLITS,
) -> int:
    """How many programs share one (sequence, KV head)'s keys: enough that ``num_seqs * kv_heads *
    splits`` reaches ``target_per_sm * num_sms`` programs, but no more than ``max_len`` keys give
    ``min_keys`` each (short contexts and big batches get 1: the single-pass kernel).

    ``splits = clamp(ceil(target_per_sm * num_sms / (num_seqs * kv_heads)), 1, ceil(max_len / min_keys))``,
    at most ``max_splits``. All arguments are host integers fixed for a captured CUDA graph (the
    batch bucket and the cache's capacity per sequence), never live lengths.
    """
    if num_seqs < 1 or kv_heads < 1 or max_len < 1 or num_sms < 1 or min_keys < 1:
        raise ValueError(
            f"decode_splits: num_seqs={num_seqs}, kv_heads={kv_heads}, max_len={max_len}, "
            f"num_sms={num_sms}, min_keys={min_keys} must all be >= 1"
        )
    want = -(-target_per_sm * num_sms // (num_seqs * kv_heads))
    return max(1, min(want, -(-max_len // min_keys), max_splits))


if triton is not None:

    @triton.jit
    def _paged_decode_kernel(
        Q,
        KN,
        VN,
        K,
        V,
        TABLE,
        LENS,
        WBLK,
        WOFF,
        O,
        PM,
        PL,
        PACC,
        COS,
        SIN,
        SINKS,
        scale,
        window,
        s_qb,
        s_qh,
        s_nb,
        s_nh,
        s_vb,
        s_vh,
        s_kb,
        s_kh,
        s_kt,
        s_tb,
        s_ob,
        s_oh,
        s_cos,
        H: tl.constexpr,
        G: tl.constexpr,
        G_PAD: tl.constexpr,
        D: tl.constexpr,
        BS: tl.constexpr,
        BLOCK_N: tl.constexpr,
        SPLITS: tl.constexpr,
        MIN_KEYS: tl.constexpr,
        IEEE: tl.constexpr,
        KV_FP8: tl.constexpr,
        FP8_MAX: tl.constexpr,
        RESCALE: tl.constexpr,
        ROPE: tl.constexpr,
        HAS_SINKS: tl.constexpr,
    ):
        # program (b, h, sp): sequence b, KV head h, split sp of that sequence's cached keys
        b = tl.program_id(0)
        h = tl.program_id(1)
        sp = tl.program_id(2)
        n_cached = tl.load(LENS + b).to(tl.int32) - 1
        # a sliding window: the keys after n_cached - window (the new token is the window's last); full: 0
        first_key = tl.maximum(n_cached + 1 - window, 0)
        if SPLITS == 1:
            lo = first_key
            hi = n_cached
        else:  # the live keys split evenly in BLOCK_N multiples, >= MIN_KEYS each; later splits may be empty
            per = tl.maximum(tl.cdiv(tl.cdiv(n_cached - first_key, SPLITS), BLOCK_N) * BLOCK_N, MIN_KEYS)
            lo = first_key + sp * per
            hi = tl.minimum(lo + per, n_cached)
        g = tl.arange(0, G_PAD)
        d = tl.arange(0, D)
        t = tl.arange(0, BLOCK_N)
        head_ok = (g < G)[:, None]
        # the new token: written to the cache once (split 0, for later steps) and attended from
        # registers by split 0 (no race: no program reads position n_cached from memory)
        kn = tl.load(KN + b * s_nb + h * s_nh + d)
        vn = tl.load(VN + b * s_vb + h * s_vh + d)
        q = tl.load(Q + b * s_qb + (h * G + g)[:, None] * s_qh + d[None, :], mask=head_ok, other=0.0)
        if ROPE:  # rotate q and the new key at position n_cached: x * cos + rotate_half(x) * sin (fused.rope_'s
            # arithmetic: the tables rounded to q's dtype, products in fp32, the result rounded back)
            half = D // 2
            dp = (d + half) % D  # each dimension's partner in the other half
            c = tl.load(COS + n_cached * s_cos + d).to(Q.dtype.element_ty).to(tl.float32)
            sn = tl.load(SIN + n_cached * s_cos + d).to(Q.dtype.element_ty).to(tl.float32)
            sn = tl.where(d < half, -sn, sn)
            k2 = tl.load(KN + b * s_nb + h * s_nh + dp).to(tl.float32)
            kn = (kn.to(tl.float32) * c + k2 * sn).to(KN.dtype.element_ty)
            q2 = tl.load(Q + b * s_qb + (h * G + g)[:, None] * s_qh + dp[None, :], mask=head_ok, other=0.0)
            q = (q.to(tl.float32) * c[None, :] + q2.to(tl.float32) * sn[None, :]).to(Q.dtype.element_ty)
        if KV_FP8:  # an 8-bit cache: saturate and round, and attend to the rounded token like later steps
            kn = tl.minimum(tl.maximum(kn.to(tl.float32), -FP8_MAX), FP8_MAX).to(K.dtype.element_ty)
            vn = tl.minimum(tl.maximum(vn.to(tl.float32), -FP8_MAX), FP8_MAX).to(V.dtype.element_ty)
        if sp == 0:
            w = tl.load(WBLK + b).to(tl.int64) * s_kb + h * s_kh + tl.load(WOFF + b).to(tl.int64) * s_kt
            tl.store(K + w + d, kn)
            tl.store(V + w + d, vn)
        if KV_FP8 and not IEEE:
            # fp8 -> fp16 is one conversion instruction per pair (fp8 -> bf16 is several), so the
            # products run in fp16 (10 mantissa bits; bf16 queries beyond its range are clamped)
            q = tl.minimum(tl.maximum(q.to(tl.float32), -65504.0), 65504.0).to(tl.float16)
        first = sp == 0
        scale = scale * 1.4426950408889634  # scores in log2 units: exp2 below
        s_new = tl.sum(q.to(tl.float32) * kn.to(tl.float32)[None, :], 1) * scale
        # running max, sum of exp and weighted values; a split without the new token starts neutral
        if HAS_SINKS:  # split 0 also holds the heads' sink logits: in the max and the sum, with value 0
            sink = tl.load(SINKS + h * G + g, mask=g < G, other=0.0).to(tl.float32) * 1.4426950408889634
            m0 = tl.maximum(s_new, sink)
            w_new = tl.exp2(s_new - m0)
            m = tl.where(first, m0, float("-inf"))
            denom = tl.where(first, w_new + tl.exp2(sink - m0), 0.0)
            acc = tl.where(first, 1.0, 0.0) * w_new[:, None] * vn.to(tl.float32)[None, :]
        else:
            m = tl.where(first, s_new, float("-inf"))
            denom = tl.where(first, 1.0, 0.0) + tl.zeros([G_PAD], tl.float32)
            acc = tl.where(first, 1.0, 0.0) * vn.to(tl.float32)[None, :] + tl.zeros([G_PAD, D], tl.float32)
        for start in range(lo, hi, BLOCK_N):  # every iteration has >= 1 valid key: m stays finite
            tok = start + t
            valid = tok < hi
            blk = tl.load(TABLE + b * s_tb + tok // BS, mask=valid, other=0).to(tl.int64)
            row = blk * s_kb + h * s_kh + (tok % BS) * s_kt
            k = tl.load(K + row[:, None] + d[None, :], mask=valid[:, None], other=0.0)
            if KV_FP8:
                k = k.to(q.dtype)
            if IEEE:
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = tl.where(valid[None, :], s * scale, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            # lazy rescaling (FlashAttention-4's): the running max moves only when some row's grew by
            # more than RESCALE (log2 units); until then exp2(s - m) <= 2**RESCALE (fp32 sums, fp16/bf16 p)
            if tl.max(m_new - m, 0) > RESCALE:
                alpha = tl.exp2(m - m_new)
                denom = denom * alpha
                acc = acc * alpha[:, None]
                m = m_new
            p = tl.exp2(s - m[:, None])
            denom = denom + tl.sum(p, 1)
            v = tl.load(V + row[:, None] + d[None, :], mask=valid[:, None], other=0.0)
            if KV_FP8:
                v = v.to(q.dtype)
            if IEEE:
                pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc + pv
        if SPLITS == 1:
            out = acc / denom[:, None]
            tl.store(O + b * s_ob + (h * G + g)[:, None] * s_oh + d[None, :], out.to(O.dtype.element_ty), mask=head_ok)
        else:  # partials, fp32: [B, H, SPLITS] (max in log2 units, sum of exp2), [B, H, SPLITS, D] (unnormalised)
            part = (b * H + h * G + g) * SPLITS + sp
            tl.store(PM + part, m, mask=g < G)
            tl.store(PL + part, denom, mask=g < G)
            tl.store(PACC + part[:, None] * D + d[None, :], acc, mask=head_ok)

    @triton.jit
    def _combine_splits_kernel(
        PM, PL, PACC, O, s_ob, s_oh, H: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr, S_PAD: tl.constexpr
    ):
        # program (b, qh): rescale the splits' partial softmaxes to a common max and normalise
        b = tl.program_id(0)
        qh = tl.program_id(1)
        j = tl.arange(0, S_PAD)
        d = tl.arange(0, D)
        ok = j < SPLITS
        base = (b * H + qh) * SPLITS
        m = tl.load(PM + base + j, mask=ok, other=float("-inf"))
        l = tl.load(PL + base + j, mask=ok, other=0.0)
        acc = tl.load(PACC + (base + j)[:, None] * D + d[None, :], mask=ok[:, None], other=0.0)
        m_max = tl.max(m, 0)  # finite: split 0 holds the new token
        w = tl.where(m > float("-inf"), tl.exp2(m - m_max), 0.0)  # empty splits weigh 0
        out = tl.sum(acc * w[:, None], 0) / tl.sum(l * w, 0)
        tl.store(O + b * s_ob + qh * s_oh + d, out.to(O.dtype.element_ty))


def paged_decode_attention_triton(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table: torch.Tensor,
    lens: torch.Tensor,
    write_block: torch.Tensor,
    write_offset: torch.Tensor,
    block_n: int | None = None,
    num_splits: int | None = None,
    max_len: int | None = None,
    num_warps: int | None = None,
    num_stages: int = 3,
    cos: torch.Tensor | None = None,
    sin: torch.Tensor | None = None,
    window: int = 0,
    sinks: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Paged decode attention with the Triton kernel (CUDA; capturable in a CUDA graph). It also
    stores the new token's key and value in the cache, exactly once (one kernel instead of two
    scatters).

    With one split, one program per (sequence, KV head) walks all of the sequence's keys. With
    ``S > 1`` splits (flash-decoding) program ``(b, h, j)`` takes the ``j``-th of ``S`` equal
    ``block_n``-aligned pieces (>= ``MIN_KEYS_PER_SPLIT`` keys) of sequence ``b``'s live length
    and writes a partial (max score, sum of exp, exp-weighted value sum; fp32; an empty piece
    writes ``-inf, 0, 0``); a second kernel rescales the partials to their common max and
    normalises. The grid depends only on ``B``, ``KVH`` and ``S``, never on the lengths.

    Args:
        q: [B, H, D] queries, contiguous in D.
        k_new, v_new: [B, KVH, D] the new token's key (RoPE applied) and value, each contiguous in D
            (their other strides may differ).
        k_cache, v_cache: [blocks, KVH, BS, D] one layer's cache, contiguous; D a power of two. In
            ``q``'s dtype, or an 8-bit float (``float8_e4m3fn`` / ``float8_e5m2``, scale 1): loads
            are converted to ``q``'s dtype, and the new token is saturated and rounded to the
            cache's format both where it is stored and where this step attends to it (so every
            step sees the same keys as :func:`masked_decode_attention` over the written cache). With
            bf16 / fp16 queries the products over an 8-bit cache run in fp16.
        table: [>= B, max_blocks] int32 block ids; row b lists sequence b's blocks in order.
        lens: [B] int64 keys sequence b attends to: cached positions ``[0, lens[b] - 1)`` and the
            new token (>= 1).
        write_block, write_offset: [B] int64 where the new token's key/value go (a sink block for
            idle rows).
        block_n: cached keys per loop iteration (may span several blocks); None: 64 for heads of at most
            ``SMALL_HEAD_DIM`` over a bf16 / fp16 cache in one split; else 128 over an 8-bit cache (each
            iteration's fixed work then covers as many bytes) or with at most ``BLOCK_N_128_MAX_SPLITS``
            splits (many programs already: longer iterations read more per program), else 64 (H100 and
            H200 sweeps in docs/benchmarks.md).
        num_splits: programs per (sequence, KV head); None: :func:`decode_splits` from ``B``,
            ``KVH``, ``max_len`` and the device's SM count.
        max_len: host bound on ``lens`` used to choose the splits (it affects speed only, not the
            result); None: the table's capacity, ``max_blocks * BS`` (the engine's
            ``max_model_len``), fixed for a captured graph.
        num_warps: Triton warps per program; None: 2 in the small-head case of ``block_n``, else 4.
        num_stages: Triton software-pipelining stages of the key loop (loads issued that many
            iterations ahead).
        cos, sin: RoPE tables [positions, D] fp32, contiguous in D (``CausalLM.rope_cos`` / ``rope_sin``):
            given, ``q`` and ``k_new`` arrive unrotated and the kernel rotates them at position
            ``lens[b] - 1`` (``x * cos + rotate_half(x) * sin``, Su et al. 2021, with
            :func:`reinforge.models.fused.rope_`'s rounding: the engine's decode step then needs no
            RoPE kernel); the rotated key is what the cache stores. None: both already rotated.
        window: a sliding window in tokens (0: full attention): each sequence's loop starts at
            ``max(0, lens[b] - window)``, the new token being the window's last key (splits share the
            window's keys only).
        sinks: [H] logits (attention sinks, one per query head): split 0 starts its running max at
            ``max(score_new, sink)`` and its sum with ``exp(sink - max)``, the sink's value 0.
        scale: the factor on q.k (None: ``D ** -0.5``).

    Returns:
        [B, H, D] in ``q``'s dtype. fp32 inputs use IEEE fp32 dot products (no TF32).

    Raises:
        ValueError: ``num_splits`` < 1, ``H`` not a multiple of ``KVH``, RoPE tables not ``D`` wide,
            ``window`` < 0 or ``sinks`` not [H].
    """
    B, H, D = q.shape
    _, KVH, BS, _ = k_cache.shape
    if H % KVH:
        raise ValueError(f"paged_decode_attention_triton: {H} query heads are not a multiple of {KVH} KV heads")
    if num_splits is None:
        num_splits = decode_splits(B, KVH, max_len if max_len is not None else table.shape[1] * BS, num_sms(q.device))
    if num_splits < 1:
        raise ValueError(f"paged_decode_attention_triton: num_splits={num_splits} must be >= 1")
    rope = cos is not None
    if rope and not (cos.shape[-1] == sin.shape[-1] == D and cos.stride(-1) == sin.stride(-1) == 1):
        raise ValueError(f"paged_decode_attention_triton: RoPE tables {tuple(cos.shape)} must be [positions, {D}]")
    if window < 0:
        raise ValueError(f"paged_decode_attention_triton: window={window} must be >= 0 (0: full attention)")
    if sinks is not None and tuple(sinks.shape) != (H,):
        raise ValueError(f"paged_decode_attention_triton: sinks of shape {tuple(sinks.shape)}, expected [{H}]")
    G = H // KVH
    fp8 = k_cache.dtype in FP8_DTYPES
    small = D <= SMALL_HEAD_DIM and not fp8 and num_splits == 1
    block_n = block_n or (64 if small else 128 if fp8 or num_splits <= BLOCK_N_128_MAX_SPLITS else 64)
    num_warps = num_warps or (2 if small else 4)
    out = torch.empty_like(q)
    pm, pl, pacc = split_partials(out, num_splits)
    _paged_decode_kernel[(B, KVH, num_splits)](
        q,
        k_new,
        v_new,
        k_cache,
        v_cache,
        table,
        lens,
        write_block,
        write_offset,
        out,
        pm,
        pl,
        pacc,
        cos if rope else q,
        sin if rope else q,
        sinks if sinks is not None else q,
        D**-0.5 if scale is None else scale,
        window or 1 << 30,
        q.stride(0),
        q.stride(1),
        k_new.stride(0),
        k_new.stride(1),
        v_new.stride(0),  # its own strides: with QK-norm or eager RoPE k is a new tensor, v a view of the qkv output
        v_new.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        table.stride(0),
        out.stride(0),
        out.stride(1),
        cos.stride(0) if rope else 0,
        H=H,
        G=G,
        G_PAD=max(16, triton.next_power_of_2(G)),
        D=D,
        BS=BS,
        BLOCK_N=block_n,
        SPLITS=num_splits,
        MIN_KEYS=-(-MIN_KEYS_PER_SPLIT // block_n) * block_n,
        IEEE=q.dtype == torch.float32,
        KV_FP8=fp8,
        FP8_MAX=torch.finfo(k_cache.dtype).max if fp8 else 0.0,
        RESCALE=RESCALE_LOG2,
        ROPE=rope,
        HAS_SINKS=sinks is not None,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    combine_splits(pm, pl, pacc, out)
    return out


def split_partials(out: torch.Tensor, num_splits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The per-split partial results of a split decode into ``out`` [B, H, D]: running max and sum [B, H, S]
    and accumulator [B, H, S, D] in fp32 (``out`` itself, unused, for one split)."""
    if num_splits == 1:
        return out, out, out
    B, H, D = out.shape
    pm = torch.empty(B, H, num_splits, device=out.device, dtype=torch.float32)
    return pm, torch.empty_like(pm), torch.empty(B, H, num_splits, D, device=out.device, dtype=torch.float32)


def combine_splits(pm: torch.Tensor, pl: torch.Tensor, pacc: torch.Tensor, out: torch.Tensor) -> None:
    """Merge the splits' partials (:func:`split_partials`) into ``out`` [B, H, D] (nothing for one split)."""
    if pacc is out:
        return
    B, H, num_splits, D = pacc.shape
    _combine_splits_kernel[(B, H)](
        pm,
        pl,
        pacc,
        out,
        out.stride(0),
        out.stride(1),
        H=H,
        D=D,
        SPLITS=num_splits,
        S_PAD=max(2, triton.next_power_of_2(num_splits)),
        num_warps=4,
    )
