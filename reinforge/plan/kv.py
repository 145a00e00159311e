"""Bytes of a model's KV cache and linear-attention states, per token and per sequence: the one place this
arithmetic lives. The planner (:class:`~.arch.Arch`), the up-front checks (:class:`~.kv_plan.KVCachePlan`,
:mod:`reinforge.cluster.resources`, the judge's engine) and the embedded engine's own allocation
(:func:`reinforge.engine.kv_cache.bytes_per_block`) all call these functions, so no two places count the
same bytes differently.

* keys and values: ``2 x layers x kv_heads x head_dim`` values per token (Llama, Qwen, GQA);
* multi-head latent attention (DeepSeek-V3, ``kv_lora_rank`` > 0): one latent row serving as both,
  ``layers x (kv_lora_rank + head_dim)`` values per token, ``head_dim`` the decoupled RoPE key's width
  (``qk_rope_head_dim``; DeepSeek-V3: 61 x 576 against 2 x 61 x 128 x 128 for its 128 heads expanded);
* sliding-window layers (Gemma 3, GPT-OSS): a layer of window ``W`` holds only the last ``W`` tokens of a
  sequence (the engine's rings), so over a sequence of ``T`` tokens it holds ``min(T, W) / T`` of a full
  layer per token;
* a hybrid model's linear-attention layers (Qwen3-Next) hold no keys and values but a fixed state per
  sequence: its convolution states in the engine's dtype and its recurrent states in fp32.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

FP32_BYTES = 4  # the recurrent states of linear attention are fp32 whatever the engine's dtype


def kv_values_per_token(num_layers: int, num_kv_heads: int, head_dim: int, kv_lora_rank: int = 0) -> int:
    """Values a KV cache holds per token over ``num_layers`` layers: keys and values, ``2 x num_layers x
    num_kv_heads x head_dim``; with multi-head latent attention (``kv_lora_rank`` > 0) one latent row,
    ``num_layers x (kv_lora_rank + head_dim)`` (``head_dim``: the RoPE key's width)."""
    if kv_lora_rank:
        return num_layers * (kv_lora_rank + head_dim)
    return 2 * num_layers * num_kv_heads * head_dim


def kv_bytes_per_token(
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    elem_bytes: float,
    kv_lora_rank: int = 0,
    windows: Sequence[int] = (),
    tokens: float | None = None,
) -> float:
    """Bytes per token of the KV cache of ``num_layers`` layers with keys and values, at ``elem_bytes`` per
    value (:func:`kv_values_per_token` x ``elem_bytes``). ``windows``: the sliding window of each windowed
    layer among them (one entry per layer; 0 entries are ignored); with ``tokens``, the mean per token of a
    sequence that long, each windowed layer holding ``min(tokens, window)`` of its tokens. Without ``tokens``
    (or windows): every layer holds every token."""
    full = kv_values_per_token(num_layers, num_kv_heads, head_dim, kv_lora_rank) * elem_bytes
    windowed = [w for w in windows if w]
    if not windowed or not tokens:
        return full
    held = (num_layers - len(windowed)) * tokens + sum(min(tokens, w) for w in windowed)
    return full * held / (num_layers * tokens)


def state_bytes_per_seq(conv_state_elems: int, rec_state_elems: int, elem_bytes: float) -> float:
    """Bytes of one sequence's fixed linear-attention states (0 for a model without them): its convolution
    states at ``elem_bytes`` (the engine's dtype) and its recurrent states in fp32."""
    return conv_state_elems * elem_bytes + FP32_BYTES * rec_state_elems


def shape_kv_bytes_per_token(shape: Any, elem_bytes: float, tokens: float | None = None) -> float:
    """:func:`kv_bytes_per_token` of a :class:`~reinforge.models.families.base.ConfigShape` (or a
    :class:`~reinforge.models.shape.ModelShape`, :class:`~reinforge.models.args.ModelArgs`: anything with
    ``num_kv_layers``, ``num_kv_heads``, ``head_dim``, ``kv_lora_rank`` and ``layer_windows``)."""
    windows = [w for w in getattr(shape, "layer_windows", ()) or () if w]
    return kv_bytes_per_token(
        shape.num_kv_layers, shape.num_kv_heads, shape.head_dim, elem_bytes, shape.kv_lora_rank, windows, tokens
    )


def shape_state_bytes(shape: Any, elem_bytes: float) -> float:
    """:func:`state_bytes_per_seq` of anything with ``conv_state_elems`` and ``rec_state_elems`` (0 without)."""
    return state_bytes_per_seq(getattr(shape, "conv_state_elems", 0), getattr(shape, "rec_state_elems", 0), elem_bytes)


def pool_fit(
    share: int, block_bytes: int, ring_bytes: int = 0, slots: int = 1, state_bytes: int = 0
) -> tuple[int, int]:
    """``(slots, blocks)`` a KV pool of ``share`` bytes (``engine.kv_cache_memory_fraction`` of the free GPU
    memory) holds: first the sliding-window layers' rings (``ring_bytes``), then the slots' fixed states
    (``state_bytes`` each, at most half of what is left: fewer slots where ``slots`` would take more), then blocks
    of ``block_bytes``, one of them the engine's sink block. The engine's allocation
    (:func:`reinforge.engine.kv_cache.plan_kv_layout`) and the up-front check
    (:func:`reinforge.preflight.memory_problems`) both decide with it; blocks may be below 0 (nothing fits)."""
    budget = share - ring_bytes
    if state_bytes:
        slots = max(1, min(slots, budget // 2 // state_bytes))
        budget -= slots * state_bytes
    return slots, budget // max(1, block_bytes) - 1  # (a pool of no layers: bookkeeping blocks of no bytes)


def kv_cache_words(shape: Any) -> str:
    """:func:`kv_values_per_token` of ``shape`` (anything with ``num_layers``, ``num_kv_heads``, ``head_dim`` and
    ``kv_lora_rank``) in words, for messages: ``2 x 30 layers x 3 KV heads x 64 head dim`` or ``27 layers x a
    latent of 512 + 64``."""
    if getattr(shape, "kv_lora_rank", 0):
        return f"{shape.num_layers} layers x a latent of {shape.kv_lora_rank} + {shape.head_dim}"
    return f"2 x {shape.num_layers} layers x {shape.num_kv_heads} KV heads x {shape.head_dim} head dim"
