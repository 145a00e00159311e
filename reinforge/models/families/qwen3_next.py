"""The ``qwen3_next`` family (Qwen3-Next-80B-A3B): a hybrid of Gated DeltaNet linear-attention layers and
gated full-attention layers (``layer_types``; 3 linear to 1 full, ``full_attention_interval`` 4), dense or
mixture-of-experts MLPs (softmax top-k and a sigmoid-gated shared expert, as Qwen2-MoE).

What differs from Qwen3 (formulas: ``transformers/models/qwen3_next/modeling_qwen3_next.py``):

* linear-attention layers (parameters under ``linear_attn.``):
  :class:`~reinforge.models.linear_attention.GatedDeltaNet`;
* full-attention layers: ``q_proj`` gives each head's query and an output gate side by side
  (``[H, 2 * head_dim]``); the attention output is multiplied by ``sigmoid(gate)`` before ``o_proj``;
  QK-norm and partial RoPE (``partial_rotary_factor`` 0.25);
* every RMSNorm but the linear layers' gated one is zero-centred: ``x_norm * (1 + weight)``, weight
  initialised to 0 (:class:`~reinforge.models.transformer.RMSNorm` with ``offset`` 1).

Tensor parallelism shards the full-attention layers and the MLPs; the linear-attention layers stay whole on
every rank (their ``in_proj_qkvz`` interleaves q/k/v/z per key head). The multi-token-prediction head of the
published checkpoints (``mtp.*``) is not used for training or rollout.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..args import ModelArgs, dense_args
from ..linear_attention import GatedDeltaNet
from ..transformer import Attention, RMSNorm
from .base import ConfigShape, Family, generic_config_shape, qwen_moe_layers

LAYER_KINDS = ("linear_attention", "full_attention")


def layer_kinds(cfg: Any) -> list[str]:
    """Each decoder layer's kind (``layer_types``, or every ``full_attention_interval``-th layer full); ``cfg`` a
    config object or a ``config.json`` dict."""
    get = cfg.get if isinstance(cfg, dict) else lambda k, d=None: getattr(cfg, k, d)
    kinds = get("layer_types", None)
    if kinds:
        return list(kinds)
    interval = int(get("full_attention_interval", None) or 4)
    return [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(get("num_hidden_layers"))
    ]


class GatedAttention(Attention):
    """Full attention with a per-channel output gate: ``o_proj(attn(q, k, v) * sigmoid(gate))``, the query
    and the gate from one ``q_proj`` ([H, 2 * head_dim] per position); zero-centred QK-norm."""

    def __init__(self, args: ModelArgs, layer: int):
        super().__init__(args, layer)
        self.q_proj = nn.Linear(args.hidden_size, 2 * args.num_heads * args.head_dim, bias=args.qkv_bias)
        self.q_norm = RMSNorm(args.head_dim, args.rms_norm_eps, offset=1.0)
        self.k_norm = RMSNorm(args.head_dim, args.rms_norm_eps, offset=1.0)

    def forward(self, x, cos, sin, ctx):
        B, T, _ = x.shape
        D = self.head_dim
        if self.qkv is not None:  # inference: one matmul over the fused q(+gate)/k/v rows (fuse_projection)
            w, b = self.qkv
            sizes = [p.weight.shape[0] for p in (self.q_proj, self.k_proj, self.v_proj)]
            q, k, v = F.linear(x, w, b).split(sizes, -1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q, gate = q.view(B, T, -1, 2 * D).chunk(2, dim=-1)
        k, v = k.view(B, T, -1, D), v.view(B, T, -1, D)
        q, k, v = self._norm_and_rope(q, k, v, cos, sin)
        o = self._attention(q, k, v, ctx).reshape(B, T, -1)
        return self.o_proj(o * torch.sigmoid(gate.reshape(B, T, -1)))


class Qwen3Next(Family):
    model_type = "qwen3_next"
    layout = "qkvz"  # GatedDeltaNet's projections (Qwen3.5: "separate")
    # LoRA on the linear-attention layers too (their b / a gate projections, a few columns, stay frozen)
    lora_targets = ("in_proj_qkvz", "in_proj_qkv", "in_proj_z", "out_proj")

    def model_args(self, cfg: Any) -> ModelArgs:
        kinds = layer_kinds(cfg)
        if len(kinds) != cfg.num_hidden_layers or set(kinds) - set(LAYER_KINDS):
            raise ValueError(
                f"config.json: layer_types must list {cfg.num_hidden_layers} kinds out of {LAYER_KINDS}, got {kinds}"
            )
        bias = bool(getattr(cfg, "attention_bias", False))
        args = dense_args(cfg, qkv_bias=bias, o_bias=bias, qk_norm=True, layer_kinds=LAYER_KINDS)
        args = args.with_(kv_layers=tuple(i for i, kind in enumerate(kinds) if kind == "full_attention"))
        if int(getattr(cfg, "num_experts", 0) or 0) > 0:
            args = args.with_(
                **qwen_moe_layers(cfg),
                shared_expert_intermediate_size=int(getattr(cfg, "shared_expert_intermediate_size", 0) or 0),
            )
        return args

    def mixer_name(self, layer: int, cfg: Any) -> str:
        return "linear_attn" if layer_kinds(cfg)[layer] == "linear_attention" else "self_attn"

    def config_shape(self, cfg: dict) -> ConfigShape:
        """The generic shape with keys and values cached by the full-attention layers only and each linear layer's
        per-sequence states: the convolution's last ``linear_conv_kernel_dim - 1`` inputs of its
        ``2 Hk Dk + Hv Dv`` channels, and the recurrent state ``Hv x Dk x Dv`` in fp32."""
        shape = generic_config_shape(cfg)
        kinds = layer_kinds(cfg)
        linear = kinds.count("linear_attention")
        hk, hv = int(cfg["linear_num_key_heads"]), int(cfg["linear_num_value_heads"])
        dk, dv = int(cfg["linear_key_head_dim"]), int(cfg["linear_value_head_dim"])
        channels, kernel = 2 * hk * dk + hv * dv, int(cfg.get("linear_conv_kernel_dim") or 4)
        hidden, full = int(cfg["hidden_size"]), kinds.count("full_attention")
        # in_proj (q, k, v, z, b, a), the depthwise convolution, out_proj, A_log, dt_bias, the gated norm
        linear_mixer = hidden * (channels + hv * dv + 2 * hv) + channels * kernel + hv * dv * hidden + 2 * hv + dv
        # gated attention: q_proj twice as wide (the gate), k, v, o, the QK-norms (and biases)
        q, kv, d = int(cfg["num_attention_heads"]) * shape.head_dim, shape.num_kv_heads * shape.head_dim, shape.head_dim
        attention = hidden * (2 * q + 2 * kv) + q * hidden + 2 * d
        if cfg.get("attention_bias"):
            attention += 2 * q + 2 * kv + hidden
        return dataclasses.replace(
            shape,
            kv_layers=full,
            conv_state_elems=linear * channels * (kernel - 1),
            rec_state_elems=linear * hv * dk * dv,
            mixer_params=linear * linear_mixer + full * attention,
        )

    def attention(self, args: ModelArgs, layer: int, cfg: Any) -> nn.Module:
        if self.mixer_name(layer, cfg) == "linear_attn":
            return GatedDeltaNet(cfg, layer, self.layout)
        return GatedAttention(args, layer)

    def norm(self, dim: int, eps: float) -> RMSNorm:
        return RMSNorm(dim, eps, offset=1.0)

    def init_weight(self, name: str, p: torch.Tensor, std: float, generator: torch.Generator | None) -> None:
        """Zero-centred norms 0, the gated norm 1, ``A_log`` = log U(1, 16), ``dt_bias`` 1, the rest as Llama."""
        if name.endswith("linear_attn.norm.weight") or name.endswith("dt_bias"):
            p.fill_(1.0)
        elif name.endswith("norm.weight"):
            p.zero_()
        elif name.endswith("A_log"):
            p.copy_(torch.empty(p.shape, device=p.device).uniform_(1, 16, generator=generator).log())
        else:
            super().init_weight(name, p, std, generator)


FAMILY = Qwen3Next()


class Qwen3_5Text(Qwen3Next):
    """Qwen3.5's language model (``qwen3_5_text``; ``qwen3_5_moe_text`` with experts): Qwen3-Next's layers with
    the linear attention's projections separate (``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``,
    ``in_proj_a``). Its multimodal RoPE reduces to plain partial RoPE for text (every position id the same
    on the three axes). Formulas: ``transformers/models/qwen3_5/modeling_qwen3_5.py``."""

    model_type = "qwen3_5_text"
    layout = "separate"


class Qwen3_5MoeText(Qwen3_5Text):
    """Qwen3.5-MoE's language model: every layer sparse; its router always renormalises the top-k
    probabilities (no ``norm_topk_prob`` key)."""

    model_type = "qwen3_5_moe_text"

    def model_args(self, cfg: Any) -> ModelArgs:
        return super().model_args(cfg).with_(norm_topk_prob=True)


QWEN3_5_TEXT = Qwen3_5Text()
QWEN3_5_MOE_TEXT = Qwen3_5MoeText()


LANGUAGE_MODEL = "model.language_model."


class Qwen3_5(Family):
    """A Qwen3.5 multimodal checkpoint (``qwen3_5``, ``qwen3_5_moe``: a vision tower and ``text_config``) loaded
    for text RL: its language model is trained as :class:`Qwen3_5Text` (everything delegated to ``text``),
    read from ``model.language_model.*`` and ``lm_head.weight``; the other tensors (``model.visual.*``, a
    ``mtp.*`` head) are neither trained nor sent to engines, and a Hugging Face export copies them unchanged
    from the folder the model came from (:meth:`to_hub` with ``source``), so the export is the whole
    multimodal checkpoint again."""

    def __init__(self, model_type: str, text: Family):
        self.model_type, self.text = model_type, text
        self.tp_partial_grads, self.fp32_params = text.tp_partial_grads, text.fp32_params
        self.lora_targets = text.lora_targets

    def text_config(self, cfg: Any) -> Any:
        text = cfg.get("text_config") if isinstance(cfg, dict) else getattr(cfg, "text_config", None)
        if text is None:
            raise ValueError(f"config.json: a {self.model_type} checkpoint needs text_config (its language model)")
        return text

    def model_args(self, cfg: Any) -> ModelArgs:
        return self.text.model_args(cfg)

    def mixer_name(self, layer: int, cfg: Any) -> str:
        return self.text.mixer_name(layer, cfg)

    def attention(self, args: ModelArgs, layer: int, cfg: Any) -> nn.Module:
        return self.text.attention(args, layer, cfg)

    def dense_mlp(self, args: ModelArgs, layer: int, cfg: Any) -> nn.Module:
        return self.text.dense_mlp(args, layer, cfg)

    def sparse_mlp(self, args: ModelArgs, layer: int, cfg: Any):
        return self.text.sparse_mlp(args, layer, cfg)

    def norm(self, dim: int, eps: float) -> RMSNorm:
        return self.text.norm(dim, eps)

    def tp_plan(self, sparse: bool) -> dict[str, str]:
        return self.text.tp_plan(sparse)

    def init_weight(self, name: str, p: torch.Tensor, std: float, generator: torch.Generator | None) -> None:
        self.text.init_weight(name, p, std, generator)

    def config_shape(self, cfg: dict):
        return self.text.config_shape(cfg.get("text_config", cfg))

    def from_hub(self, state: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
        text = {("model." + k[len(LANGUAGE_MODEL) :]): v for k, v in state.items() if k.startswith(LANGUAGE_MODEL)}
        if "lm_head.weight" in state:
            text["lm_head.weight"] = state["lm_head.weight"]
        return self.text.from_hub(text, where)

    def to_hub(self, named, source: str | None = None):
        for name, t in self.text.to_hub(named):
            yield (LANGUAGE_MODEL + name[len("model.") :] if name.startswith("model.") else name), t
        if source is not None:
            yield from untrained_tensors(source)


def untrained_tensors(folder: str):
    """(name, tensor) of a multimodal checkpoint's tensors outside its language model (vision tower, MTP head),
    read from ``folder``'s safetensors files."""
    from pathlib import Path

    from safetensors import safe_open

    for file in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            for key in f.keys():
                if not key.startswith(LANGUAGE_MODEL) and key != "lm_head.weight":
                    yield key, f.get_tensor(key)


QWEN3_5 = Qwen3_5("qwen3_5", QWEN3_5_TEXT)
QWEN3_5_MOE = Qwen3_5("qwen3_5_moe", QWEN3_5_MOE_TEXT)
