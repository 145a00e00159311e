"""The policy objective of one micro-batch: a pure function of per-token tensors.

:func:`policy_objective` combines the pieces the ``algo`` section chooses: the policy loss
(:data:`~.losses.POLICY_LOSSES`, e.g. the PPO clip), the off-policy correction between the
trainer and the engine (truncated or masked importance sampling, rejection, or AReaL's decoupled
objective), the KL penalty to the reference, the entropy bonus, and the aggregation
(:data:`~.losses.LOSS_AGG_MODES`). It returns the loss to backpropagate and its statistics
(verl's policy losses likewise return their metrics as part of the contract); the actor only
batches, runs backward and steps.

All per-token tensors are ``[S, L]`` grids (S sequences of the micro-batch, L its longest
response), fp32; ``mask`` is the loss mask (0 on padding, tool outputs and filtered samples).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .losses import POLICY_LOSSES, aggregate, importance_correction, kl_penalty, safe_ratio

STAT_KEYS = (
    "pg_loss",
    "kl",
    "entropy",
    "clipfrac",
    "ratio",
    "importance_weight",
    "tis_truncated",
    "tis_masked",
    "approx_kl",
    "logprob_abs_diff",
)
"""Statistics of :func:`policy_objective`: sums over the loss-mask tokens (divide by their count
for means); ``kl`` only with a reference, ``tis_*`` only with ``algo.use_tis`` (``tis_truncated`` with
``tis_mode: truncate``, ``tis_masked`` with ``mask`` / ``reject``)."""


@dataclass
class ObjectiveInputs:
    """The per-token tensors of one micro-batch, each ``[S, L]`` fp32.

    Attributes:
        log_probs: the policy's log-probs (with gradient).
        old_log_probs: the log-probs the ratio is taken against (the rollout's old policy; the
            proximal policy with the decoupled objective); detached.
        rollout_log_probs: the engine's log-probs of the sampled tokens (the behaviour policy).
        advantages: per-token advantages.
        mask: the loss mask (0/1).
        entropy: the policy's entropy per token (with gradient when it is in the loss).
        ref_log_probs: the reference model's log-probs, or None without a KL loss.
    """

    log_probs: torch.Tensor
    old_log_probs: torch.Tensor
    rollout_log_probs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    entropy: torch.Tensor
    ref_log_probs: torch.Tensor | None = None


def policy_objective(
    x: ObjectiveInputs, algo: Any, *, decoupled: bool, num_tokens: float, num_seqs: float, norm_length: int
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of one micro-batch and its statistics.

    Per token: ``pg = policy_loss(log_probs, old, advantages) * c``, then ``+ kl_loss_coef *
    KL(policy || reference)`` (``kl_loss_type``) ``- entropy_coef * entropy``, aggregated by
    ``loss_agg_mode`` with the global step's token / sequence counts. The factor ``c`` corrects
    for the engine that sampled the tokens, ``w = exp(old - rollout)`` per token:

    * ``algo.use_tis``: :func:`~.losses.importance_correction` for ``algo.tis_mode``, the same
      with and without ``decoupled``: ``truncate`` ``c = min(w, tis_clip)`` (TIS, Yao et al.
      2025); ``mask`` ``c = w`` inside ``[tis_clip_low, tis_clip]``, 0 outside (masked importance
      sampling as slime's ``icepop_function`` / verl's IcePop; the token keeps its KL and
      entropy terms and its place in the GSPO sequence ratio); ``reject`` ``c = 1`` and the tokens
      outside leave the loss sums altogether (policy, KL and entropy terms, and the GSPO sequence
      ratio, which then averages the kept tokens only: verl's ``rollout_rs``, which removes them
      from its response mask).
    * otherwise, with ``decoupled``: ``c = w`` uncapped, AReaL's decoupled objective (Fu et al.
      2025, eq. 5; :func:`~.losses.decoupled_policy_loss` is the same formula); without: ``c = 1``.

    ``old`` is the rollout's old policy (the proximal policy with ``decoupled``). Dropped tokens
    (``reject``) and zero-weighted ones (``mask``) stay in every normaliser (the loss mask's
    counts), as slime, whose rejection functions keep the per-rollout denominators of the original
    loss masks (verl's ``rollout_rs`` takes them out of its token counts).

    Args:
        x: the micro-batch's tensors (:class:`ObjectiveInputs`).
        algo: the ``algo`` config section.
        decoupled: use the decoupled PPO objective (``Config.decoupled_loss``).
        num_tokens, num_seqs: loss-mask tokens and sequences of the whole optimizer step (so that
            micro-batch gradients add up to the step's loss).
        norm_length: the constant of ``seq_mean_token_sum_norm`` (the max response length).

    Returns:
        (loss, a scalar with gradient; statistics: detached scalar sums over the loss-mask tokens,
        keys of :data:`STAT_KEYS`, those that do not apply left out: ``tis_truncated`` counts the
        tokens with ``w > tis_clip`` (``truncate``), ``tis_masked`` those outside the bounds
        (``mask``, ``reject``)).
    """
    policy_loss = POLICY_LOSSES.get(algo.policy_loss)
    old, behav, mask = x.old_log_probs, x.rollout_log_probs, x.mask
    iw = safe_ratio((old - behav).detach())  # trainer vs engine: exp(old - rollout), clamped log-ratio
    stats: dict[str, torch.Tensor] = {}
    factor, kept = None, mask
    if algo.use_tis:
        factor, inside = importance_correction(iw, algo.tis_mode, algo.tis_clip, algo.tis_clip_low)
        if algo.tis_mode == "truncate":
            stats["tis_truncated"] = _token_sum((iw > algo.tis_clip).float(), mask)
        else:
            stats["tis_masked"] = _token_sum((~inside).float(), mask)
        if algo.tis_mode == "reject":
            kept = mask * inside.to(mask.dtype)
    elif decoupled:  # AReaL's objective: clip against pi_prox (old), weight pi_prox / pi_behav
        factor = iw
    pg, ratio, clipped = policy_loss(x.log_probs, old, x.advantages, kept, algo)
    if factor is not None:
        pg = pg * factor
    total = pg
    if x.ref_log_probs is not None:
        kl = kl_penalty(x.log_probs, x.ref_log_probs, algo.kl_loss_type, mask)
        total = total + algo.kl_loss_coef * kl
        stats["kl"] = _token_sum(kl, mask)
    if algo.entropy_coef > 0:
        total = total - algo.entropy_coef * x.entropy
    loss = aggregate(
        total,
        kept,
        algo.loss_agg_mode,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        norm_length=norm_length,
        norm_mask=mask,
    )
    stats.update(
        pg_loss=_token_sum(pg, mask),
        ratio=_token_sum(ratio, mask),
        clipfrac=_token_sum(clipped.float(), mask),
        entropy=_token_sum(x.entropy, mask),
        importance_weight=_token_sum(iw, mask),
        approx_kl=_token_sum(kl_penalty(x.log_probs.detach(), old, "k3", mask), mask),
        logprob_abs_diff=_token_sum((old - behav).abs(), mask),
    )
    return loss, stats


def _token_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of ``x`` over the mask's tokens, detached (selected, so a non-finite value elsewhere is
    left out)."""
    return torch.where(mask.bool(), x.detach().float(), 0.0).sum()
