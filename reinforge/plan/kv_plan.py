"""The embedded engine's KV cache as the up-front checks see it (:class:`KVCachePlan`; made by
:func:`reinforge.preflight.kv_cache_plan` from the engine's own layout planning)."""

from __future__ import annotations

from dataclasses import dataclass

from .kv import kv_values_per_token, state_bytes_per_seq


@dataclass
class KVCachePlan:
    """The embedded engine's KV cache (from the engine's own :func:`~reinforge.engine.kv_cache.plan_kv_layout`).

    Attributes:
        slots: sequences decoded at once.
        blocks: blocks in the pool (the engine adds one sink block).
        block_size: tokens per block.
        blocks_per_seq: blocks one sequence of ``max_model_len`` takes.
        num_layers, num_kv_heads, head_dim: the model's attention shape (layers with keys and values).
        elem_bytes: bytes per element of the cache dtype (``engine.kv_cache_dtype``; ``auto``: ``engine.dtype``).
        weight_elem_bytes: bytes per weight (``engine.dtype``).
        kv_dtype: the cache dtype's name (``bfloat16``, ``float8_e4m3fn``, ...).
        num_params: the model's parameters (the engine's weights).
        ring_layers, ring_blocks: the sliding-window layers kept in per-slot rings and each ring's blocks
            (:func:`~reinforge.engine.kv_cache.ring_plan`; 0: none): the pool holds the other layers.
        conv_state_elems, rec_state_elems: a hybrid model's linear-attention states per slot
            (:func:`.kv.state_bytes_per_seq`; 0: none).
    """

    slots: int
    blocks: int
    block_size: int
    blocks_per_seq: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    elem_bytes: int
    weight_elem_bytes: int
    num_params: int
    kv_dtype: str
    kv_lora_rank: int = 0  # multi-head latent attention: one latent row of kv_lora_rank + head_dim per token-layer
    ring_layers: int = 0
    ring_blocks: int = 0
    conv_state_elems: int = 0
    rec_state_elems: int = 0

    @property
    def bytes_per_token(self) -> int:
        """2 (keys and values) x layers x kv_heads x head_dim (or a latent) x dtype bytes
        (:func:`.kv.kv_values_per_token`)."""
        return (
            kv_values_per_token(self.num_layers, self.num_kv_heads, self.head_dim, self.kv_lora_rank) * self.elem_bytes
        )

    @property
    def bytes_per_token_layer(self) -> int:
        """Cache bytes of one token in one attention layer (0 for a model of linear-attention layers only)."""
        return self.bytes_per_token // self.num_layers if self.num_layers else 0

    @property
    def block_bytes(self) -> int:
        """Bytes of one block of the pool (the layers not kept in rings)."""
        return self.block_size * (self.num_layers - self.ring_layers) * self.bytes_per_token_layer

    @property
    def ring_bytes(self) -> int:
        """Bytes of the sliding-window layers' rings: every slot's and their sink block (0: no rings)."""
        return (self.slots * self.ring_blocks + 1) * self.block_size * self.ring_layers * self.bytes_per_token_layer

    @property
    def bytes(self) -> int:
        """Bytes of the keys and values, the sink block included (and the rings' sink block)."""
        return (self.blocks + 1) * self.block_bytes + self.ring_bytes

    @property
    def bytes_per_slot(self) -> int:
        """Bytes of one sequence of ``blocks_per_seq`` blocks (every layer holding every token)."""
        return self.blocks_per_seq * self.block_size * self.bytes_per_token

    @property
    def state_bytes_per_slot(self) -> int:
        """Bytes of one slot's linear-attention states (0 unless hybrid), at the engine's dtype."""
        return int(state_bytes_per_seq(self.conv_state_elems, self.rec_state_elems, self.weight_elem_bytes))

    @property
    def state_bytes(self) -> int:
        """Bytes of the slots' linear-attention states."""
        return self.slots * self.state_bytes_per_slot

    @property
    def weight_bytes(self) -> int:
        """Bytes of the engine's weights (``num_params`` x ``weight_elem_bytes``)."""
        return self.num_params * self.weight_elem_bytes

    @property
    def total(self) -> int:
        """Everything the engine allocates up front: the KV cache, the states, the weights."""
        return self.bytes + self.state_bytes + self.weight_bytes
