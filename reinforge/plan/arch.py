"""A decoder-only transformer's shape, read from its Hugging Face ``config.json``: the sizes the planner's
memory and time model (:mod:`.model`) needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Arch:
    """A decoder-only transformer's shape (from a Hugging Face ``config.json``).

    Attributes: sizes as in the config; ``num_params`` all parameters (embedding included once when
    tied); ``experts`` / ``experts_per_tok`` / ``moe_intermediate`` / ``shared_intermediate`` 0 for a
    dense model; ``moe_layers`` the sparse layers; ``windowed_layers`` the sliding-window layers
    (``layer_types``' ``sliding_attention``), whose KV cache holds only the last ``window`` tokens.
    """

    vocab_size: int
    hidden: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool = True
    qkv_bias: bool = False
    experts: int = 0
    experts_per_tok: int = 0
    moe_intermediate: int = 0
    shared_intermediate: int = 0
    moe_layers: int = 0
    windowed_layers: int = 0
    window: int = 0

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> Arch:
        """From a ``config.json`` dict (``text_config`` of a multimodal one).

        Raises:
            ShapeUnknown: a size key is missing (named in the message; a family with its own names).
        """
        from ..models.shape import require

        return require(cfg.get("text_config", cfg), cls._from_config)

    @classmethod
    def _from_config(cls, cfg: dict[str, Any]) -> Arch:
        h, heads, layers = int(cfg["hidden_size"]), int(cfg["num_attention_heads"]), int(cfg["num_hidden_layers"])
        experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
        step = int(cfg.get("decoder_sparse_step") or 1)
        dense_only = set(cfg.get("mlp_only_layers") or [])
        moe = sum(1 for i in range(layers) if experts and i not in dense_only and (i + 1) % step == 0)
        return cls(
            vocab_size=int(cfg["vocab_size"]),
            hidden=h,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or h // heads),
            intermediate=int(cfg.get("intermediate_size") or 4 * h),
            tied=bool(cfg.get("tie_word_embeddings", True)),
            qkv_bias=cfg.get("model_type") in ("qwen2", "qwen2_moe") or bool(cfg.get("attention_bias")),
            experts=experts,
            experts_per_tok=int(cfg.get("num_experts_per_tok") or 0),
            # an expert's width; families without the key (gpt_oss, mixtral) size experts by intermediate_size
            moe_intermediate=int(
                cfg.get("moe_intermediate_size") or (cfg.get("intermediate_size") if experts else 0) or 0
            ),
            shared_intermediate=int(cfg.get("shared_expert_intermediate_size") or 0),
            moe_layers=moe,
            windowed_layers=sum(1 for k in cfg.get("layer_types") or [] if k == "sliding_attention")
            if cfg.get("sliding_window")
            else 0,
            window=int(cfg.get("sliding_window") or 0),
        )

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def _attn_params(self) -> int:
        h, q, kv = self.hidden, self.q_dim, self.kv_dim
        return 2 * h * q + 2 * h * kv + (q + 2 * kv if self.qkv_bias else 0) + 2 * h

    def _dense_mlp(self) -> int:
        return 3 * self.hidden * self.intermediate

    def _moe_mlp(self, active: bool = False) -> int:
        h, e = self.hidden, (self.experts_per_tok if active else self.experts)
        shared = 3 * h * self.shared_intermediate + (h if self.shared_intermediate else 0)
        return e * 3 * h * self.moe_intermediate + h * self.experts + shared

    def layer_params(self, sparse: bool = False, active: bool = False) -> int:
        """Parameters of one decoder layer (``active``: those one token passes through)."""
        return self._attn_params() + (self._moe_mlp(active) if sparse else self._dense_mlp())

    @property
    def layers_params(self) -> int:
        dense = self.num_layers - self.moe_layers
        return dense * self.layer_params() + self.moe_layers * self.layer_params(sparse=True)

    @property
    def head_params(self) -> int:
        """The LM head's matrix (V x h), shared with the embedding when tied."""
        return self.vocab_size * self.hidden

    @property
    def num_params(self) -> int:
        return self.layers_params + self.head_params * (1 if self.tied else 2) + self.hidden

    @property
    def flop_params(self) -> int:
        """Parameters in a token's matmuls: the active layers and the LM head (not the embedding lookup)."""
        dense = self.num_layers - self.moe_layers
        return dense * self.layer_params() + self.moe_layers * self.layer_params(True, True) + self.head_params

    def kv_bytes_per_token(self, elem_bytes: float, tokens: float | None = None) -> float:
        """2 (K and V) x layers x kv_heads x head_dim x dtype bytes. With ``tokens``, the mean per token of a
        sequence that long: its sliding-window layers hold only ``min(tokens, window)`` tokens (the engine's
        rings, :mod:`reinforge.engine.kv_cache`)."""
        if not self.windowed_layers or not tokens:
            return 2 * self.num_layers * self.kv_dim * elem_bytes
        held = (self.num_layers - self.windowed_layers) * tokens + self.windowed_layers * min(tokens, self.window)
        return 2 * held / tokens * self.kv_dim * elem_bytes

    def kept_layer_bytes(self, sparse: bool = False, tp: int = 1) -> float:
        """Activation bytes per token one decoder layer keeps for its backward pass (module doc);
        the head- and column-split parts divided by the tensor-parallel size ``tp``."""
        h, q, kv = self.hidden, self.q_dim, self.kv_dim
        replicated, split = 14 * h, 4 * q + 4 * kv
        if sparse:
            k = self.experts_per_tok
            replicated += 2 * h + 8 * self.experts + 4 * h * k
            split += 6 * self.moe_intermediate * k
            if self.shared_intermediate:
                replicated, split = replicated + 4 * h, split + 6 * self.shared_intermediate
        else:
            replicated, split = replicated + 4 * h, split + 6 * self.intermediate
        return replicated + split / tp
