"""What a model family provides (:class:`Family`), with the defaults most families keep.

A family file subclasses :class:`Family`, overrides what differs and sets ``FAMILY = MyFamily()``;
its registration is one line in :mod:`reinforge.models.families`. The defaults are Llama's:
attention with q/k/v/o projections, a SwiGLU MLP, the tensor-parallel plan over those names, the
mixture-of-experts blocks of :mod:`reinforge.models.moe` with their hub <-> stacked expert
layout, Hugging Face parameter names kept as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..args import ModelArgs, check_top_k
from ..moe import SparseMoeBlock, hub_named_tensors, stack_expert_weights
from ..transformer import MLP, Attention, DecoderLayer, RMSNorm, rope_tables

# the tensor-parallel styles a plan may name (torch.distributed.tensor.parallel's classes)
TP_STYLES = ("colwise", "rowwise")
LLAMA_ATTENTION_PLAN = {
    "self_attn.q_proj": "colwise",
    "self_attn.k_proj": "colwise",
    "self_attn.v_proj": "colwise",
    "self_attn.o_proj": "rowwise",
}
LLAMA_MLP_PLAN = {"mlp.gate_proj": "colwise", "mlp.up_proj": "colwise", "mlp.down_proj": "rowwise"}


@dataclass(frozen=True)
class ConfigShape:
    """What the resource estimates and up-front checks need from a ``config.json`` dict, read
    without transformers: the KV-cache shape (``num_layers`` x ``num_kv_heads`` x ``head_dim``),
    the routed experts per sparse layer (0: dense) and the summed width of one layer's MLP
    matrices (a dense model's ``intermediate_size``; an MoE layer's experts plus shared experts,
    every layer counted sparse: an upper bound). A hybrid family (linear-attention layers) caches keys and
    values in ``kv_layers`` of its layers only (None: all) and keeps a fixed state per sequence in the others:
    ``conv_state_elems`` elements in the engine's dtype and ``rec_state_elems`` fp32 elements
    (their bytes: :func:`reinforge.plan.kv.state_bytes_per_seq`). ``mixer_params``: the parameters of every
    layer's token mixer (attention or linear attention, the layer norms not included) where the family counts
    them itself; 0: Llama's attention in every layer, counted by the planner (``plan/arch.py``). ``kv_lora_rank``
    > 0: multi-head latent attention,
    whose cache holds ``kv_lora_rank + head_dim`` values per token and layer
    (:func:`reinforge.plan.kv.kv_values_per_token`). ``layer_windows``: each layer's sliding window (0: full;
    ``()``: none) in a family that runs them, so the engine's estimate counts their rings
    (:func:`reinforge.engine.kv_cache.ring_plan`).
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    num_experts: int
    mlp_width: int
    kv_layers: int | None = None
    conv_state_elems: int = 0
    rec_state_elems: int = 0
    mixer_params: int = 0
    kv_lora_rank: int = 0
    layer_windows: tuple[int, ...] = ()  # per-layer sliding windows (ModelArgs.layer_windows) the family runs

    @property
    def num_kv_layers(self) -> int:
        """The layers that cache keys and values (every layer unless the family says otherwise)."""
        return self.num_layers if self.kv_layers is None else self.kv_layers


class Family:
    """One architecture (``config.json`` ``model_type``). Subclasses set :attr:`model_type` and
    implement :meth:`model_args`; everything else has Llama's defaults.

    Attributes:
        model_type: the registry key.
        tp_partial_grads: name fragments of replicated parameters that see only the local heads
            under tensor parallelism (their gradients are summed over the tensor-parallel group).
        fp32_params: name endings of parameters held in fp32 in a model built in a lower precision
            (the engine's bf16 copy; transformers' ``_keep_in_fp32_modules``), e.g. a router whose
            choice a rounded weight would change.
        lora_targets: the ``nn.Linear`` names LoRA adapts beyond ``model.lora_target_modules``' default
            (attention and MLP) when that key is left at its default: a hybrid's linear-attention projections.
    """

    model_type: str = ""
    tp_partial_grads: tuple[str, ...] = (".q_norm.", ".k_norm.")
    fp32_params: tuple[str, ...] = ()
    lora_targets: tuple[str, ...] = ()

    # ------------------------------------------------------------------ config mapping
    def model_args(self, cfg: Any) -> ModelArgs:
        """The :class:`ModelArgs` of a ``transformers`` config of this family.

        Raises:
            NotImplementedError: an option the model code does not implement (callers fall back
                to transformers' model).
            ValueError: an inconsistent config (naming config.json's key).
        """
        raise NotImplementedError(f"{type(self).__name__}.model_args")

    def config_shape(self, cfg: dict) -> ConfigShape:
        """:class:`ConfigShape` of a ``config.json`` dict (default: the common keys, experts under
        ``num_experts`` / ``num_local_experts``, a shared expert under
        ``shared_expert_intermediate_size``)."""
        return generic_config_shape(cfg)

    # ------------------------------------------------------------------ modules
    def attention(self, args: ModelArgs, layer: int, cfg: Any) -> nn.Module:
        """Decoder layer ``layer``'s token mixer (parameters under :meth:`mixer_name`): attention by default."""
        return Attention(args, layer)

    def decoder_layer(self, args: ModelArgs, layer: int, cfg: Any) -> nn.Module:
        """Decoder layer ``layer`` (default: the pre-norm :class:`~reinforge.models.transformer.DecoderLayer`
        built from this family's attention, MLP and norms)."""
        return DecoderLayer(args, layer, self, cfg)

    def embedding(self, args: ModelArgs) -> nn.Embedding:
        """The token embedding (parameters ``embed_tokens.*`` of the decoder): a plain ``nn.Embedding``."""
        return nn.Embedding(args.vocab_size, args.hidden_size)

    def rope_tables(
        self, cfg: Any, head_dim: int, max_positions: int
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor] | None]:
        """The RoPE (cos, sin) tables [max_positions, R] fp32: every layer's
        (:func:`~reinforge.models.transformer.rope_tables`), and the sliding-window layers' own or None
        (default: one table for all)."""
        return rope_tables(cfg, head_dim, max_positions), None

    def mixer_name(self, layer: int, cfg: Any) -> str:
        """The attribute (and parameter-name part) of layer ``layer``'s token mixer: ``self_attn``, or a
        hybrid family's name for its other kind (Qwen3-Next's ``linear_attn``)."""
        return "self_attn"

    def norm(self, dim: int, eps: float) -> RMSNorm:
        """The decoder's RMSNorms (each layer's two and the final one): Llama's ``weight * x_norm``."""
        return RMSNorm(dim, eps)

    def dense_mlp(self, args: ModelArgs, layer: int, cfg: Any) -> nn.Module:
        """A dense layer's MLP (parameters under ``mlp.``): SwiGLU of ``intermediate_size``."""
        return MLP(args)

    def sparse_mlp(self, args: ModelArgs, layer: int, cfg: Any) -> SparseMoeBlock:
        """A sparse layer's mixture-of-experts block (:class:`~reinforge.models.moe.SparseMoeBlock`
        or a subclass; parameters under ``mlp.``)."""
        shared = MLP(args, args.shared_expert_intermediate_size) if args.shared_expert_intermediate_size else None
        return SparseMoeBlock(
            args.hidden_size,
            args.num_experts,
            args.num_experts_per_tok,
            args.moe_intermediate_size,
            args.norm_topk_prob,
            layer,
            shared,
        )

    # ------------------------------------------------------------------ parallelism
    def tp_plan(self, sparse: bool) -> dict[str, str]:
        """Submodule name (relative to the decoder layer) -> ``"colwise"`` / ``"rowwise"``
        (torch's ``ColwiseParallel`` / ``RowwiseParallel``) for tensor parallelism. Default:
        q/k/v column-wise, o row-wise; a dense MLP's gate/up column-wise, down row-wise; a sparse
        layer's MLP stays whole on every tensor-parallel rank (its experts split by expert
        parallelism instead)."""
        return dict(LLAMA_ATTENTION_PLAN) if sparse else {**LLAMA_ATTENTION_PLAN, **LLAMA_MLP_PLAN}

    # ------------------------------------------------------------------ weights
    def init_weight(self, name: str, p: torch.Tensor, std: float, generator: torch.Generator | None) -> None:
        """Random initialisation of one tensor (``CausalLM.init_weights``): norms 1, biases 0,
        the rest normal(0, std)."""
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        elif name.endswith("bias"):
            p.zero_()
        else:
            p.normal_(0.0, std, generator=generator)

    def text_config(self, cfg: Any) -> Any:
        """The language model's config within ``cfg`` (a multimodal family's ``text_config``; default ``cfg``)."""
        return cfg

    def from_hub(self, state: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
        """A checkpoint's tensors (Hugging Face names) -> this model's state dict: the hub's
        per-expert tensors stacked (:func:`~reinforge.models.moe.stack_expert_weights`)."""
        return stack_expert_weights(state, where)

    def to_hub(
        self, named: Iterable[tuple[str, torch.Tensor]], source: str | None = None
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """This model's (name, tensor) pairs -> the hub's: stacked experts split per expert
        (:func:`~reinforge.models.moe.hub_named_tensors`), other names unchanged. ``source``: the folder the
        model came from (a multimodal family copies the tensors it does not train from there)."""
        return hub_named_tensors(named)


def generic_config_shape(
    cfg: dict, experts_keys: tuple[str, ...] = ("num_experts", "num_local_experts"), shared_width: int | None = None
) -> ConfigShape:
    """:class:`ConfigShape` from the common ``config.json`` keys; ``experts_keys``: where the
    routed-expert count may be; ``shared_width``: the shared experts' width (default:
    ``shared_expert_intermediate_size``)."""
    cfg = cfg.get("text_config", cfg)
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    experts = next((int(cfg[k]) for k in experts_keys if cfg.get(k)), 0)
    if experts:
        shared = int(cfg.get("shared_expert_intermediate_size") or 0) if shared_width is None else shared_width
        # an expert's width: ``moe_intermediate_size``, else (gpt_oss, mixtral) ``intermediate_size``
        expert = cfg.get("moe_intermediate_size") or cfg.get("intermediate_size") or 4 * hidden
        width = experts * int(expert) + shared
    else:
        width = int(cfg.get("intermediate_size", 4 * hidden))
    return ConfigShape(
        int(cfg["num_hidden_layers"]),
        int(cfg.get("num_key_value_heads") or heads),
        int(cfg.get("head_dim") or hidden // heads),
        experts,
        width,
    )


def qwen_moe_layers(cfg: Any) -> dict[str, Any]:
    """The mixture-of-experts fields of :class:`ModelArgs` from a qwen3_moe / qwen2_moe config: a
    layer is sparse unless it is in ``mlp_only_layers``, when ``num_experts > 0`` and
    ``(layer + 1) % decoder_sparse_step == 0`` (as transformers' decoder layers decide).

    Raises:
        ValueError: ``decoder_sparse_step`` < 1 or ``num_experts_per_tok`` outside [1, num_experts].
    """
    num_experts, step = int(getattr(cfg, "num_experts", 0) or 0), int(getattr(cfg, "decoder_sparse_step", 1))
    if step < 1:
        raise ValueError(f"config.json: decoder_sparse_step={step} must be >= 1")
    dense = set(getattr(cfg, "mlp_only_layers", None) or [])
    layers = tuple(
        i for i in range(cfg.num_hidden_layers) if num_experts > 0 and i not in dense and (i + 1) % step == 0
    )
    top_k = int(cfg.num_experts_per_tok)
    check_top_k(top_k, num_experts, layers)
    return dict(
        num_experts=num_experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=cfg.moe_intermediate_size,
        norm_topk_prob=bool(getattr(cfg, "norm_topk_prob", False)),
        moe_layers=layers,
    )
