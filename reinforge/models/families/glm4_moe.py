"""The ``glm4_moe`` family: GLM-4.5 / GLM-4.5-Air / GLM-4.6 (zai-org), the mixture-of-experts
family slime trains. Formulas: ``transformers/models/glm4_moe/modeling_glm4_moe.py`` (fp32 logits
agree with ``Glm4MoeForCausalLM``: ``tests/integration/test_glm4_moe.py``).

Differences from the Llama / Qwen defaults (:class:`~reinforge.models.families.base.Family`):

* attention: ``attention_bias`` on q/k/v only (o has none); an RMSNorm over each query and key head
  when ``use_qk_norm``; **partial RoPE**: the first ``int(head_dim * partial_rotary_factor)``
  dimensions of each head are rotated (0.5 in GLM-4.5), the rest pass through
  (:attr:`ModelArgs.rotary_dim <reinforge.models.args.ModelArgs>`);
* the first ``first_k_dense_replace`` layers keep a dense MLP (``intermediate_size``), every later
  one is a mixture of experts (:class:`Glm4MoeBlock`);
* the router (:class:`TopkRouter`, under ``mlp.gate.``) scores each expert with a **sigmoid** in
  fp32, ``s = sigmoid(x @ W.T)`` [N, E]; the choice adds the **score-correction bias**
  ``e_score_correction_bias`` [E] (DeepSeek-V3's auxiliary-loss-free balancing: the bias moves
  load between experts and is not trained by gradients), keeps the ``topk_group`` best of
  ``n_group`` expert groups (a group scored by the sum of its two best biased scores) and takes the
  top ``num_experts_per_tok`` among them; the gate weights are the *unbiased* scores of the chosen
  experts, divided by their sum (+1e-20) when ``norm_topk_prob``, times ``routed_scaling_factor``;
* ``n_shared_experts`` shared experts: one SwiGLU MLP of ``n_shared_experts x moe_intermediate_size``
  (``mlp.shared_experts.*``) added to every token's output, without a gate.

Parameters (Hugging Face names, transformers 5's stacked experts; the hub stores experts one by one,
converted by the defaults ``from_hub`` / ``to_hub``): ``mlp.gate.weight`` [E, H],
``mlp.gate.e_score_correction_bias`` [E] (a frozen parameter, so that export, weight sync and
checkpoints carry it: transformers keeps it as a buffer under the same name),
``mlp.experts.gate_up_proj`` [E, 2I, H], ``mlp.experts.down_proj`` [E, H, I],
``mlp.shared_experts.{gate,up,down}_proj.weight``. The multi-token-prediction layers of published
checkpoints (``model.layers.{num_hidden_layers}.*``) are not built: loading logs them as ignored.

Routing replay (:class:`~reinforge.models.moe.Routing`): replayed experts get the unbiased sigmoid
scores as gate weights, renormalised and scaled as above. The load-balancing statistics read the
sigmoid scores normalised per token (DeepSeek-V3's sequence-wise auxiliary loss uses the same
normalisation); ``train.moe_aux_loss_coeff`` stays 0 for GLM's aux-loss-free checkpoints unless
asked for.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..args import ModelArgs, check_top_k, dense_args
from ..moe import SparseMoeBlock
from ..transformer import MLP
from .base import ConfigShape, Family, generic_config_shape


class TopkRouter(nn.Module):
    """GLM's router parameters: ``weight`` [E, H] and ``e_score_correction_bias`` [E] (frozen)."""

    def __init__(self, num_experts: int, hidden_size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(num_experts), requires_grad=False)


class Glm4MoeBlock(SparseMoeBlock):
    """GLM-4.5's mixture-of-experts MLP: sigmoid scores, biased group-limited top-k choice,
    scaled gate weights, ungated shared experts (module doc). Shapes as
    :class:`~reinforge.models.moe.SparseMoeBlock`.

    Raises:
        ValueError: ``n_group`` does not divide the experts, ``topk_group`` is outside
            [1, n_group], or the kept groups hold fewer than ``num_experts_per_tok`` experts.
    """

    def __init__(self, args: ModelArgs, layer: int, cfg: Any):
        super().__init__(
            args.hidden_size,
            args.num_experts,
            args.num_experts_per_tok,
            args.moe_intermediate_size,
            args.norm_topk_prob,
            layer,
        )
        E = args.num_experts
        self.n_group, self.topk_group = int(cfg.n_group or 1), int(cfg.topk_group or 1)
        if E % self.n_group or not 1 <= self.topk_group <= self.n_group:
            raise ValueError(
                f"config.json: n_group={self.n_group} must divide n_routed_experts={E} and topk_group="
                f"{self.topk_group} be in [1, n_group]"
            )
        if self.n_group > 1 and (E // self.n_group < 2 or self.topk_group * E // self.n_group < self.top_k):
            raise ValueError(
                f"config.json: topk_group={self.topk_group} groups of {E // self.n_group} experts (at "
                f"least 2 each) must hold num_experts_per_tok={self.top_k}"
            )
        self.routed_scaling_factor = float(cfg.routed_scaling_factor)
        self.gate = TopkRouter(E, args.hidden_size)
        self.shared_experts = (
            MLP(args, args.shared_expert_intermediate_size) if args.shared_expert_intermediate_size else None
        )

    def fuse_projection(self, on: bool) -> None:
        """The shared experts' gate / up projections as one matmul (inference)."""
        if self.shared_experts is not None:
            self.shared_experts.fuse_projection(on)

    def router_scores(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.dtype]:
        """``sigmoid(x @ gate.weight.T)`` [N, E] computed in fp32 (autocast off, as transformers
        keeps the router in fp32); the gate weights stay fp32."""
        with torch.autocast(x.device.type, enabled=False):
            logits = F.linear(x.float(), self.gate.weight.float())
        return logits.sigmoid(), torch.float32

    def select(self, scores: torch.Tensor) -> torch.Tensor:
        """The top k of ``scores + e_score_correction_bias`` within the ``topk_group`` best groups
        [N, k] int64 (no host read: a CUDA graph captures it)."""
        choice = scores + self.gate.e_score_correction_bias.float()
        if self.topk_group < self.n_group:  # all groups kept: the mask would keep everything
            N, per = choice.shape[0], choice.shape[1] // self.n_group
            group_scores = choice.view(N, self.n_group, per).topk(2, dim=-1).values.sum(-1)
            keep = torch.topk(group_scores, self.topk_group, dim=-1).indices
            mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, keep, True)
            choice = choice.masked_fill(~mask.repeat_interleave(per, dim=1), float("-inf"))
        return torch.topk(choice, self.top_k, dim=-1).indices

    def gate_weights(self, scores: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The unbiased scores of ``ids``, normalised (``norm_topk_prob``) and scaled by
        ``routed_scaling_factor`` [N, k] fp32."""
        weights = scores.gather(1, ids)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * self.routed_scaling_factor

    def balance_probs(self, scores: torch.Tensor) -> torch.Tensor:
        """The sigmoid scores normalised per token (rows sum to 1)."""
        return scores / scores.sum(dim=-1, keepdim=True)

    def add_shared(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return y if self.shared_experts is None else y + self.shared_experts(x)


class Glm4Moe(Family):
    model_type = "glm4_moe"
    fp32_params = (".mlp.gate.weight", ".mlp.gate.e_score_correction_bias")  # (transformers keeps them fp32)

    def model_args(self, cfg: Any) -> ModelArgs:
        args = dense_args(
            cfg,
            qkv_bias=bool(getattr(cfg, "attention_bias", False)),
            o_bias=False,
            qk_norm=bool(getattr(cfg, "use_qk_norm", False)),
        )
        E, top_k, first = int(cfg.n_routed_experts or 0), int(cfg.num_experts_per_tok), int(cfg.first_k_dense_replace)
        layers = tuple(range(max(first, 0), cfg.num_hidden_layers)) if E else ()
        check_top_k(top_k, E, layers)
        return args.with_(
            num_experts=E,
            num_experts_per_tok=top_k,
            moe_intermediate_size=cfg.moe_intermediate_size,
            norm_topk_prob=bool(cfg.norm_topk_prob),
            moe_layers=layers,
            shared_expert_intermediate_size=int(cfg.n_shared_experts or 0) * cfg.moe_intermediate_size,
        )

    def config_shape(self, cfg: dict) -> ConfigShape:
        shared = int(cfg.get("n_shared_experts", 1) or 0) * int(cfg.get("moe_intermediate_size") or 0)
        return generic_config_shape(cfg, ("n_routed_experts", "num_local_experts"), shared)

    def sparse_mlp(self, args: ModelArgs, layer: int, cfg: Any) -> Glm4MoeBlock:
        return Glm4MoeBlock(args, layer, cfg)


FAMILY = Glm4Moe()
