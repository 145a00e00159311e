"""The ``qwen2_moe`` family (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention (q/k/v bias) and,
in the sparse layers, the softmax top-k mixture of experts plus a shared expert (a dense SwiGLU MLP
of ``shared_expert_intermediate_size`` scaled per token by ``sigmoid(shared_expert_gate(x))``).
Formulas: ``transformers/models/qwen2_moe/modeling_qwen2_moe.py``."""

from __future__ import annotations

from typing import Any

from ..args import ModelArgs, dense_args
from .base import Family, qwen_moe_layers


class Qwen2Moe(Family):
    model_type = "qwen2_moe"

    def model_args(self, cfg: Any) -> ModelArgs:
        args = dense_args(cfg, qkv_bias=bool(getattr(cfg, "qkv_bias", True)), o_bias=False, qk_norm=False)
        return args.with_(
            **qwen_moe_layers(cfg),
            shared_expert_intermediate_size=int(getattr(cfg, "shared_expert_intermediate_size", 0) or 0),
        )


FAMILY = Qwen2Moe()
