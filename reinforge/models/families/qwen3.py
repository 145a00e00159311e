"""The ``qwen3`` family (Qwen3 dense): Llama's architecture plus an RMSNorm over each query and
key head before RoPE (``q_norm`` / ``k_norm``; under tensor parallelism their gradients are summed
over the group, ``Family.tp_partial_grads``). Formulas: ``transformers/models/qwen3/modeling_qwen3.py``."""

from __future__ import annotations

from typing import Any

from ..args import ModelArgs, dense_args
from .base import Family


class Qwen3(Family):
    model_type = "qwen3"

    def model_args(self, cfg: Any) -> ModelArgs:
        bias = bool(getattr(cfg, "attention_bias", False))
        return dense_args(cfg, qkv_bias=bias, o_bias=bias, qk_norm=True)


FAMILY = Qwen3()
