"""Host-side bookkeeping of the engine's paged KV cache: which blocks each sequence holds.

The cache itself is two device tensors ``[layers, num_blocks + 1, kv_heads, block_size, head_dim]``
(the extra last block is a write sink for idle rows, never handed out). A sequence's keys for
positions ``[i * block_size, (i + 1) * block_size)`` live in block ``table[slot][i]``, so memory follows
the tokens a sequence holds, not ``max_model_len`` (the paged attention of vLLM: Kwon et al. 2023,
"Efficient Memory Management for Large Language Model Serving with PagedAttention").

:func:`plan_kv_layout` chooses the block size and pool size once (:class:`KVLayout`).

Blocks are reference-counted: the ``n`` samples of a request share the prompt's full blocks, and
only the prompt's last, partial block is copied per sample (its rest is written by each sample).

The cache dtype is the engine's (bf16 on a GPU) or, with ``engine.kv_cache_dtype: fp8``, 8-bit floats
(:func:`kv_cache_dtype`): half the bytes a decode step reads per cached token, twice the tokens a
memory budget holds. Keys and values are stored with a scale of 1, saturated at the format's
largest finite value (:func:`to_cache`), and turned back into the model's dtype when read; vLLM's
``kv_cache_dtype="fp8"`` without calibrated scales (``k_scale = v_scale = 1.0``) does the same.

Sliding-window layers (paged layout): a layer of window ``W`` reads only a sequence's last ``W`` keys, so
its keys and values live apart from the pool, in a ring of ``ring_blocks = ceil(W_max / block_size)``
blocks per slot (``[slots * ring_blocks + 1, kv_heads, block_size, head_dim]`` per windowed layer, the
last block a write sink): position ``p`` of slot ``s`` goes to ring block ``s * ring_blocks + (p //
block_size) % ring_blocks`` (:func:`ring_table`), overwriting the position ``ring_blocks * block_size``
before it, which has left the window. So a windowed layer costs window-sized memory whatever the
sequence's length, and the pool's blocks (allocated, shared and freed as above) hold only the global
layers' keys. Every attention path takes the ring through the same block-table indexing (the
windowed layer's table is the ring table) and masks keys outside the window, so a ring block's older
contents are never attended to. A prefill chunk writes only its last ``ring_blocks * block_size``
positions and reads its earlier positions back before writing (:class:`~.attention.PrefillContext`);
the samples of a prompt get copies of its ring. The one-block-per-slot layout (CPU default) keeps
every layer in the slot's block.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ..config.engine import EngineConfig
    from ..plan.kv_plan import KVCachePlan


# engine.kv_cache_dtype -> storage dtype ("auto": the model's); vLLM's names
KV_CACHE_DTYPES = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
FP8_DTYPES = frozenset(KV_CACHE_DTYPES.values())


def kv_cache_dtype(name: str, model_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The storage dtype of the KV cache for ``engine.kv_cache_dtype``.

    Args:
        name: ``auto`` (the model's dtype), ``fp8`` / ``fp8_e4m3`` (float8 e4m3fn: 3 mantissa bits,
            finite up to 448) or ``fp8_e5m2`` (2 mantissa bits, up to 57344).
        model_dtype: the engine's weights' dtype.
        device: where the cache lives.

    Raises:
        ValueError: an unknown name, or e4m3 on a CUDA GPU before compute capability 8.9 (Ada,
            Hopper), whose Triton has no e4m3 conversion (e5m2 works there).
    """
    if name == "auto":
        return model_dtype
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"engine.kv_cache_dtype={name!r}: choose one of auto, {', '.join(KV_CACHE_DTYPES)}")
    dtype = KV_CACHE_DTYPES[name]
    if dtype == torch.float8_e4m3fn and device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        cap = ".".join(map(str, torch.cuda.get_device_capability(device)))
        raise ValueError(
            f"engine.kv_cache_dtype={name}: the e4m3 format needs a GPU of compute capability 8.9 or "
            f"later (Ada, Hopper); this one is {cap}: use fp8_e5m2 or auto"
        )
    return dtype


def to_cache(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` in the cache's dtype: unchanged when it already is; for an 8-bit float, clamped to the
    format's largest finite value first (saturation, not inf/NaN), scale 1."""
    if x.dtype == dtype:
        return x
    if dtype in FP8_DTYPES:
        big = torch.finfo(dtype).max
        x = x.clamp(-big, big)
    return x.to(dtype)


def _bytes(x: torch.Tensor) -> torch.Tensor:
    """An 8-bit-float tensor viewed as uint8 (indexing kernels take uint8 on every device and torch
    version, not all take float8); any other tensor unchanged."""
    return x.view(torch.uint8) if x.dtype in FP8_DTYPES else x


def cache_write(cache: torch.Tensor, index: tuple, values: torch.Tensor) -> None:
    """``cache[index] = values`` in the cache's dtype (:func:`to_cache`)."""
    _bytes(cache)[index] = _bytes(to_cache(values, cache.dtype))


def cache_read(cache: torch.Tensor, index: tuple, dtype: torch.dtype) -> torch.Tensor:
    """``cache[index]`` (a copy) in ``dtype``."""
    return _bytes(cache)[index].view(cache.dtype).to(dtype)


def cache_copy(cache: torch.Tensor, dst: tuple, src: tuple) -> None:
    """``cache[dst] = cache[src]``, bytes as they are."""
    b = _bytes(cache)
    b[dst] = b[src]


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


@dataclass(frozen=True)
class KVLayout:
    """The shape of the KV cache, chosen once when the engine allocates it.

    Attributes:
        block_size: tokens per block.
        blocks_per_seq: blocks of one sequence of ``max_model_len`` tokens (the block table's width);
            1 is the one-block layout (block ``s`` belongs to slot ``s``: padded per-slot caches).
        num_slots: sequences held at once (rows of the per-sequence state).
        num_blocks: blocks in the pool, not counting the sink block (id ``num_blocks``) that idle
            rows write into.
        ring_layers: the sliding-window layers whose keys live in per-slot rings (module doc), not in
            the pool; () for none.
        ring_blocks: each slot's ring, in blocks (0: no rings).
    """

    block_size: int
    blocks_per_seq: int
    num_slots: int
    num_blocks: int
    ring_layers: tuple[int, ...] = ()
    ring_blocks: int = 0

    @property
    def paged(self) -> bool:
        """Several blocks per sequence (a block table), as opposed to one block per slot."""
        return self.blocks_per_seq > 1

    @property
    def sink_block(self) -> int:
        return self.num_blocks


def bytes_per_block(
    num_layers: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype, kv_lora_rank: int = 0
) -> int:
    """Bytes of keys and values of one block over ``num_layers`` layers (a multi-head latent attention model's
    latent rows with ``kv_lora_rank``): the planner's per-token count, :func:`reinforge.plan.kv.kv_bytes_per_token`,
    x ``block_size``."""
    from ..plan.kv import kv_bytes_per_token

    return int(kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype.itemsize, kv_lora_rank)) * block_size


def ring_plan(args: Any, block_size: int, max_model_len: int, paged: bool) -> tuple[tuple[int, ...], int]:
    """(ring layers, ring blocks per slot) for a model's sliding-window layers (module doc): the layers of
    a window shorter than ``max_model_len`` whose ring is fewer blocks than a full sequence's; none in the
    one-block layout or for a model (or a :class:`~reinforge.models.families.base.ConfigShape`) of no
    windows."""
    windows = tuple(getattr(args, "layer_windows", ()) or ())
    if not paged or not windows:
        return (), 0
    layers = tuple(i for i, w in enumerate(windows) if 0 < w < max_model_len)
    if not layers:
        return (), 0
    blocks = -(-max(windows[i] for i in layers) // block_size)
    if blocks >= -(-max_model_len // block_size):
        return (), 0
    return layers, blocks


def kv_cache_plan(
    shape: Any, engine: EngineConfig, max_model_len: int, device: torch.device, weight_dtype: torch.dtype
) -> KVCachePlan:
    """The embedded engine's KV cache, linear-attention states and weights on a model of ``shape`` (a
    :class:`~reinforge.models.shape.ModelShape`) built with the ``engine`` section for ``max_model_len`` tokens
    per sequence on ``device`` with weights in ``weight_dtype``, as the planner counts them
    (:class:`reinforge.plan.kv_plan.KVCachePlan`): the layout :func:`plan_kv_layout` chooses, without the GPU's
    free-memory cap (on a GPU, ``blocks`` is then what the slots' full sequences take). The up-front checks of
    the policy's engine (:mod:`reinforge.preflight`), of the judge's (:mod:`reinforge.reward.judge_engine`) and
    the CPU placement's estimate (:mod:`reinforge.cluster.resources`) all read it.

    Raises:
        ValueError: an unknown ``engine.kv_cache_dtype`` (``engine.num_kv_blocks`` below one sequence is counted
            without the cap: :func:`reinforge.preflight.slot_problems` refuses it in words).
    """
    from ..plan.kv_plan import KVCachePlan
    from ..utils.triton import triton_available

    dtype, kernel = kv_cache_dtype(engine.kv_cache_dtype, weight_dtype, device), triton_available(device.type)
    try:
        layout = plan_kv_layout(shape, dtype, torch.device("cpu"), engine, max_model_len, kernel)
    except ValueError:  # engine.num_kv_blocks below one sequence: counted uncapped (the checks refuse it in words)
        uncapped = dataclasses.replace(engine, num_kv_blocks=0)
        layout = plan_kv_layout(shape, dtype, torch.device("cpu"), uncapped, max_model_len, kernel)
    return KVCachePlan(
        layout.num_slots,
        layout.num_blocks,
        layout.block_size,
        layout.blocks_per_seq,
        shape.num_kv_layers,
        shape.num_kv_heads,
        shape.head_dim,
        dtype.itemsize,
        weight_dtype.itemsize,
        shape.num_params,
        str(dtype).removeprefix("torch."),
        shape.kv_lora_rank,
        len(layout.ring_layers),
        layout.ring_blocks,
        shape.conv_state_elems,
        shape.rec_state_elems,
    )


def ring_table(slots: int, ring_blocks: int, width: int, device: torch.device | str | None = None) -> torch.Tensor:
    """[slots, width] int32: the windowed layers' block table, ``table[s, i] = s * ring_blocks + i % ring_blocks``
    (logical block ``i`` of slot ``s`` in its ring; the sink is block ``slots * ring_blocks``)."""
    s = torch.arange(slots, device=device)[:, None]
    i = torch.arange(width, device=device)[None, :]
    return (s * ring_blocks + i % ring_blocks).to(torch.int32)


def plan_kv_layout(
    args: Any,
    dtype: torch.dtype,
    device: torch.device,
    cfg: EngineConfig,
    max_model_len: int,
    kernel: bool,
    state_bytes: int = 0,
) -> KVLayout:
    """Choose the block size and the pool size.

    Args:
        args: the model's :class:`~reinforge.models.transformer.ModelArgs` or
            :class:`~reinforge.models.shape.ModelShape` (``num_kv_layers``: the layers with keys and values,
            KV heads, head size).
        dtype, device: of the cache (its storage dtype: :func:`kv_cache_dtype`).
        cfg: the ``engine`` config section (``max_num_seqs``, ``kv_block_size``, ``num_kv_blocks``,
            ``kv_cache_memory_fraction``).
        max_model_len: the longest prompt + response a slot holds.
        kernel: the Triton paged-attention kernel runs here (``kv_block_size: 0`` then means 16;
            otherwise one block of ``max_model_len`` per slot, the padded layout whose attention is a
            plain batched matmul, fastest on a CPU).
        state_bytes: a hybrid model's fixed state per slot (its linear-attention layers'; bytes). On CUDA
            the slots' states come out of the same ``kv_cache_memory_fraction`` first, at most half of it
            (fewer slots where ``max_num_seqs`` states would take more), the blocks get the rest.

    Returns:
        ``max_num_seqs`` slots and blocks for all of them at ``max_model_len``; on CUDA fewer blocks
        where ``kv_cache_memory_fraction`` of the free memory holds fewer (after the sliding-window
        layers' rings, :func:`ring_plan`); at most ``num_kv_blocks``.

    Raises:
        MemoryError: the free CUDA memory share holds less than one sequence of ``max_model_len``.
        ValueError: ``num_kv_blocks`` holds less than one sequence of ``max_model_len``.
    """
    from ..config.fields import unplanned

    cfg = unplanned(cfg)  # `auto` keys no planner resolved (a CPU run, an engine built outside a run)
    L, bs = max_model_len, cfg.kv_block_size
    if bs <= 0:
        bs = 16 if kernel else L
    bs = min(bs, L)
    per_seq = -(-L // bs)
    slots = cfg.max_num_seqs
    blocks = slots * per_seq
    rings, ring_blocks = ring_plan(args, bs, L, per_seq > 1)
    # the pool holds the global layers (a model of windowed layers only: bookkeeping blocks of no bytes)
    pool_layers = args.num_kv_layers - len(rings)
    per_block = max(
        1, bytes_per_block(pool_layers, args.num_kv_heads, args.head_dim, bs, dtype, getattr(args, "kv_lora_rank", 0))
    )
    ring_bytes = bytes_per_block(len(rings), args.num_kv_heads, args.head_dim, bs, dtype) * (slots * ring_blocks + 1)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        from ..plan.kv import pool_fit

        slots, fit = pool_fit(int(free * cfg.kv_cache_memory_fraction), per_block, ring_bytes, slots, state_bytes)
        if fit < per_seq:
            raise MemoryError(
                f"the KV cache for one sequence of {L} tokens (prompt + rollout.rollout_max_response_len) needs "
                f"{per_block * per_seq / 2**20:.0f} MiB but only {free / 2**20:.0f} MiB are free: lower "
                f"rollout.rollout_max_response_len or raise engine.kv_cache_memory_fraction"
            )
        blocks = min(slots * per_seq, fit)
    if cfg.num_kv_blocks:
        if cfg.num_kv_blocks < per_seq:
            raise ValueError(
                f"engine.num_kv_blocks={cfg.num_kv_blocks} holds less than one sequence of "
                f"max_model_len={L} ({per_seq} blocks of {bs} tokens)"
            )
        blocks = min(blocks, cfg.num_kv_blocks)
    if per_seq == 1:  # one block per slot
        slots = blocks
    return KVLayout(
        block_size=bs,
        blocks_per_seq=per_seq,
        num_slots=slots,
        num_blocks=blocks,
        ring_layers=rings,
        ring_blocks=ring_blocks,
    )
