"""The engine's attention contexts: what the shared model code calls to read and write the KV cache.

:class:`~reinforge.models.transformer.CausalLM` runs attention through ``ctx.attend(layer, q, k, v)``
(``AttentionContext``). The runner builds one context per forward pass:

* :class:`PrefillContext`: causal attention over a chunk of right-padded prompts, writing their keys
  and values into their blocks (and, for a later chunk, reading the earlier chunks' keys back).
* a decode context, one new token per slot. Which one is chosen once, from the KV layout
  (:func:`decode_context`):

  - :class:`KernelDecode`: paged cache and the Triton kernel (CUDA), which walks each sequence's own
    blocks up to its own length and stores the new token's K/V itself (a multi-head latent attention
    model's latent cache: :mod:`.mla_decode`'s kernel);
  - :class:`GatherDecode`: paged cache without the kernel: the blocks are gathered into a padded key
    range and attended with a mask (the reference path; CPU tests of the paged layout);
  - :class:`SlotDecode`: one block per slot (the CPU default): the cache rows are the padded key
    range itself, views and no copies.

Shapes: ``q`` [B, T, H, D]; ``k``, ``v`` [B, T, KVH, D] with RoPE applied; per-layer caches
``[blocks + 1, KVH, block_size, D]`` (the last block is the sink idle rows write into). An fp8 cache
(``engine.kv_cache_dtype``) is written and read through :func:`.kv_cache.cache_write` /
:func:`.kv_cache.cache_read` (read back in the queries' dtype). Every path attends to the keys and
values as the cache holds them: a prefill chunk to its own rounded to the cache's format too, so
chunked prefill and a preempted sequence's recompute give the values of one pass.

Attention kinds: every context's ``attend`` takes the layer's ``window`` (sliding window in tokens, 0:
full), ``sinks`` ([H] logits or None) and ``scale`` (None: ``1/sqrt(D)``) as keywords
(:meth:`~reinforge.models.transformer.Attention.attention_kind`): prefill masks the band
(:func:`~reinforge.models.sdpa.window_mask`), the padded decode paths add a per-window bias
(-inf before ``pos - window + 1``), the kernel starts each sequence's loop at ``max(0, len - window)``;
sinks join every softmax's denominator.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from ..models.sdpa import sdpa, window_mask
from .kv_cache import cache_read, cache_write, to_cache
from .mla_decode import mla_decode_attention_triton
from .paged_attention import gather_blocks, masked_decode_attention, paged_decode_attention_triton

if TYPE_CHECKING:
    from .runner import ModelRunner


def bucket(n: int, cap: int, quantum: int = 8) -> int:
    """Round ``n`` up to a power of two (at least ``quantum``) or a multiple of 256, capped at ``cap``:
    the batch sizes and key ranges of decode steps (few shapes: few CUDA graphs and kernel variants)."""
    if n <= 256:
        b = max(quantum, 1 << max(0, math.ceil(math.log2(max(n, 1)))))
    else:
        b = -(-n // 256) * 256
    return min(b, cap)


class PrefillContext:
    """Causal attention over a chunk of a right-padded prompt batch, positions ``[start, start + T)``;
    writes the chunk's K/V into each prompt's blocks. With ``start > 0`` (chunked prefill) the chunk
    also attends to the keys of positions ``[0, start)``, read back from the cache.

    ``blk``, ``off``: [P, T] block id and offset of each (prompt, chunk position); the sink block
    for padding positions that have no block. ``prefix_blk``, ``prefix_off``: [P, start], the same
    for the earlier positions.
    """

    caches_kv = True  # (a multi-head latent attention layer passes its latent: models/mla.py)

    def __init__(
        self,
        runner: ModelRunner,
        blk: torch.Tensor,
        off: torch.Tensor,
        prefix_blk: torch.Tensor | None = None,
        prefix_off: torch.Tensor | None = None,
    ):
        self.r, self.blk, self.off = runner, blk.flatten(), off.flatten()
        self.start = 0 if prefix_blk is None else prefix_blk.shape[1]
        # the cache index of the earlier positions' keys
        self.prefix = (prefix_blk.flatten(), slice(None), prefix_off.flatten()) if self.start else None
        self.ring: tuple[torch.Tensor, tuple | None] | None = None  # the ring layers' (write block, prefix index)
        # query i (position start + i) sees keys [0, start + i] (with a window, the last `window` of them)
        T = blk.shape[1]
        self._keys = torch.arange(self.start + T, device=blk.device)[None, :]
        self._queries = self.start + torch.arange(T, device=blk.device)[:, None]
        self._masks: dict[int, torch.Tensor] = {}
        if self.start:
            self.mask = self.window_mask(0)

    def window_mask(self, window: int) -> torch.Tensor:
        """[T, start + T] bool: the chunk's queries' visible keys (``window`` 0: causal)."""
        if window not in self._masks:
            self._masks[window] = window_mask(self._queries, self._keys, window)
        return self._masks[window]

    def set_ring(self, blk: torch.Tensor, prefix_blk: torch.Tensor | None) -> None:
        """The sliding-window layers' ring blocks (:mod:`.kv_cache`): ``blk`` [P, T] where each chunk position is
        written (the ring's sink for positions not kept), ``prefix_blk`` [P, start] where the earlier ones are
        read (those outside the window hold other positions by now: masked)."""
        off = self.off
        prefix = (prefix_blk.flatten(), slice(None), self.prefix[2]) if self.start else None
        self.ring = ((blk.flatten(), slice(None), off), prefix)

    def attend(self, layer, q, k, v, *, window: int = 0, sinks=None, scale=None):
        P, T, KVH, D = k.shape
        kc, vc = self.r.k_cache[layer], self.r.v_cache[layer]
        at, prefix = (self.blk, slice(None), self.off), self.prefix
        if self.ring is not None and self.r.is_ring[layer]:
            at, prefix = self.ring
        k8, v8 = to_cache(k, kc.dtype), to_cache(v, vc.dtype)  # rounded once: stored, and attended to below
        if self.start:  # (read before this chunk's writes: in a ring they may land where earlier positions were)
            k_prev = cache_read(kc, prefix, k.dtype).view(P, self.start, KVH, D)
            v_prev = cache_read(vc, prefix, v.dtype).view(P, self.start, KVH, D)
        cache_write(kc, at, k8.reshape(P * T, KVH, D))
        if vc is not kc:  # (a latent cache: the values are the keys' rows)
            cache_write(vc, at, v8.reshape(P * T, KVH, D))
        k, v = k8.to(k.dtype), v8.to(v.dtype)  # as the cache holds them
        mask = None
        if self.start:
            k = torch.cat([k_prev, k], dim=1)
            v = torch.cat([v_prev, v], dim=1)
        if self.start or window:
            mask = self.window_mask(window)
        return sdpa(q, k, v, mask, scale=scale, sinks=sinks)

    def latent_rows(self, layer: int, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Multi-head latent attention's prefill (:mod:`reinforge.models.mla`): store the chunk's latent rows
        [P, T, D] in the layer's cache and return the rows of positions ``[0, start + T)`` as the cache holds
        them ([P, start + T, D]) with the mask of this chunk's queries over them (None: causal). The layer
        expands them into per-head keys and values itself (plain attention; decode uses the absorbed form)."""
        P, T, D = rows.shape
        c = self.r.k_cache[layer]
        r8 = to_cache(rows, c.dtype)
        cache_write(c, (self.blk, slice(None), self.off), r8.reshape(P * T, 1, D))
        rows = r8.to(rows.dtype)
        if not self.start:
            return rows, None
        return torch.cat([cache_read(c, self.prefix, rows.dtype).view(P, self.start, D), rows], dim=1), self.mask


class _Decode:
    """One new token per slot in ``[0, B)`` at position ``pos``: its K/V goes to block
    ``table[slot, pos // block_size]`` at offset ``pos % block_size`` (the sink block for idle rows)."""

    caches_kv = True

    def __init__(self, runner: ModelRunner, B: int, Lk: int, pos: torch.Tensor, active: torch.Tensor):
        r, layout = runner, runner.layout
        self.r, self.B, self.Lk = r, B, Lk
        bs = layout.block_size
        page = (pos // bs).clamp(max=layout.blocks_per_seq - 1)
        blk = r.block_table[:B].gather(1, page[:, None])[:, 0].long()
        self.w_blk = torch.where(active, blk, layout.sink_block)
        self.w_off = pos % bs
        self.w_blk_ring = None
        if r.ring_table is not None:  # the sliding-window layers' rings (kv_cache.py)
            ring = r.ring_table[:B].gather(1, page[:, None])[:, 0].long()
            self.w_blk_ring = torch.where(active, ring, r.ring_sink)
        self.setup(pos, active)

    @staticmethod
    def key_range(longest: int, layout) -> int:
        """The key range ``Lk`` the step attends over, from the longest sequence after the step:
        a bucket (a multiple of 64, or of the block size when blocks are gathered) so that CUDA
        graphs and kernels see few shapes; 0 where each sequence's own length is read instead."""
        return bucket(longest, layout.block_size * layout.blocks_per_seq, quantum=64)

    def setup(self, pos: torch.Tensor, active: torch.Tensor) -> None:
        """The padded paths: a mask bias over keys ``[0, Lk)``, -inf past each row's position (and, for a
        windowed layer, before its window: :meth:`window_bias`)."""
        self.pos = pos
        self._biases: dict[int, torch.Tensor] = {}
        self.bias = self.window_bias(0)

    def window_bias(self, window: int) -> torch.Tensor:
        """[B, 1, 1, Lk] fp32: 0 where key ``j`` is visible from the row's position ``p`` (``j <= p``, and
        ``j > p - window`` for a window), -inf elsewhere; one per distinct window of the step."""
        if window not in self._biases:
            visible = window_mask(self.pos[:, None], self.r.arange[: self.Lk][None, :], window)
            self._biases[window] = torch.zeros(
                self.B, 1, 1, self.Lk, device=self.pos.device, dtype=torch.float32
            ).masked_fill_(~visible[:, None, None, :], float("-inf"))
        return self._biases[window]

    def write_block(self, layer: int) -> torch.Tensor:
        """[B] the block each row's new key goes to in layer ``layer``'s cache (pool or ring)."""
        return self.w_blk_ring if self.r.is_ring[layer] else self.w_blk

    def write(self, layer, k, v):
        kc, vc = self.r.k_cache[layer], self.r.v_cache[layer]
        at = (self.write_block(layer), slice(None), self.w_off)
        cache_write(kc, at, k[:, 0])
        if vc is not kc:
            cache_write(vc, at, v[:, 0])
        return kc, vc


class SlotDecode(_Decode):
    """One block per slot: block ``s`` holds slot ``s``'s keys, so rows ``[0, B)`` of the cache,
    cut at ``Lk``, are the padded key range (views, no copy)."""

    def attend(self, layer, q, k, v, *, window: int = 0, sinks=None, scale=None):
        kc, vc = self.write(layer, k, v)
        B, Lk = self.B, self.Lk
        keys, values = kc[:B, :, :Lk].to(q.dtype), vc[:B, :, :Lk].to(q.dtype)
        return masked_decode_attention(q[:, 0], keys, values, self.window_bias(window), scale=scale, sinks=sinks)[
            :, None
        ]


class GatherDecode(_Decode):
    """Paged cache without the kernel: each slot's first ``Lk / block_size`` blocks gathered into a
    padded key range."""

    @staticmethod
    def key_range(longest: int, layout) -> int:
        Lk = _Decode.key_range(longest, layout)
        return -(-Lk // layout.block_size) * layout.block_size  # whole blocks are gathered

    def attend(self, layer, q, k, v, *, window: int = 0, sinks=None, scale=None):
        kc, vc = self.write(layer, k, v)
        nb, table = self.Lk // self.r.layout.block_size, self.r.table_of(layer)[0][: self.B]
        keys = gather_blocks(kc, table, nb, q.dtype)
        values = keys if vc is kc else gather_blocks(vc, table, nb, q.dtype)
        return masked_decode_attention(q[:, 0], keys, values, self.window_bias(window), scale=scale, sinks=sinks)[
            :, None
        ]


class KernelDecode(_Decode):
    """Paged cache and the Triton kernel: it reads each sequence's own length (idle rows see one key)
    and stores the new token's K/V itself. ``Lk`` here only chooses how many programs share a long
    sequence's keys (split-K, :func:`~.paged_attention.decode_splits`): a power-of-two bound of the
    longest length, so short contexts keep the single-pass kernel and few graph shapes arise."""

    @staticmethod
    def key_range(longest: int, layout) -> int:
        return min(1 << max(0, math.ceil(math.log2(max(longest, 1)))), layout.block_size * layout.blocks_per_seq)

    def setup(self, pos: torch.Tensor, active: torch.Tensor) -> None:
        self.lens = torch.where(active, pos + 1, 1)
        # the kernel rotates q and the new key itself where every layer would run the in-place RoPE
        # kernel (one launch fewer per layer); the model's Attention asks ``applies_rope``
        model = self.r.model
        attns = [layer.self_attn for layer in model.model.layers if hasattr(layer, "self_attn")]
        # (one table only: a family with the windowed layers' own RoPE table rotates them in the layers)
        local = getattr(model, "rope_local_cos", None)
        self.applies_rope = all(getattr(a, "rotates_in_place", False) for a in attns) and not (
            local is not None and local.numel()
        )
        self.rope = (model.rope_cos, model.rope_sin) if self.applies_rope else (None, None)

    def attend(self, layer, q, k, v, *, window: int = 0, sinks=None, scale=None):
        r = self.r
        if r.v_cache is r.k_cache:  # a multi-head latent attention model's latent cache (engine/mla_decode.py)
            return mla_decode_attention_triton(
                q[:, 0],
                k[:, 0, 0],
                r.k_cache[layer],
                r.model.args.kv_lora_rank,
                r.block_table,
                self.lens,
                self.w_blk,
                self.w_off,
                max_len=self.Lk,
            )[:, None]
        cos, sin = self.rope
        return paged_decode_attention_triton(
            q[:, 0],
            k[:, 0],
            v[:, 0],
            r.k_cache[layer],
            r.v_cache[layer],
            r.table_of(layer)[0],
            self.lens,
            self.write_block(layer),
            self.w_off,
            max_len=self.Lk,
            cos=cos,
            sin=sin,
            window=window,
            sinks=sinks,
            scale=scale,
        )[:, None]


def decode_context(paged: bool, kernel: bool) -> type[_Decode]:
    """The decode context class for a KV layout (chosen once when the cache is allocated)."""
    if not paged:
        return SlotDecode
    return KernelDecode if kernel else GatherDecode
