"""The architecture hyper-parameters of reinforge's own model (:class:`ModelArgs`), read from a
Hugging Face config by the model's family (:mod:`reinforge.models.families`).

Torch-free on purpose: the families' config mappings, the up-front checks and the shape
estimates read configs without building anything.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

# RoPE variants whose frequencies are fixed at load time (so a precomputed table is exact).
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class ModelArgs:
    """Architecture hyper-parameters, read from a Hugging Face config (``Family.model_args``).

    Attention: ``num_heads`` query heads and ``num_kv_heads`` key/value heads of ``head_dim``
    each; RoPE rotates the first ``rotary_dim`` dimensions of every query and key head (``head_dim``
    unless the config's ``partial_rotary_factor`` is below 1, as GLM-4.5's 0.5); ``qkv_bias`` /
    ``o_bias`` bias the q/k/v and the output projections; ``qk_norm``: an RMSNorm over each query and
    key head before RoPE (Qwen3). Mixture of experts (0 / () for dense models, see :mod:`.moe`):
    ``num_experts`` routed experts of width ``moe_intermediate_size``, ``num_experts_per_tok`` of
    them per token, in the decoder layers ``moe_layers`` (the others keep a dense MLP of
    ``intermediate_size``); ``shared_expert_intermediate_size``: the width of a shared expert every
    token goes through (0: none).

    Attention kinds (see :func:`~reinforge.models.sdpa.sdpa`): ``layer_windows`` gives each
    decoder layer's sliding window in tokens, 0 for full attention (``()``: every layer full): a
    query at position ``i`` sees the keys at positions ``j`` with ``i - window < j <= i`` (the
    query's own and the ``window - 1`` before it: transformers' ``sliding_window_overlay``,
    flash-attn's ``window_size=(window - 1, 0)``). ``attention_sinks``: every attention layer holds
    ``self_attn.sinks`` [num_heads], a learned logit per head that joins the softmax's denominator
    and attends to nothing (GPT-OSS). ``attn_scale``: the factor on q.k (0: ``head_dim ** -0.5``;
    Gemma's ``query_pre_attn_scalar ** -0.5``).
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    qk_norm: bool
    # mixture of experts (0 / () for dense models): see .moe
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    shared_expert_intermediate_size: int = 0
    moe_layers: tuple[int, ...] = ()  # the layers whose MLP is sparse (the others are dense)
    rotary_dim: int = 0  # 0: head_dim (see rotary_dims)
    kv_layers: tuple[int, ...] | None = None  # the layers with a KV cache (None: all; a hybrid's attention layers)
    # multi-head latent attention (DeepSeek-V3, models/mla.py): the engine caches a latent of
    # kv_lora_rank + head_dim (the decoupled RoPE key) values per token and layer, keys and values alike
    # (num_kv_heads is then 1); 0: plain keys and values
    kv_lora_rank: int = 0
    # attention kinds: per-layer sliding windows (0: full), learned sink logits per head, the q.k scale (0: 1/sqrt(D))
    layer_windows: tuple[int, ...] = ()
    attention_sinks: bool = False
    attn_scale: float = 0.0

    @property
    def num_kv_layers(self) -> int:
        """How many layers cache keys and values (the engine's cache rows)."""
        return self.num_layers if self.kv_layers is None else len(self.kv_layers)

    def window(self, layer: int) -> int:
        """Decoder layer ``layer``'s sliding window in tokens (0: full attention)."""
        return self.layer_windows[layer] if self.layer_windows else 0

    @property
    def windowed_layers(self) -> tuple[int, ...]:
        """The layers of a sliding window (their cache needs only the last ``window`` positions)."""
        return tuple(i for i, w in enumerate(self.layer_windows) if w)

    @property
    def rotary_dims(self) -> int:
        """The dimensions of each head that RoPE rotates (``head_dim`` unless partial)."""
        return self.rotary_dim or self.head_dim

    @classmethod
    def from_hf_config(cls, cfg: Any) -> ModelArgs:
        """Build from a ``transformers.PretrainedConfig`` through its family's config mapping
        (:func:`reinforge.models.families.family_of`).

        Raises:
            NotImplementedError: the model type is not a registered family (the message lists the
                registered ones), or one of its options is not implemented natively; callers fall
                back to the Hugging Face model.
        """
        from .families import family_of

        return family_of(cfg).model_args(cfg)

    def with_(self, **changes: Any) -> ModelArgs:
        """A copy with ``changes`` (``dataclasses.replace``)."""
        return replace(self, **changes)


def check_common(
    cfg: Any, layer_kinds: tuple[str, ...] = ("full_attention",), activations: tuple[str, ...] = ("silu",)
) -> None:
    """Refuse the options no family implements natively: an activation outside ``activations``, MLP
    biases, sliding-window layers (unless ``layer_kinds`` has ``sliding_attention``: the family runs
    them, :func:`layer_windows`), RoPE types whose frequencies change at run time (dynamic, longrope).

    Raises:
        NotImplementedError: naming the option (``build_model`` then falls back to transformers).
    """
    act = getattr(cfg, "hidden_activation", None) or getattr(cfg, "hidden_act", "silu")
    if act not in activations:
        raise NotImplementedError(f"hidden_act {act!r} (only {' / '.join(map(repr, activations))})")
    if getattr(cfg, "mlp_bias", False):
        raise NotImplementedError("mlp_bias=True")
    kinds = set(getattr(cfg, "layer_types", None) or []) - set(layer_kinds)
    windows = "sliding_attention" in layer_kinds
    if (getattr(cfg, "use_sliding_window", False) and not windows) or "sliding_attention" in kinds:
        raise NotImplementedError("sliding-window attention layers")
    if kinds:
        raise NotImplementedError(f"layer_types {sorted(kinds)}")
    rope_type = rope_parameters(cfg).get("rope_type", "default")
    if rope_type not in STATIC_ROPE_TYPES:
        raise NotImplementedError(f"rope_type {rope_type!r}")


def dense_args(
    cfg: Any,
    *,
    qkv_bias: bool,
    o_bias: bool,
    qk_norm: bool,
    layer_kinds: tuple[str, ...] = ("full_attention",),
    activations: tuple[str, ...] = ("silu",),
) -> ModelArgs:
    """The attention and dense-MLP fields every family reads the same way (after
    :func:`check_common`); the three flags are what families differ in. ``rotary_dim`` follows
    ``partial_rotary_factor`` (:func:`rotary_dim`); ``layer_windows`` follows ``layer_types`` and
    ``sliding_window`` where ``layer_kinds`` has ``sliding_attention`` (:func:`layer_windows`)."""
    check_common(cfg, layer_kinds, activations)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return ModelArgs(
        model_type=cfg.model_type,
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=int(getattr(cfg, "intermediate_size", 0) or 0),  # (0: every layer sparse, Qwen3.5-MoE)
        num_layers=cfg.num_hidden_layers,
        num_heads=cfg.num_attention_heads,
        num_kv_heads=getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
        head_dim=head_dim,
        rms_norm_eps=cfg.rms_norm_eps,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        qk_norm=qk_norm,
        rotary_dim=rotary_dim(cfg, head_dim),
        layer_windows=layer_windows(cfg) if "sliding_attention" in layer_kinds else (),
    )


def layer_windows(cfg: Any) -> tuple[int, ...]:
    """Each decoder layer's sliding window: ``sliding_window`` for the ``sliding_attention`` entries of
    ``layer_types``, 0 for the others; ``()`` when no layer is windowed (no ``layer_types``, or no
    ``sliding_attention`` in it).

    Raises:
        ValueError: ``layer_types`` is not ``num_hidden_layers`` long, or a windowed layer's
            ``sliding_window`` is not an integer >= 1 (naming config.json's keys).
    """
    kinds = list(getattr(cfg, "layer_types", None) or [])
    if "sliding_attention" not in kinds:
        return ()
    if len(kinds) != cfg.num_hidden_layers:
        raise ValueError(
            f"config.json: layer_types lists {len(kinds)} layers, num_hidden_layers={cfg.num_hidden_layers}"
        )
    window = getattr(cfg, "sliding_window", None)
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise ValueError(
            f"config.json: sliding_window={window!r} must be an integer >= 1 (layer_types has sliding_attention layers)"
        )
    return tuple(window if k == "sliding_attention" else 0 for k in kinds)


def check_top_k(top_k: int, num_experts: int, moe_layers: tuple[int, ...]) -> None:
    """Raises ValueError (naming config.json's key) when ``top_k`` is outside [1, num_experts]
    while some layer is sparse."""
    if moe_layers and not 0 < top_k <= num_experts:
        raise ValueError(f"config.json: num_experts_per_tok={top_k} must be in [1, num_experts={num_experts}]")


def rope_parameters(cfg: Any) -> dict:
    """The RoPE settings of a config as one dict (transformers 5 ``rope_parameters``), with
    ``rope_theta`` and ``partial_rotary_factor`` filled in from the top level when only there."""
    params = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    params = dict(params)
    for key in ("rope_theta", "partial_rotary_factor"):
        if key not in params and getattr(cfg, key, None) is not None:
            params[key] = getattr(cfg, key)
    params.setdefault("rope_type", params.get("type", "default"))
    return params


def rotary_dim(cfg: Any, head_dim: int) -> int:
    """``int(head_dim * partial_rotary_factor)`` (transformers' rule; the factor defaults to 1).

    Raises:
        ValueError: the result is not an even number in [2, head_dim].
    """
    factor = float(rope_parameters(cfg).get("partial_rotary_factor") or 1.0)
    dim = int(head_dim * factor)
    if dim < 2 or dim > head_dim or dim % 2:
        raise ValueError(
            f"config.json: partial_rotary_factor={factor} gives {dim} rotary dimensions of head_dim="
            f"{head_dim}; it must give an even number in [2, head_dim]"
        )
    return dim
