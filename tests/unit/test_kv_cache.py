"""Block allocation of the paged KV cache (the attention over it: test_paged_attention.py)."""

import pytest

from reinforge.engine.kv_cache import BlockAllocator, OutOfBlocks


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


def test_the_engine_and_the_check_size_a_gpu_pool_alike(monkeypatch):
    """Issue 54: the engine's GPU pool (plan_kv_layout) and the up-front check (preflight.memory_problems) decide
    what fits with one function (plan.kv.pool_fit) on the same bytes: the pool's blocks hold the layers not in
    sliding-window rings, the rings come first (the check used to count every layer in every block)."""
    from types import SimpleNamespace

    import torch

    from reinforge.config import EngineConfig
    from reinforge.engine.kv_cache import kv_cache_plan, plan_kv_layout
    from reinforge.plan.kv import pool_fit

    shape = SimpleNamespace(
        num_kv_layers=4, num_kv_heads=2, head_dim=8, kv_lora_rank=0, layer_windows=(32, 0, 32, 0),
        num_params=1000, conv_state_elems=0, rec_state_elems=0,
    )  # fmt: skip
    engine = EngineConfig(max_num_seqs=4, kv_block_size=16, kv_cache_memory_fraction=0.5)
    plan = kv_cache_plan(shape, engine, 256, torch.device("cpu"), torch.float32)
    assert (plan.ring_layers, plan.ring_blocks) == (2, 2)  # two windowed layers, 32 tokens in 2 blocks each
    assert plan.block_bytes == 16 * 2 * 2 * 2 * 8 * 4 and plan.ring_bytes == (4 * 2 + 1) * plan.block_bytes
    for free in (250_000, 400_000):  # 20 and 38 blocks of the 64 the slots would take
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device, free=free: (free, 10 * free))
        layout = plan_kv_layout(shape, torch.float32, torch.device("cuda"), engine, 256, False)
        _, fit = pool_fit(free // 2, plan.block_bytes, plan.ring_bytes, plan.slots)
        assert layout.num_blocks == min(plan.blocks, fit) < plan.blocks  # the GPU share caps the pool
