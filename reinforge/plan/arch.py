"""A decoder-only transformer's shape, read from its Hugging Face ``config.json``: the sizes the planner's
memory and time model (:mod:`.model`) needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .kv import kv_bytes_per_token, state_bytes_per_seq


@dataclass(frozen=True)
class Arch:
    """A decoder-only transformer's shape (from a Hugging Face ``config.json``).

    Attributes: sizes as in the config; ``num_params`` all parameters (embedding included once when
    tied); ``experts`` / ``experts_per_tok`` / ``moe_intermediate`` / ``shared_intermediate`` 0 for a
    dense model; ``moe_layers`` the sparse layers; ``windowed_layers`` the sliding-window layers
    (``layer_types``' ``sliding_attention``), whose KV cache holds only the last ``window`` tokens. A hybrid
    model (Qwen3-Next, Qwen3.5) has attention in ``kv_layers`` of its layers only (None: all) and a
    linear-attention mixer in the others (``mixer_params``: all layers' token mixers, counted by the family; 0:
    attention counted here), each sequence holding ``conv_state_elems`` (engine dtype) + ``rec_state_elems``
    (fp32) of fixed state in the engine instead of keys and values (``models.families.base.ConfigShape``).
    Multi-head latent attention (``deepseek_v3``; ``mla[1]`` = kv_lora_rank > 0): ``head_dim`` is a query
    head's width (``qk_nope_head_dim + qk_rope_head_dim``), ``mla`` = (q_lora_rank (0: a plain q_proj),
    kv_lora_rank, qk_rope_head_dim, v_head_dim), and the KV cache holds a latent of ``kv_lora_rank +
    qk_rope_head_dim`` per token and layer.
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
    kv_layers: int | None = None
    mixer_params: int = 0
    conv_state_elems: int = 0
    rec_state_elems: int = 0
    mla: tuple[int, int, int, int] = (0, 0, 0, 0)
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
        if cfg.get("kv_lora_rank"):
            return cls._from_mla_config(cfg)
        from ..models.shape import config_shape

        shape = config_shape(cfg)  # the family's reading of its cache (a hybrid's attention layers and states)
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
            kv_layers=shape.kv_layers,
            mixer_params=shape.mixer_params,
            conv_state_elems=shape.conv_state_elems,
            rec_state_elems=shape.rec_state_elems,
            windowed_layers=sum(1 for k in cfg.get("layer_types") or [] if k == "sliding_attention")
            if cfg.get("sliding_window")
            else 0,
            window=int(cfg.get("sliding_window") or 0),
        )

    @classmethod
    def _from_mla_config(cls, cfg: dict[str, Any]) -> Arch:
        """A multi-head latent attention model's (DeepSeek-V3's keys: ``n_routed_experts``,
        ``first_k_dense_replace``, ``moe_layer_freq``, ``n_shared_experts``)."""
        h, heads, layers = int(cfg["hidden_size"]), int(cfg["num_attention_heads"]), int(cfg["num_hidden_layers"])
        experts = int(cfg.get("n_routed_experts") or 0)
        first, freq = int(cfg.get("first_k_dense_replace") or 0), int(cfg.get("moe_layer_freq") or 1)
        moe_width = int(cfg.get("moe_intermediate_size") or 0)
        rope = int(cfg["qk_rope_head_dim"])
        return cls(
            vocab_size=int(cfg["vocab_size"]),
            hidden=h,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=heads,
            head_dim=int(cfg["qk_nope_head_dim"]) + rope,
            intermediate=int(cfg.get("intermediate_size") or 4 * h),
            tied=bool(cfg.get("tie_word_embeddings", False)),
            experts=experts,
            experts_per_tok=int(cfg.get("num_experts_per_tok") or 0),
            moe_intermediate=moe_width,
            shared_intermediate=int(cfg.get("n_shared_experts") or 0) * moe_width,
            moe_layers=sum(1 for i in range(layers) if experts and i >= first and i % freq == 0),
            mla=(int(cfg.get("q_lora_rank") or 0), int(cfg["kv_lora_rank"]), rope, int(cfg["v_head_dim"])),
        )

    @property
    def num_kv_layers(self) -> int:
        """The layers with attention (and keys and values in the engine)."""
        return self.num_layers if self.kv_layers is None else self.kv_layers

    @property
    def linear_layers(self) -> int:
        """The layers without attention (linear attention; 0 unless hybrid)."""
        return self.num_layers - self.num_kv_layers

    def state_bytes_per_seq(self, elem_bytes: float) -> float:
        """A sequence's fixed linear-attention state in the engine (0 unless hybrid;
        :func:`.kv.state_bytes_per_seq`)."""
        return state_bytes_per_seq(self.conv_state_elems, self.rec_state_elems, elem_bytes)

    def _mixers_delta(self) -> int:
        """The family's count of its token mixers (``mixer_params``) against Llama's attention in every layer."""
        if not self.mixer_params:
            return 0
        return self.mixer_params - self.num_layers * (self._attn_params() - 2 * self.hidden)

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def _attn_params(self) -> int:
        if self.mla[1]:  # q_a + q_b (or q_proj), kv_a_proj_with_mqa, kv_b_proj, o_proj, the norms
            q_lora, kv_lora, rope, v = self.mla
            h, H, qk = self.hidden, self.num_heads, self.head_dim
            q = h * q_lora + q_lora + q_lora * H * qk if q_lora else h * H * qk
            return q + h * (kv_lora + rope) + kv_lora + kv_lora * H * (qk - rope + v) + H * v * h + 2 * h
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
        return dense * self.layer_params() + self.moe_layers * self.layer_params(sparse=True) + self._mixers_delta()

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
        active = dense * self.layer_params() + self.moe_layers * self.layer_params(True, True) + self._mixers_delta()
        return active + self.head_params

    def kv_bytes_per_token(self, elem_bytes: float, tokens: float | None = None) -> float:
        """The engine's KV-cache bytes per token (:func:`.kv.kv_bytes_per_token`): 2 (K and V) x layers with
        attention x kv_heads x head_dim x dtype bytes; multi-head latent attention's engine caches layers x
        (kv_lora_rank + qk_rope_head_dim) x dtype bytes. With ``tokens``, the mean per token of a sequence that
        long: its sliding-window layers hold only ``min(tokens, window)`` tokens (the engine's rings)."""
        if self.mla[1]:
            return kv_bytes_per_token(self.num_layers, 1, self.mla[2], elem_bytes, kv_lora_rank=self.mla[1])
        windows = (self.window,) * self.windowed_layers
        return kv_bytes_per_token(
            self.num_kv_layers, self.num_kv_heads, self.head_dim, elem_bytes, windows=windows, tokens=tokens
        )

    def seq_kv_bytes(self, tokens: float, kv_elem_bytes: float, state_elem_bytes: float) -> float:
        """The engine's bytes for one sequence holding ``tokens``: its KV cache (:meth:`kv_bytes_per_token`, the
        windowed layers' rings counted) and a hybrid's fixed states (:meth:`state_bytes_per_seq`)."""
        return self.kv_bytes_per_token(kv_elem_bytes, tokens) * tokens + self.state_bytes_per_seq(state_elem_bytes)

    def weight_bytes(self, elem_bytes: float, tp: int = 1) -> float:
        """Bytes of every parameter at ``elem_bytes`` each, split over ``tp`` tensor-parallel ranks."""
        return self.num_params * elem_bytes / tp

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
