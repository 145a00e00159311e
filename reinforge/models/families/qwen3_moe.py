"""The ``qwen3_moe`` family (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention and, in the layers
the config makes sparse (:func:`~reinforge.models.families.base.qwen_moe_layers`), a softmax top-k
mixture of experts (``norm_topk_prob``; :mod:`reinforge.models.moe`). Formulas:
``transformers/models/qwen3_moe/modeling_qwen3_moe.py``."""

from __future__ import annotations

from typing import Any

from ..args import ModelArgs, dense_args
from .base import Family, qwen_moe_layers


class Qwen3Moe(Family):
    model_type = "qwen3_moe"

    def model_args(self, cfg: Any) -> ModelArgs:
        bias = bool(getattr(cfg, "attention_bias", False))
        return dense_args(cfg, qkv_bias=bias, o_bias=bias, qk_norm=True).with_(**qwen_moe_layers(cfg))


FAMILY = Qwen3Moe()
