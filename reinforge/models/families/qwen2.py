"""The ``qwen2`` family (Qwen2 / Qwen2.5): Llama's architecture with a bias on the q/k/v
projections (``qkv_bias``, default true) and none on o. Formulas:
``transformers/models/qwen2/modeling_qwen2.py``."""

from __future__ import annotations

from typing import Any

from ..args import ModelArgs, dense_args
from .base import Family


class Qwen2(Family):
    model_type = "qwen2"

    def model_args(self, cfg: Any) -> ModelArgs:
        return dense_args(cfg, qkv_bias=bool(getattr(cfg, "qkv_bias", True)), o_bias=False, qk_norm=False)


FAMILY = Qwen2()
