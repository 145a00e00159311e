"""The ``llama`` family (Llama 2/3, SmolLM/SmolLM2, ...): RMSNorm, RoPE (static variants:
default, linear, llama3, yarn), SwiGLU MLP, grouped-query attention, ``attention_bias`` on q/k/v
and o. Formulas: ``transformers/models/llama/modeling_llama.py``."""

from __future__ import annotations

from typing import Any

from ..args import ModelArgs, dense_args
from .base import Family


class Llama(Family):
    model_type = "llama"

    def model_args(self, cfg: Any) -> ModelArgs:
        bias = bool(getattr(cfg, "attention_bias", False))
        return dense_args(cfg, qkv_bias=bias, o_bias=bias, qk_norm=False)


FAMILY = Llama()
