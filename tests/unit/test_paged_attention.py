"""Decode attention over the paged KV cache: the gathered torch path, and the Triton kernel
(single pass and split-K) against it.

The kernel tests run on CUDA, or on a CPU under Triton's interpreter (``TRITON_INTERPRET=1`` set
before the run, with Triton installed; fp32 only: the interpreter's bf16 ``tl.dot`` is wrong);
otherwise they skip.
"""

import os

import pytest
import torch

from reinforge.engine import paged_attention as pa
from reinforge.engine.kv_cache import cache_write, to_cache
from reinforge.engine.paged_attention import (
    decode_splits,
    gather_blocks,
    masked_decode_attention,
    paged_decode_attention_triton,
)
from reinforge.utils.triton import triton, triton_available

if triton_available("cuda"):
    KERNEL_DEVICE = "cuda"
elif triton is not None and os.environ.get("TRITON_INTERPRET") == "1":
    KERNEL_DEVICE = "cpu"
else:
    KERNEL_DEVICE = None
needs_kernel = pytest.mark.skipif(
    KERNEL_DEVICE is None, reason="the Triton kernel needs CUDA, or Triton with TRITON_INTERPRET=1"
)
needs_cuda = pytest.mark.skipif(not triton_available("cuda"), reason="CUDA graphs need CUDA")


def _paged_case(B=5, H=6, KVH=2, D=16, BS=4, dtype=torch.float32, device="cpu", seed=0, lens=None):
    """A random paged cache whose blocks are scattered, plus the same keys laid out contiguously."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, 23, (B,), generator=g) if lens is None else torch.tensor(lens)
    B = lens.shape[0]
    mb = -(-int(lens.max()) // BS)
    perm = torch.randperm(B * mb, generator=g)
    table = perm.view(B, mb).to(torch.int32)
    k = torch.randn(B * mb + 1, KVH, BS, D, generator=g)
    v = torch.randn(B * mb + 1, KVH, BS, D, generator=g)
    q = torch.randn(B, H, D, generator=g)
    to = dict(device=device, dtype=dtype)
    return q.to(**to), k.to(**to), v.to(**to), table.to(device), lens.to(device), mb


def _bias(lens, Lk, window=0):
    """[B, 1, 1, Lk]: 0 for keys [0, lens[b]), -inf after (with a window, also -inf before lens[b] - window)."""
    keys = torch.arange(Lk, device=lens.device)[None, :]
    visible = keys < lens[:, None]
    if window:
        visible &= keys >= lens[:, None] - window
    return torch.zeros(visible.shape, device=lens.device).masked_fill(~visible, float("-inf"))[:, None, None]


def test_gathered_blocks_equal_reference_attention():
    q, k, v, table, lens, mb = _paged_case()
    keys, values = gather_blocks(k, table, mb), gather_blocks(v, table, mb)
    out = masked_decode_attention(q, keys, values, _bias(lens, keys.shape[2]))
    for b in range(q.shape[0]):  # per sequence, plain softmax attention over its own keys
        n = int(lens[b])
        kk = keys[b, :, :n].repeat_interleave(3, 0)  # [H, n, D]
        vv = values[b, :, :n].repeat_interleave(3, 0)
        ref = torch.softmax((q[b][:, None] * kk).sum(-1) / 4.0, -1)[:, None] @ vv
        torch.testing.assert_close(out[b], ref[:, 0], atol=1e-5, rtol=1e-5)


def test_decode_splits():
    # 16 sequences x 2 KV heads on an H100 (132 SMs): 4 * 132 / 32 -> 17 pieces of a 32k context
    assert decode_splits(16, 2, 32768, 132) == 17
    assert decode_splits(64, 2, 32768, 132) == 5
    assert decode_splits(16, 2, 1000, 132) == 4  # capped: >= 256 keys per piece
    assert decode_splits(16, 2, 256, 132) == 1  # short context: the single-pass kernel
    assert decode_splits(1024, 2, 32768, 132) == 1  # big batch: enough programs already
    assert decode_splits(1, 1, 10**6, 132) == pa.MAX_SPLITS
    with pytest.raises(ValueError, match="num_seqs=0"):
        decode_splits(0, 2, 100, 132)


def kernel_case(
    H, KVH, D, BS, dtype, device, seed=0, lens=None, cache_dtype=None, v_in_qkv=False, window=0, sinks=None, **kw
):
    """Kernel output and cache after the call, against the reference: write the new K/V, then
    gather and attend (``cache_dtype``: an 8-bit cache, written through ``cache_write`` and read
    back in fp32; ``v_in_qkv``: the new value a view of a packed [B, H + 2 KVH, D] projection output
    while the new key is its own tensor, as after QK-norm or eager RoPE). Returns (out, ref,
    cache_after, cache_ref)."""
    sinks = None if sinks is None else sinks.to(device)
    q, k, v, table, lens, mb = _paged_case(
        B=37, H=H, KVH=KVH, D=D, BS=BS, dtype=dtype, device=device, seed=seed, lens=lens
    )
    if cache_dtype is not None:
        k, v = to_cache(k, cache_dtype), to_cache(v, cache_dtype)
    g = torch.Generator().manual_seed(seed + 1)
    kn = torch.randn(q.shape[0], KVH, D, generator=g).to(device=device, dtype=dtype)
    vn = torch.randn(q.shape[0], KVH, D, generator=g).to(device=device, dtype=dtype)
    if cache_dtype is not None:  # beyond the 8-bit format's range: saturated where stored and where attended
        kn[0, 0, 0], vn[1, 0, 1] = 1e6, -1e6
    if v_in_qkv:
        qkv = torch.randn(q.shape[0], H + 2 * KVH, D, generator=g).to(device=device, dtype=dtype)
        qkv[:, H + KVH :] = vn
        vn = qkv[:, H + KVH :]
    pos = lens - 1
    w_blk = table.long().gather(1, (pos // BS)[:, None])[:, 0]
    w_off = pos % BS
    k_ref, v_ref = k.clone(), v.clone()
    cache_write(k_ref, (w_blk, slice(None), w_off), kn)
    cache_write(v_ref, (w_blk, slice(None), w_off), vn)
    keys, values = gather_blocks(k_ref, table, mb, torch.float32), gather_blocks(v_ref, table, mb, torch.float32)
    ref = masked_decode_attention(q.float(), keys, values, _bias(lens, keys.shape[2], window), sinks=sinks)
    out = paged_decode_attention_triton(q, kn, vn, k, v, table, lens, w_blk, w_off, window=window, sinks=sinks, **kw)
    return out.float(), ref, (k, v), (k_ref, v_ref)


def _check(case, tol):
    out, ref, cache, cache_ref = case
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    for c, c_ref in zip(cache, cache_ref):  # (bytes: torch.equal does not take every float8 type)
        assert torch.equal(
            c.view(torch.uint8) if c.element_size() == 1 else c,
            c_ref.view(torch.uint8) if c.element_size() == 1 else c_ref,
        )


DTYPES = [(torch.float32, 1e-5)] + ([(torch.bfloat16, 2e-2)] if KERNEL_DEVICE == "cuda" else [])
# one key only (the new token), lengths on and off block boundaries, one long enough for 8 pieces
LENS = [1, 2, 3, 15, 16, 17, 31, 33, 47, 64, 65, 100, 129, 130]


@needs_kernel
@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_single_pass_kernel_equals_gathered_attention(dtype, tol):
    for H, KVH, D, BS in [(9, 3, 64, 16), (14, 2, 64, 16), (8, 8, 128, 32)]:
        _check(kernel_case(H, KVH, D, BS, dtype, KERNEL_DEVICE, block_n=16, num_splits=1), tol)


@needs_kernel
@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_kernel_reads_the_new_value_with_its_own_strides(dtype, tol, num_splits):
    """The new value a view of the packed q/k/v output (batch stride (H + 2 KVH) D), the new key a
    tensor of its own (stride KVH D): Qwen3's QK-norm, GLM's partial RoPE. Reading the value with the
    key's strides gave every sequence but the first another row's value (found on the H100 with
    glm4_moe, 2026-11-25)."""
    _check(kernel_case(8, 2, 16, 16, dtype, KERNEL_DEVICE, v_in_qkv=True, num_splits=num_splits), tol)


@needs_kernel
@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("num_splits", [2, 3, 8, 20])
def test_split_kernel_equals_gathered_attention(dtype, tol, num_splits, monkeypatch):
    """Pieces of >= 16 keys, so these lengths give full, partial and empty pieces (20 pieces of
    at most 130 keys: most are empty and must weigh nothing in the combination)."""
    monkeypatch.setattr(pa, "MIN_KEYS_PER_SPLIT", 16)
    for H, KVH, D, BS in [(12, 2, 64, 16), (6, 3, 32, 4)]:
        _check(kernel_case(H, KVH, D, BS, dtype, KERNEL_DEVICE, lens=LENS, block_n=16, num_splits=num_splits), tol)


@needs_kernel
@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("num_splits", [1, 3, 8])
@pytest.mark.parametrize("window", [0, 1, 5, 16, 40])
def test_kernel_sliding_window_and_sinks_equal_gathered_attention(dtype, tol, num_splits, window, monkeypatch):
    """A sliding window (each sequence's loop starts at ``max(0, len - window)``: windows of one key, off
    and on block boundaries, longer than some sequences) and attention sinks (a logit per query head in
    split 0's running max and sum), alone and together, against the masked reference."""
    monkeypatch.setattr(pa, "MIN_KEYS_PER_SPLIT", 16)
    sinks = torch.randn(6, generator=torch.Generator().manual_seed(5)) * 2
    for s in (None, sinks):
        case = kernel_case(
            6, 2, 32, 4, dtype, KERNEL_DEVICE, lens=LENS, block_n=16, num_splits=num_splits, window=window, sinks=s
        )
        _check(case, tol)


def test_masked_decode_attention_window_and_sinks_reference():
    """The torch reference's window bias and sinks against a per-sequence softmax written out: keys
    [len - window, len) and the sink's exp(logit) in each head's denominator."""
    q, k, v, table, lens, mb = _paged_case()
    keys, values = gather_blocks(k, table, mb), gather_blocks(v, table, mb)
    sinks, window = torch.randn(6, generator=torch.Generator().manual_seed(1)), 4
    out = masked_decode_attention(q, keys, values, _bias(lens, keys.shape[2], window), scale=0.3, sinks=sinks)
    for b in range(q.shape[0]):
        n = int(lens[b])
        lo = max(0, n - window)
        kk = keys[b, :, lo:n].repeat_interleave(3, 0)
        vv = values[b, :, lo:n].repeat_interleave(3, 0)
        e = ((q[b][:, None] * kk).sum(-1) * 0.3).exp()
        ref = (e / (e.sum(-1, keepdim=True) + sinks.exp()[:, None]))[:, None] @ vv
        torch.testing.assert_close(out[b], ref[:, 0], atol=1e-5, rtol=1e-5)


@needs_kernel
@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_kernel_applies_rope_to_the_query_and_the_new_key(dtype, tol, num_splits, monkeypatch):
    """With the RoPE tables the kernel rotates q and the new key at each sequence's position
    (``lens - 1``) itself: the same output, and the same rotated key in the cache, as rotating them
    first (``apply_rope``, the model's eager RoPE) and calling it without tables."""
    from reinforge.models.transformer import apply_rope, rope_tables

    monkeypatch.setattr(pa, "MIN_KEYS_PER_SPLIT", 16)
    H, KVH, D, BS = 6, 2, 32, 16
    q, k, v, table, lens, _ = _paged_case(
        B=len(LENS), H=H, KVH=KVH, D=D, BS=BS, dtype=dtype, device=KERNEL_DEVICE, lens=LENS
    )
    cfg = type("Cfg", (), {"rope_theta": 10000.0, "rope_parameters": None, "rope_scaling": None})()
    cos, sin = (t.to(KERNEL_DEVICE) for t in rope_tables(cfg, D, 256))
    g = torch.Generator().manual_seed(3)
    kn = torch.randn(len(LENS), KVH, D, generator=g).to(device=KERNEL_DEVICE, dtype=dtype)
    vn = torch.randn(len(LENS), KVH, D, generator=g).to(device=KERNEL_DEVICE, dtype=dtype)
    pos = lens - 1
    w_blk, w_off = table.long().gather(1, (pos // BS)[:, None])[:, 0], pos % BS
    c, s = cos[pos][:, None].to(dtype), sin[pos][:, None].to(dtype)  # [B, 1, D]: the model's rounding
    rot = apply_rope(torch.cat([q, kn], 1)[:, None], c, s)[:, 0]
    kw = dict(block_n=16, num_splits=num_splits)
    k1, v1, k2, v2 = k.clone(), v.clone(), k.clone(), v.clone()
    ref = paged_decode_attention_triton(
        rot[:, :H].contiguous(), rot[:, H:].contiguous(), vn, k1, v1, table, lens, w_blk, w_off, **kw
    )
    out = paged_decode_attention_triton(q, kn, vn, k2, v2, table, lens, w_blk, w_off, cos=cos, sin=sin, **kw)
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(k2.float(), k1.float(), atol=tol, rtol=tol)
    assert torch.equal(v2, v1)
    with pytest.raises(ValueError, match="RoPE tables"):
        paged_decode_attention_triton(q, kn, vn, k2, v2, table, lens, w_blk, w_off, cos=cos[:, :16], sin=sin[:, :16])


FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
needs_fp8 = pytest.mark.skipif(
    KERNEL_DEVICE != "cuda" or torch.cuda.get_device_capability() < (8, 9),
    reason="Triton's fp8 conversions: CUDA, compute capability 8.9+",
)


@needs_fp8
@pytest.mark.parametrize("cache_dtype", FP8, ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_kernel_over_an_fp8_cache_equals_gathered_attention(cache_dtype, dtype, tol, num_splits, monkeypatch):
    """An 8-bit cache (engine.kv_cache_dtype): the kernel converts the keys it loads, and stores
    the new token rounded and saturated exactly as ``cache_write`` does (same bytes), attending to
    it rounded; the output equals attention over the rounded cache in fp32 (large new values
    saturate at the format's limit)."""
    monkeypatch.setattr(pa, "MIN_KEYS_PER_SPLIT", 16)
    for H, KVH, D, BS in [(12, 2, 64, 16), (8, 8, 128, 32)]:
        _check(
            kernel_case(
                H,
                KVH,
                D,
                BS,
                dtype,
                KERNEL_DEVICE,
                lens=LENS,
                cache_dtype=cache_dtype,
                block_n=16,
                num_splits=num_splits,
            ),
            tol,
        )


@needs_kernel
def test_split_kernel_default_piece_size_and_chosen_splits():
    """The default >= 256 keys per piece, and the split count chosen from the table's capacity."""
    lens = [1, 255, 256, 257, 600, 1023]
    case = kernel_case(4, 2, 32, 16, torch.float32, KERNEL_DEVICE, lens=lens, num_splits=3)
    _check(case, 1e-5)
    _check(kernel_case(4, 2, 32, 16, torch.float32, KERNEL_DEVICE, lens=lens), 1e-5)  # 4 pieces (1024 / 256)


def test_bad_split_count_is_refused():
    if triton is None:
        pytest.skip("Triton is not installed")
    q, k, v, table, lens, _ = _paged_case()
    z = torch.zeros(q.shape[0], dtype=torch.long)
    with pytest.raises(ValueError, match="num_splits=0"):
        paged_decode_attention_triton(q, k[:, :, 0], v[:, :, 0], k, v, table, lens, z, z, num_splits=0)


@needs_cuda
@pytest.mark.parametrize("num_splits", [1, 8])
def test_kernel_replays_in_a_cuda_graph(num_splits, monkeypatch):
    """The grid depends on the batch and the split count only: a graph captured at one set of
    lengths gives the right answer after the lengths (and the cache) change under it."""
    monkeypatch.setattr(pa, "MIN_KEYS_PER_SPLIT", 16)
    H, KVH, D, BS = 12, 2, 64, 16
    q, k, v, table, lens, mb = _paged_case(H=H, KVH=KVH, D=D, BS=BS, device="cuda", lens=LENS)
    kn, vn = torch.randn(2, q.shape[0], KVH, D, device="cuda").unbind(0)
    w_blk = torch.empty(q.shape[0], dtype=torch.long, device="cuda")
    w_off = torch.empty_like(w_blk)

    def where(lens_now):
        pos = lens_now - 1
        w_blk.copy_(table.long().gather(1, (pos // BS)[:, None])[:, 0])
        w_off.copy_(pos % BS)

    def run():
        return paged_decode_attention_triton(
            q, kn, vn, k, v, table, lens, w_blk, w_off, block_n=16, num_splits=num_splits
        )

    where(lens)
    run()  # compiles
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    new_lens = torch.tensor(LENS[::-1], device="cuda")  # other lengths, in place
    lens.copy_(new_lens)
    where(lens)
    k.normal_(), v.normal_(), q.normal_()
    graph.replay()
    k_ref, v_ref = k.clone(), v.clone()
    keys, values = gather_blocks(k_ref, table, mb), gather_blocks(v_ref, table, mb)  # K/V written by the replay
    ref = masked_decode_attention(q, keys, values, _bias(lens, keys.shape[2]))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert torch.equal(keys[torch.arange(q.shape[0]), :, lens - 1], kn)
