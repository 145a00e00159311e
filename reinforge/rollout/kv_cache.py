"""Host-side bookkeeping of the engine's paged KV cache: which blocks each sequence holds.

The cache itself is two device tensors ``[layers, num_blocks + 1, kv_heads, block_size, head_dim]``
(the extra last block is a write sink for idle rows, never handed out). A sequence's keys for
positions ``[i * block_size, (i + 1) * block_size)`` live in block ``table[slot][i]``, so memory follows
the tokens a sequence holds, not ``max_model_len`` (the paged attention of vLLM: Kwon et al. 2023,
"Efficient Memory Management for Large Language Model Serving with PagedAttention").

Blocks are reference-counted: the ``n`` samples of a request share the prompt's full blocks, and
only the prompt's last, partial block is copied per sample (its rest is written by each sample).
"""

from __future__ import annotations


class OutOfBlocks(Exception):
    """No free block is left (the engine then preempts a sequence)."""


class BlockAllocator:
    """Free list and reference counts of ``num_blocks`` KV-cache blocks of ``block_size`` tokens.

    Args:
        num_blocks: blocks in the pool (ids ``0 .. num_blocks - 1``).
        block_size: tokens per block.
    """

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks={num_blocks} and block_size={block_size} must be >= 1")
        self.num_blocks, self.block_size = num_blocks, block_size
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() hands out low ids first
        self._refs = [0] * num_blocks
        self.peak_used = 0  # most blocks held at once (memory actually used)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def allocate(self, n: int) -> list[int]:
        """``n`` fresh blocks (reference count 1).

        Raises:
            OutOfBlocks: fewer than ``n`` are free (nothing is allocated then).
        """
        if n > len(self._free):
            raise OutOfBlocks(f"{n} blocks asked, {len(self._free)} free")
        out = [self._free.pop() for _ in range(n)]
        for b in out:
            self._refs[b] = 1
        self.peak_used = max(self.peak_used, self.num_blocks - len(self._free))
        return out

    def share(self, blocks: list[int]) -> list[int]:
        """Another holder of ``blocks`` (their reference counts go up by one); returns them."""
        for b in blocks:
            if self._refs[b] < 1:
                raise ValueError(f"block {b} is not allocated")
            self._refs[b] += 1
        return list(blocks)

    def free(self, blocks: list[int]) -> None:
        """Drop one reference to each block; a block with none left returns to the pool."""
        for b in blocks:
            if self._refs[b] < 1:
                raise ValueError(f"block {b} freed twice")
            self._refs[b] -= 1
            if self._refs[b] == 0:
                self._free.append(b)
