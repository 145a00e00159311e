"""The ``gpt_oss`` family: OpenAI's GPT-OSS (gpt-oss-20b, gpt-oss-120b). Formulas:
``transformers/models/gpt_oss/modeling_gpt_oss.py`` (fp32 logits agree with ``GptOssForCausalLM``:
``tests/integration/test_gpt_oss.py``).

Differences from the Llama / Qwen defaults (:class:`~reinforge.models.families.base.Family`):

* attention: q/k/v **and** o projections biased (``attention_bias``); **attention sinks**, a learned logit
  per query head (``self_attn.sinks`` [num_heads]) that joins each softmax's denominator and attends to
  nothing; ``layer_types`` alternating ``sliding_attention`` (a window of ``sliding_window`` = 128
  tokens) and ``full_attention``; YaRN RoPE (``rope_type: yarn``, factor 32 over 4096). The shared
  attention code runs these (:attr:`ModelArgs.layer_windows <reinforge.models.args.ModelArgs>`,
  ``attention_sinks``; trainer and engine alike);
* every layer a mixture of experts (:class:`GptOssMoeBlock`): a **biased router** (``mlp.router.weight``
  [E, H], ``mlp.router.bias`` [E]); the top ``num_experts_per_tok`` of its logits are chosen and their
  gate weights are the softmax of those k logits (a softmax over the chosen only, so it sums to 1);
* experts of width ``intermediate_size`` with **biases**, the gate and up projections **interleaved**
  (columns ``0::2`` the gate, ``1::2`` the up projection) and the **clamped SwiGLU**:
  ``g = min(gate, limit)``, ``u = clamp(up, -limit, limit)``, ``h = (u + 1) * g * sigmoid(alpha g)``
  with ``alpha = swiglu_alpha`` (1.702) and ``limit = swiglu_limit`` (7.0); ``y = h @ down + down_bias``.
* RMSNorm: ``(weight * x_norm)`` with the product in fp32 before the cast (transformers keeps the norms
  in fp32), where Llama casts first; the same in fp32.

Parameters (Hugging Face names and transformers' in-memory shapes, which the bf16 hub checkpoints store
as they are): ``mlp.router.{weight,bias}``; ``mlp.experts.gate_up_proj`` [E, H, 2I] (interleaved),
``gate_up_proj_bias`` [E, 2I], ``down_proj`` [E, I, H], ``down_proj_bias`` [E, H]: stacked already, so
``from_hub`` / ``to_hub`` keep them (no per-expert split). OpenAI's published checkpoints store the
expert matrices in **MXFP4** (``*_blocks`` / ``*_scales``, ``quantization_config.quant_method:
mxfp4``): ``from_hub`` dequantizes them to bf16 (:mod:`reinforge.models.mxfp4`); reinforge trains
in bf16 / fp32 and exports the dequantized weights.

Expert parallelism and routing replay are the shared block's (:class:`~reinforge.models.moe.SparseMoeBlock`):
the biases are sharded with their experts; replayed experts get the softmax of their k router logits.
The load-balancing statistics read the softmax over all experts (transformers' ``load_balancing_loss_func``).
Tensor and context parallelism split the sinks with the query heads
(:meth:`~reinforge.models.transformer.Attention.local_sinks`). The weight sync to vLLM / SGLang sends the
stacked experts whole, as the bf16 checkpoints hold them (:func:`~reinforge.models.loading.hub_layout`; not run
on a GPU yet).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..args import ModelArgs, check_top_k, dense_args, layer_windows
from ..expert_parallel import _ScaleGrad, local_experts
from ..moe import Experts, SparseMoeBlock, grouped_mm_supported
from ..mxfp4 import dequantize_mxfp4_state
from ..transformer import RMSNorm
from .base import ConfigShape, Family, generic_config_shape


class GptOssExperts(Experts):
    """E experts with biases, in transformers' layout: ``gate_up_proj`` [E, H, 2I] (columns interleaved:
    ``0::2`` gate, ``1::2`` up), ``gate_up_proj_bias`` [E, 2I], ``down_proj`` [E, I, H],
    ``down_proj_bias`` [E, H]. ``forward(fn)`` passes ``fn`` the two matrices, as :class:`Experts` (the
    block reads the biases itself, within the same call)."""

    expert_params = ("gate_up_proj", "down_proj", "gate_up_proj_bias", "down_proj_bias")

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int):
        nn.Module.__init__(self)
        self.num_experts, self.intermediate_size = num_experts, intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, hidden_size, 2 * intermediate_size))
        self.gate_up_proj_bias = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, intermediate_size, hidden_size))
        self.down_proj_bias = nn.Parameter(torch.empty(num_experts, hidden_size))


class GptOssMoeBlock(SparseMoeBlock):
    """GPT-OSS's mixture-of-experts MLP (module docstring): biased router, softmax over the chosen k
    logits, biased interleaved experts with the clamped SwiGLU. Shapes as
    :class:`~reinforge.models.moe.SparseMoeBlock`; parameters under ``router.`` and ``experts.``."""

    def __init__(self, args: ModelArgs, layer: int, cfg: Any):
        super().__init__(
            args.hidden_size, args.num_experts, args.num_experts_per_tok, args.moe_intermediate_size, True, layer
        )
        del self.gate  # (the router is ``router``, with a bias)
        self.router = nn.Linear(args.hidden_size, args.num_experts, bias=True)
        self.experts = GptOssExperts(args.num_experts, args.hidden_size, args.moe_intermediate_size)
        self.alpha = float(getattr(cfg, "swiglu_alpha", None) or 1.702)
        self.limit = float(getattr(cfg, "swiglu_limit", None) or 7.0)

    def router_scores(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.dtype]:
        """The router's logits ``x @ W.T + b`` [N, E] (as fp32), gate weights cast to the logits' dtype."""
        logits = self.router(x)
        return logits.float(), logits.dtype

    def gate_weights(self, scores: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The softmax of the chosen (or replayed) experts' logits [N, k] fp32."""
        return torch.softmax(scores.gather(1, ids), dim=-1)

    def balance_probs(self, scores: torch.Tensor) -> torch.Tensor:
        """The softmax of the logits over all experts."""
        return torch.softmax(scores, dim=-1)

    def _act(self, gu: torch.Tensor) -> torch.Tensor:
        """The clamped SwiGLU on the interleaved [M, 2I] output of the gate/up projection -> [M, I]."""
        gate = gu[..., 0::2].clamp(max=self.limit)
        up = gu[..., 1::2].clamp(min=-self.limit, max=self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))

    def _biases(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's expert biases (gate/up [E', 2I], down [E', H]) in ``dtype``; under expert
        parallelism the local block, its gradient scaled as the matrices' are
        (:mod:`~reinforge.models.expert_parallel`)."""
        gub, db = self.experts.gate_up_proj_bias, self.experts.down_proj_bias
        if self.ep_group is not None:
            scale = 1.0 / dist.get_world_size(self.ep_group)
            gub, db = _ScaleGrad.apply(local_experts(gub), scale), _ScaleGrad.apply(local_experts(db), scale)
        return gub.to(dtype), db.to(dtype)

    def _compute(self, xs: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        """The biased experts on rows grouped by expert: xs [M, H], gate_up [E', H, 2I], down [E', I, H],
        ends [E'] int64 -> [M, H] (``torch._grouped_mm`` or the loop, as the shared block chooses)."""
        gub, db = self._biases(xs.dtype)
        grouped = self.grouped if self.grouped is not None else grouped_mm_supported(xs.device, xs.dtype)
        if grouped:
            offs = ends.to(torch.int32)
            row_expert = torch.searchsorted(ends, torch.arange(xs.shape[0], device=xs.device), right=True)
            row_expert = row_expert.clamp(max=gate_up.shape[0] - 1)
            h = self._act(torch._grouped_mm(xs, gate_up, offs=offs) + gub[row_expert])
            return torch._grouped_mm(h, down, offs=offs) + db[row_expert]
        bounds = [0] + ends.tolist()
        parts = []
        for e in range(gate_up.shape[0]):
            a, b = bounds[e], bounds[e + 1]
            if b > a:
                h = self._act(torch.addmm(gub[e], xs[a:b], gate_up[e]))
                parts.append(torch.addmm(db[e], h, down[e]))
        if not parts:  # (no rows: a result that still depends on every expert tensor, see SparseMoeBlock._loop)
            return torch.addmm(db[0], self._act(torch.addmm(gub[0], xs[:0], gate_up[0])), down[0])
        return torch.cat(parts)


class GptOssRMSNorm(RMSNorm):
    """transformers' GptOssRMSNorm: ``(weight * x_norm)`` in fp32, then cast (Llama casts ``x_norm`` first)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return super().forward(x)
        dtype = x.dtype
        x = x.float()
        return (self.weight.float() * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))).to(dtype)


class GptOss(Family):
    model_type = "gpt_oss"

    def model_args(self, cfg: Any) -> ModelArgs:
        bias = bool(getattr(cfg, "attention_bias", True))
        args = dense_args(
            cfg, qkv_bias=bias, o_bias=bias, qk_norm=False, layer_kinds=("full_attention", "sliding_attention")
        )
        E = int(getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", 0) or 0)
        if not E:
            raise ValueError(
                "config.json: num_local_experts must be >= 1 (every GPT-OSS layer is a mixture of experts)"
            )
        top_k, layers = int(cfg.num_experts_per_tok), tuple(range(cfg.num_hidden_layers))
        check_top_k(top_k, E, layers)
        return args.with_(
            attention_sinks=True,
            num_experts=E,
            num_experts_per_tok=top_k,
            moe_intermediate_size=int(cfg.intermediate_size),
            norm_topk_prob=True,
            moe_layers=layers,
        )

    def config_shape(self, cfg: dict) -> ConfigShape:
        """The common keys (experts under ``num_local_experts``, of width ``intermediate_size``) and the
        sliding layers' windows: ``layer_types``, or where a config lacks it transformers' default (the
        even layers sliding), ``sliding_window`` (default 128)."""
        cfg = cfg.get("text_config", cfg)
        n = int(cfg["num_hidden_layers"])
        kinds = cfg.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
        view = SimpleNamespace(num_hidden_layers=n, layer_types=kinds, sliding_window=cfg.get("sliding_window", 128))
        return replace(generic_config_shape(cfg), layer_windows=layer_windows(view))

    def norm(self, dim: int, eps: float) -> RMSNorm:
        return GptOssRMSNorm(dim, eps)

    def sparse_mlp(self, args: ModelArgs, layer: int, cfg: Any) -> GptOssMoeBlock:
        return GptOssMoeBlock(args, layer, cfg)

    def from_hub(self, state: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
        """The checkpoint's tensors as they are (experts stacked in transformers' layout), MXFP4 expert
        matrices (``*_blocks`` / ``*_scales``) dequantized to bf16."""
        return dequantize_mxfp4_state(state, where)

    def to_hub(
        self, named: Iterable[tuple[str, torch.Tensor]], source: str | None = None
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The names and tensors unchanged (the hub's bf16 layout is the in-memory one)."""
        return iter(named)


FAMILY = GptOss()
