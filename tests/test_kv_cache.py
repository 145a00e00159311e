"""Block allocation of the paged KV cache, and the decode attention over it."""

import pytest
import torch

from reinforge.engine.kv_cache import BlockAllocator, OutOfBlocks
from reinforge.engine.paged_attention import gather_blocks, masked_decode_attention, paged_decode_attention_triton
from reinforge.utils.triton import triton_available


def test_allocate_share_free():
    a = BlockAllocator(4, block_size=16)
    assert a.blocks_for(1) == 1 and a.blocks_for(16) == 1 and a.blocks_for(17) == 2
    x = a.allocate(3)
    assert sorted(x) == [0, 1, 2] and a.num_free == 1
    a.share(x[:2])
    a.free(x)  # the two shared blocks keep one holder
    assert a.num_free == 2
    with pytest.raises(OutOfBlocks):
        a.allocate(3)
    assert a.num_free == 2  # a refused allocation takes nothing
    a.free(x[:2])
    assert a.num_free == 4
    with pytest.raises(ValueError, match="freed twice"):
        a.free([x[0]])


def _paged_case(B=5, H=6, KVH=2, D=16, BS=4, dtype=torch.float32, device="cpu", seed=0):
    """A random paged cache whose blocks are scattered, plus the same keys laid out contiguously."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, 23, (B,), generator=g)
    mb = -(-int(lens.max()) // BS)
    perm = torch.randperm(B * mb, generator=g)
    table = perm.view(B, mb).to(torch.int32)
    k = torch.randn(B * mb + 1, KVH, BS, D, generator=g)
    v = torch.randn(B * mb + 1, KVH, BS, D, generator=g)
    q = torch.randn(B, H, D, generator=g)
    to = dict(device=device, dtype=dtype)
    return q.to(**to), k.to(**to), v.to(**to), table.to(device), lens.to(device), mb


def _bias(lens, Lk):
    """[B, 1, 1, Lk]: 0 for keys [0, lens[b]), -inf after."""
    visible = torch.arange(Lk, device=lens.device)[None, :] < lens[:, None]
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


def triton_kernel_case(H, KVH, D, BS, dtype, device, seed=0):
    """Kernel output and cache after the call, against the reference: write the new K/V, then
    gather and attend. Returns (out, ref, cache_after, cache_ref)."""
    q, k, v, table, lens, mb = _paged_case(B=37, H=H, KVH=KVH, D=D, BS=BS, dtype=dtype, device=device, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    kn = torch.randn(q.shape[0], KVH, D, generator=g).to(device=device, dtype=dtype)
    vn = torch.randn(q.shape[0], KVH, D, generator=g).to(device=device, dtype=dtype)
    pos = lens - 1
    w_blk = table.long().gather(1, (pos // BS)[:, None])[:, 0]
    w_off = pos % BS
    k_ref, v_ref = k.clone(), v.clone()
    k_ref[w_blk, :, w_off], v_ref[w_blk, :, w_off] = kn, vn
    keys, values = gather_blocks(k_ref, table, mb).float(), gather_blocks(v_ref, table, mb).float()
    ref = masked_decode_attention(q.float(), keys, values, _bias(lens, keys.shape[2]))
    out = paged_decode_attention_triton(q, kn, vn, k, v, table, lens, w_blk, w_off, block_n=16)
    return out.float(), ref, (k, v), (k_ref, v_ref)


@pytest.mark.skipif(not triton_available("cuda"), reason="the Triton kernel runs on CUDA")
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_triton_kernel_equals_gathered_attention(dtype, tol):
    for H, KVH, D, BS in [(9, 3, 64, 16), (14, 2, 64, 16), (8, 8, 128, 32)]:
        out, ref, cache, cache_ref = triton_kernel_case(H, KVH, D, BS, dtype, "cuda")
        torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
        assert torch.equal(cache[0], cache_ref[0]) and torch.equal(cache[1], cache_ref[1])
