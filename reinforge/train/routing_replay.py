"""Rollout routing replay: the engine's recorded experts laid out for the trainer's forward pass.

A mixture-of-experts policy routes each token to its top-k experts. The engine and the trainer
compute the router's logits with different kernels (and, in bf16, different rounding), so near a
tie they can pick different experts, and the trainer's log-prob of a sampled token then comes from
a different sub-network than the one that sampled it: a large train-vs-rollout mismatch, the main
source of instability in MoE RL (Ma et al. 2025, "Stabilizing MoE Reinforcement Learning by
Aligning Training and Inference Routers", arXiv:2510.11370; slime's ``--use-rollout-routing-replay``,
verl's ``routing_replay``).

With ``algo.use_rollout_routing_replay`` the engine records, for every response token, the experts
each MoE layer used at the position that predicted it (``Sample.routed_experts``
[response_length, num_moe_layers, k]), and the trainer's policy forward passes (old log-probs and
the training step) use those experts at those positions: the gate weights are still the trainer's
router probabilities of the replayed experts (renormalised as the model does), so the router keeps
its gradient. Every other position (the prompt, padding) is left to the trainer's router, marked
by -1 (:class:`~reinforge.models.moe.Routing`). The reference model's forward is not replayed: it
is a different model, whose router decides.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..records import Sample
from .batching import MicroBatch

__all__ = ["replay_experts"]


def replay_experts(
    mb: MicroBatch, samples: Sequence[Sample], moe_layers: Sequence[int], top_k: int
) -> dict[int, torch.Tensor] | None:
    """``Routing.replay`` for the forward pass of ``mb``: layer -> [R*T, k] int64 expert ids over
    the micro-batch's [R, T] input flattened row-major, the recorded experts of ``samples[i]`` at
    the positions that predict its response tokens (``mb.logit_rows`` / ``mb.logit_cols``) and -1
    (the router decides) elsewhere. With ``train.packing: shared_prompt`` the prompt's last position
    predicts the first token of every response in its row; its samples came from one prefill of
    that prompt, so their recorded experts there agree and any of them is used.

    Args:
        mb: the micro-batch (``mb.indices``: the sample index of each response-grid row).
        samples: the rollout's samples, indexed by ``mb.indices``.
        moe_layers: the model's MoE layer indices, in the order of ``routed_experts``' second axis.
        top_k: experts per token of the model.
    Returns:
        the replay dict, or None for a micro-batch without samples (a padding micro-batch).
    Raises:
        ValueError: a sample without ``routed_experts`` or with the wrong shape (naming the sample).
    """
    if not mb.indices:
        return None
    R, T = mb.input_ids.shape
    parts = []
    for i in mb.indices:
        s = samples[i]
        r = s.routed_experts
        if r is None:
            raise ValueError(
                f"algo.use_rollout_routing_replay=true: sample {s.index} (group {s.group_index}) has "
                f"no recorded expert routes (Sample.routed_experts is None); they come from the "
                f"embedded engine's rollout (a custom rollout function must copy "
                f"GenerateResult.routed_experts into its samples)"
            )
        if tuple(r.shape) != (s.response_length, len(moe_layers), top_k):
            raise ValueError(
                f"algo.use_rollout_routing_replay=true: sample {s.index}'s routed_experts has shape "
                f"{tuple(r.shape)}, expected [response_length={s.response_length}, "
                f"num_moe_layers={len(moe_layers)}, num_experts_per_tok={top_k}]"
            )
        parts.append(r)
    device = mb.input_ids.device
    routes = torch.cat(parts).to(device=device, dtype=torch.long)  # [N, layers, k], grid row-major
    where = mb.logit_rows * T + mb.logit_cols
    replay = torch.full((len(moe_layers), R * T, top_k), -1, dtype=torch.long, device=device)
    replay[:, where] = routes.transpose(0, 1)
    return {layer: replay[j] for j, layer in enumerate(moe_layers)}
