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
