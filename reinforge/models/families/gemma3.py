"""The ``gemma3_text`` family (Gemma 3's language model: Gemma-3-1B, and the text tower of 4B/12B/27B).

What differs from Llama (formulas: ``transformers/models/gemma3/modeling_gemma3.py``):

* local sliding-window and global layers (``layer_types``, or every ``sliding_window_pattern``-th layer
  global: 5 local to 1 global); a local layer sees the last ``sliding_window`` positions
  (:attr:`~reinforge.models.args.ModelArgs.layer_windows`);
* two RoPE tables: the local layers' of base ``rope_local_base_freq`` (``rope_parameters
  ["sliding_attention"]``), the global layers' of ``rope_theta`` with ``rope_scaling`` (``default`` or
  ``linear``; ``rope_parameters["full_attention"]``);
* QK-norm, and every RMSNorm zero-centred, ``x_norm * (1 + weight)`` in fp32 (weights initialised to 0);
* four norms per decoder layer: ``input_layernorm`` -> attention -> ``post_attention_layernorm`` -> residual
  add; ``pre_feedforward_layernorm`` -> MLP -> ``post_feedforward_layernorm`` -> residual add;
* GeGLU MLP: ``down(gelu_tanh(gate(x)) * up(x))`` (``hidden_activation`` ``gelu_pytorch_tanh``);
* the embeddings times ``sqrt(hidden_size)``, the factor rounded to the embedding's dtype first (as
  transformers' ``Gemma3TextScaledWordEmbedding``); q.k scaled by ``query_pre_attn_scalar ** -0.5``;
* tied embeddings.

Refused at start (``NotImplementedError`` naming the field; the model then runs on the transformers
fallback): ``attn_logit_softcapping`` / ``final_logit_softcapping`` (Gemma 2's soft-capping: the engine's
and the trainer's logits paths do not cap), ``use_bidirectional_attention``, a global RoPE type other than
``default`` / ``linear``.
"""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..args import ModelArgs, dense_args, layer_windows
from ..transformer import MLP, Attention, DecoderLayer, RMSNorm
from .base import ConfigShape, Family, generic_config_shape
from .qwen3_next import LANGUAGE_MODEL, Qwen3_5

LAYER_KINDS = ("sliding_attention", "full_attention")
GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh")


def layer_kinds(cfg: Any) -> list[str]:
    """Each decoder layer's kind: ``layer_types``, else every ``sliding_window_pattern``-th layer (default 6)
    global and the others local (transformers' rule)."""
    kinds = getattr(cfg, "layer_types", None)
    if kinds:
        return list(kinds)
    pattern = int(getattr(cfg, "sliding_window_pattern", None) or getattr(cfg, "_sliding_window_pattern", 6))
    return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(cfg.num_hidden_layers)]


def rope_settings(cfg: Any) -> dict[str, dict]:
    """``{"full_attention": {...}, "sliding_attention": {...}}``: each layer kind's RoPE settings
    (``rope_type``, ``rope_theta``, ``factor``), from transformers 5's per-kind ``rope_parameters`` or the
    older top-level keys (``rope_theta`` and ``rope_scaling`` global, ``rope_local_base_freq`` local)."""
    params = getattr(cfg, "rope_parameters", None)
    if isinstance(params, dict) and "full_attention" in params:
        out = {k: dict(params.get(k) or {}) for k in LAYER_KINDS}
    else:
        glob = dict(getattr(cfg, "rope_scaling", None) or {})
        glob.setdefault("rope_theta", getattr(cfg, "rope_theta", 1_000_000.0))
        out = {
            "full_attention": glob,
            "sliding_attention": {"rope_theta": getattr(cfg, "rope_local_base_freq", 10_000.0)},
        }
    for settings in out.values():
        settings["rope_type"] = settings.get("rope_type") or settings.get("type") or "default"
    return out


def gemma_rope_table(settings: dict, head_dim: int, max_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [max_positions, head_dim] fp32 of ``default`` RoPE (1 / theta^(2i/D), Su et al. 2021) or
    ``linear`` (positions divided by ``factor``: Chen et al. 2023), as transformers' RoPE init functions.

    Raises:
        NotImplementedError: another ``rope_type``.
    """
    kind = settings["rope_type"]
    if kind not in ("default", "linear"):
        raise NotImplementedError(f"gemma3_text: rope_type {kind!r} (only 'default' / 'linear')")
    theta = float(settings["rope_theta"])
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if kind == "linear":
        inv_freq = inv_freq / float(settings["factor"])
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


class ScaledEmbedding(nn.Embedding):
    """``nn.Embedding`` whose output is multiplied by ``scale`` rounded to the weight's dtype first."""

    def __init__(self, num: int, dim: int, scale: float):
        super().__init__(num, dim)
        self.scale = scale

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # a Python number (the scale rounded to the weight's dtype), not a tensor: no host-to-device copy, so
        # the engine's decode step can be captured in a CUDA graph
        return super().forward(ids) * float(torch.tensor(self.scale, dtype=self.weight.dtype))


class GemmaAttention(Attention):
    """Attention with zero-centred QK-norm (``x_norm * (1 + weight)``)."""

    def __init__(self, args: ModelArgs, layer: int):
        super().__init__(args, layer)
        self.q_norm = RMSNorm(args.head_dim, args.rms_norm_eps, offset=1.0)
        self.k_norm = RMSNorm(args.head_dim, args.rms_norm_eps, offset=1.0)


class GeGLU(MLP):
    """``down(gelu_tanh(gate(x)) * up(x))`` (Shazeer 2020, "GLU Variants Improve Transformer"); eager (the
    fused kernels are SiLU's), one matmul for gate and up over the fused matrix (inference)."""

    def forward(self, x):
        if self.gate_up is not None:
            g, u = F.linear(x, self.gate_up).chunk(2, dim=-1)
        else:
            g, u = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.gelu(g, approximate="tanh") * u)


class Gemma3DecoderLayer(DecoderLayer):
    """``x + post_attn_norm(attn(input_norm(x)))``, then ``x + post_ff_norm(mlp(pre_ff_norm(x)))``."""

    def __init__(self, args: ModelArgs, layer: int, family: Family, hf_config: Any):
        super().__init__(args, layer, family, hf_config)
        self.pre_feedforward_layernorm = family.norm(args.hidden_size, args.rms_norm_eps)
        self.post_feedforward_layernorm = family.norm(args.hidden_size, args.rms_norm_eps)

    def forward(self, x, cos, sin, ctx=None, routing=None):
        x = x + self.post_attention_layernorm(self.mixer(self.input_layernorm(x), cos, sin, ctx))
        return x + self.post_feedforward_layernorm(self._mlp(self.pre_feedforward_layernorm(x), routing))

    def forward_residual(self, x, residual, cos, sin, ctx=None, routing=None):
        """The engine's fused-residual loop (``x``: the previous layer's MLP output, ``residual`` the stream
        before it): the sandwich norms leave nothing to fuse, so the sum is formed here and the layer runs
        as :meth:`forward`; returns (this layer's MLP output, the stream before it)."""
        stream = x if residual is None else residual + x
        h = stream + self.post_attention_layernorm(self.mixer(self.input_layernorm(stream), cos, sin, ctx))
        return self.post_feedforward_layernorm(self._mlp(self.pre_feedforward_layernorm(h), routing)), h


class Gemma3Text(Family):
    model_type = "gemma3_text"

    def model_args(self, cfg: Any) -> ModelArgs:
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            if getattr(cfg, key, None):
                raise NotImplementedError(f"{self.model_type}: {key}={getattr(cfg, key)} (logit soft-capping)")
        if getattr(cfg, "use_bidirectional_attention", False):
            raise NotImplementedError(f"{self.model_type}: use_bidirectional_attention=True")
        kinds = layer_kinds(cfg)
        if len(kinds) != cfg.num_hidden_layers or set(kinds) - set(LAYER_KINDS):
            raise ValueError(
                f"config.json: layer_types must list {cfg.num_hidden_layers} kinds out of {LAYER_KINDS}, got {kinds}"
            )
        for settings in rope_settings(cfg).values():
            if settings["rope_type"] not in ("default", "linear"):
                raise NotImplementedError(f"{self.model_type}: rope_type {settings['rope_type']!r}")
        view = _WithLayerTypes(cfg, kinds)
        bias = bool(getattr(cfg, "attention_bias", False))
        args = dense_args(
            view, qkv_bias=bias, o_bias=bias, qk_norm=True, layer_kinds=LAYER_KINDS, activations=GELU_TANH
        )
        scalar = getattr(cfg, "query_pre_attn_scalar", None) or args.head_dim
        return args.with_(
            tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", True)), attn_scale=float(scalar) ** -0.5
        )

    def config_shape(self, cfg: dict) -> ConfigShape:
        """The common keys, and the local layers' windows (``layer_types`` / ``sliding_window_pattern``)."""
        shape = generic_config_shape(cfg)
        view = SimpleNamespace(**{"sliding_window": None, **cfg.get("text_config", cfg)})
        view.layer_types = layer_kinds(view)
        return replace(shape, layer_windows=layer_windows(view))

    def decoder_layer(self, args: ModelArgs, layer: int, cfg: Any) -> nn.Module:
        return Gemma3DecoderLayer(args, layer, self, cfg)

    def attention(self, args: ModelArgs, layer: int, cfg: Any) -> nn.Module:
        return GemmaAttention(args, layer)

    def dense_mlp(self, args: ModelArgs, layer: int, cfg: Any) -> nn.Module:
        return GeGLU(args)

    def norm(self, dim: int, eps: float) -> RMSNorm:
        return RMSNorm(dim, eps, offset=1.0)

    def embedding(self, args: ModelArgs) -> nn.Embedding:
        return ScaledEmbedding(args.vocab_size, args.hidden_size, math.sqrt(args.hidden_size))

    def rope_tables(self, cfg: Any, head_dim: int, max_positions: int):
        settings = rope_settings(cfg)
        return (
            gemma_rope_table(settings["full_attention"], head_dim, max_positions),
            gemma_rope_table(settings["sliding_attention"], head_dim, max_positions),
        )

    def init_weight(self, name: str, p: torch.Tensor, std: float, generator: torch.Generator | None) -> None:
        """Zero-centred norms 0 (scale 1), the rest as Llama."""
        if name.endswith("norm.weight"):
            p.zero_()
        else:
            super().init_weight(name, p, std, generator)


class _WithLayerTypes:
    """``cfg`` with ``layer_types`` filled in (older configs give ``sliding_window_pattern``) and no
    ``rope_parameters`` (Gemma's per-kind RoPE is read by :func:`rope_settings`, not the shared checks)."""

    def __init__(self, cfg: Any, kinds: list[str]):
        self._cfg, self.layer_types = cfg, kinds
        self.rope_parameters = {"rope_type": "default"}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cfg, name)


FAMILY = Gemma3Text()


HUB_LANGUAGE_MODEL = "language_model.model."  # the published checkpoints' prefix (transformers 5 renames on load)


class Gemma3(Qwen3_5):
    """A Gemma 3 multimodal checkpoint (``gemma3``: Gemma-3-4B/12B/27B, a SigLIP vision tower and ``text_config``)
    loaded for text RL, as Qwen3.5's (:class:`~.qwen3_next.Qwen3_5`): its language model is trained as
    :class:`Gemma3Text`, read from ``model.language_model.*`` (transformers 5's layout) or
    ``language_model.model.*`` (the published checkpoints'); the LM head is the tied embedding. The vision
    tower and the projector are neither trained nor sent to engines; a Hugging Face export writes the language
    model in transformers 5's layout and copies the other tensors from the folder the model came from, so it is
    the whole multimodal checkpoint again."""

    def decoder_layer(self, args: ModelArgs, layer: int, cfg: Any) -> nn.Module:
        return self.text.decoder_layer(args, layer, cfg)

    def embedding(self, args: ModelArgs) -> nn.Embedding:
        return self.text.embedding(args)

    def rope_tables(self, cfg: Any, head_dim: int, max_positions: int):
        return self.text.rope_tables(cfg, head_dim, max_positions)

    def from_hub(self, state: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
        renamed = {
            (LANGUAGE_MODEL + k[len(HUB_LANGUAGE_MODEL) :] if k.startswith(HUB_LANGUAGE_MODEL) else k): v
            for k, v in state.items()
        }
        return super().from_hub(renamed, where)

    def to_hub(self, named, source: str | None = None):
        for name, t in self.text.to_hub(named):
            yield (LANGUAGE_MODEL + name[len("model.") :] if name.startswith("model.") else name), t
        if source is not None:
            yield from _vision_tensors(source)


def _vision_tensors(folder: str):
    """(name, tensor) of a multimodal Gemma 3 checkpoint's tensors outside its language model, in transformers
    5's names (``model.vision_tower.*``, ``model.multi_modal_projector.*``; the published ``vision_tower.*`` /
    ``multi_modal_projector.*`` renamed)."""
    from pathlib import Path

    from safetensors import safe_open

    for file in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            for key in f.keys():
                if key.startswith((LANGUAGE_MODEL, "language_model.")) or key.endswith("lm_head.weight"):
                    continue
                yield (key if key.startswith("model.") else "model." + key), f.get_tensor(key)


GEMMA3 = Gemma3("gemma3", FAMILY)
