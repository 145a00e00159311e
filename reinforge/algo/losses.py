"""Policy-gradient, KL and entropy terms, per token, and their aggregation.

Every per-token function takes ``[B, T]`` tensors (micro-batch of right-padded responses)
and returns ``[B, T]``; padding and tokens with loss mask 0 are removed by :func:`aggregate`.

Three registries hold the interchangeable parts the config names: :data:`POLICY_LOSSES`
(``algo.policy_loss``), :data:`KL_ESTIMATORS` (``algo.kl_loss_type``) and
:data:`LOSS_AGG_MODES` (``algo.loss_agg_mode``). A policy loss has the signature
``fn(log_probs, old_log_probs, advantages, mask, algo) -> (loss, ratio, clipped)``, all [B, T]
(``clipped`` bool), where ``algo`` is the ``algo`` config section.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .masking import masked_select
from .registries import KL_ESTIMATORS as KL_ESTIMATORS  # names in .registries (read by the config, no torch)
from .registries import LOSS_AGG_MODES as LOSS_AGG_MODES
from .registries import POLICY_LOSSES as POLICY_LOSSES

PolicyLoss = Callable[..., "tuple[torch.Tensor, torch.Tensor, torch.Tensor]"]

LOG_RATIO_BOUND = 20.0
"""Log-ratios are clamped to [-20, 20] before ``exp`` (as verl's policy losses): exp(20) ~ 4.9e8
is finite in fp32, so no ratio or gradient becomes inf/NaN; beyond the bound the gradient is 0."""


def safe_ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    """``exp(clamp(log_ratio, -20, 20))`` (:data:`LOG_RATIO_BOUND`), same shape."""
    return torch.exp(log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))


def ppo_clip_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float | None = None,
    clip_c: float | None = None,
    ratio: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate (Schulman et al. 2017, eq. 7), negated to be minimised.

    loss = -min(ratio * A, clip(ratio, 1 - eps_clip, 1 + eps_clip_high) * A),
    ratio = exp(clamp(log_probs - old_log_probs, -20, 20)) (the clamp as verl's
    ``compute_policy_loss_vanilla``: an extreme log-ratio gives a finite loss and gradient,
    and a clipped token's gradient stays 0). ``eps_clip_high`` defaults to ``eps_clip``;
    a larger upper bound is DAPO's clip-higher (Yu et al. 2025). ``clip_c`` (> 1) adds the
    dual clip for negative advantages, loss <= -clip_c * A (Ye et al. 2020, "Mastering
    Complex Control in MOBA Games"; verl's ``clip_ratio_c``). ``ratio`` overrides the
    token ratio (GSPO passes its sequence-level ratio).

    Returns:
        (loss [B, T], ratio [B, T], clipped [B, T] bool: where a clipped branch was taken).
    """
    hi = eps_clip if eps_clip_high is None else eps_clip_high
    if ratio is None:
        ratio = safe_ratio(log_probs - old_log_probs)
    loss_unclipped = -ratio * advantages
    loss_clipped = -ratio.clamp(1.0 - eps_clip, 1.0 + hi) * advantages
    loss = torch.maximum(loss_unclipped, loss_clipped)
    clipped = loss_clipped > loss_unclipped
    if clip_c is not None:
        dual = -advantages * clip_c
        use_dual = (advantages < 0) & (loss > dual)
        loss = torch.where(use_dual, dual, loss)
        clipped = clipped | use_dual
    return loss, ratio, clipped


def gspo_ratio(log_probs: torch.Tensor, old_log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO's sequence-level importance ratio, per token (Zheng et al. 2025, "Group Sequence
    Policy Optimization", eq. 7-10; verl ``compute_policy_loss_gspo``).

    s_i = exp(mean_t (log pi - log pi_old) over the sequence's ``mask`` tokens); each token gets
    s_i' = sg(s_i) * exp(log pi_t - sg(log pi_t)): the value is s_i, the gradient that of
    log pi_t scaled by s_i; the log is clamped at 10 as verl's. The objective passes the loss mask,
    or under ``tis_mode: reject`` the kept tokens only (verl's ``rollout_rs`` edits the response
    mask its GSPO averages over; masked-IS tokens, weight 0, stay in).

    Args:
        log_probs, old_log_probs: [B, T] float; mask: [B, T] 0/1.
    Returns:
        [B, T] ratios, ``log_probs``' dtype.
    """
    count = (mask != 0).sum(-1).clamp(min=1).to(log_probs.dtype)
    seq_log_ratio = masked_select(log_probs - old_log_probs, mask).sum(-1) / count
    token = seq_log_ratio.detach()[:, None] + log_probs - log_probs.detach()
    return torch.exp(token.clamp(max=10.0))


def behaviour_importance_weight(
    prox_log_probs: torch.Tensor, behav_log_probs: torch.Tensor, max_weight: float | None = None
) -> torch.Tensor:
    """The decoupled objective's importance weight pi_prox / pi_behav per token, without gradient
    (Fu et al. 2025, "AReaL: A Large-Scale Asynchronous Reinforcement Learning System for
    Language Reasoning", eq. 5).

    Args:
        prox_log_probs: [B, T] log pi_prox(token), the trainer's log-probs before the update.
        behav_log_probs: [B, T] log pi_behav(token), the engine's sampling log-probs (the policy
            version(s) that generated the token).
        max_weight: cap the weight at this value (truncated importance sampling, Yao et al. 2025);
            None: uncapped.

    Returns:
        [B, T] fp weights >= 0 (detached); the log-ratio is clamped to [-20, 20] first
        (:func:`safe_ratio`), so a weight is finite.
    """
    w = safe_ratio((prox_log_probs - behav_log_probs).detach())
    return w if max_weight is None else w.clamp(max=max_weight)


TIS_MODES = ("truncate", "mask", "reject")
"""The values of ``algo.tis_mode`` (:func:`importance_correction`)."""


def importance_correction(
    weight: torch.Tensor, mode: str, clip: float, clip_low: float = 0.0
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The off-policy correction between the engine that sampled a token and the trainer, per token.

    ``weight`` is w = pi_train / pi_rollout = exp(log pi_old - log pi_rollout) (log clamped to
    [-20, 20], :func:`safe_ratio`; with the decoupled objective pi_old is the proximal policy, so w
    is AReaL's pi_prox / pi_behav). The policy loss of each token is multiplied by the returned
    factor (the importance weight carries no gradient):

    * ``truncate``: ``min(w, clip)``: truncated importance sampling (TIS; Yao et al. 2025, "Your
      Efficient RL Framework Secretly Brings You Off-Policy RL Training"; verl's ``rollout_is:
      token`` with a single ``rollout_is_threshold``).
    * ``mask``: ``w`` where ``clip_low <= w <= clip``, 0 elsewhere: masked importance sampling, the
      kept tokens weighted by their w (IcePop: slime's ``icepop_function``, ``ice_weight =
      where(low <= ratio <= high, ratio, 0)``; verl's ``rollout_is: token`` with a
      ``"lower_upper"`` ``rollout_is_threshold``). The token stays in the loss mask: its KL and
      entropy terms and the normalisers are unchanged, only its policy loss is 0.
    * ``reject``: no factor (None): the tokens with w outside ``[clip_low, clip]`` leave the loss
      and the kept ones are not weighted: rejection sampling (verl's ``rollout_rs: token_k1`` with
      ``rollout_rs_threshold: "lower_upper"``; the caller removes the rejected tokens from the
      loss sums).

    Args:
        weight: [B, T] float w >= 0, detached.
        mode: one of :data:`TIS_MODES`.
        clip, clip_low: the bounds (``algo.tis_clip`` >= 1, ``algo.tis_clip_low`` in [0, 1)).

    Returns:
        (factor [B, T] of ``weight``'s dtype, or None for ``reject``; inside [B, T] bool,
        ``clip_low <= w <= clip``).

    Raises:
        ValueError: unknown ``mode``.
    """
    if mode not in TIS_MODES:
        raise ValueError(f"unknown tis_mode {mode!r}; choose one of {list(TIS_MODES)}")
    inside = (weight >= clip_low) & (weight <= clip)
    if mode == "truncate":
        return weight.clamp(max=clip), inside
    if mode == "mask":
        return torch.where(inside, weight, torch.zeros((), dtype=weight.dtype, device=weight.device)), inside
    return None, inside


def decoupled_policy_loss(
    policy_loss: PolicyLoss,
    log_probs: torch.Tensor,
    prox_log_probs: torch.Tensor,
    behav_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    algo: Any,
    max_weight: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decoupled PPO objective (Fu et al. 2025, AReaL, eq. 5), negated to be minimised:

        loss = -(pi_prox / pi_behav) * min(r * A, clip(r, 1 - eps, 1 + eps_high) * A),
        r = pi_theta / pi_prox,

    which equals -min(pi_theta / pi_behav * A, clip(pi_theta / pi_prox) * pi_prox / pi_behav * A):
    the trust region is centred on the proximal policy (the trainer's weights before this
    update, recomputed by the trainer), and the importance weight corrects for the behaviour
    policy that sampled the token (an older policy version in asynchronous RL; the engine's
    numerics in any case). ``policy_loss`` (a :data:`POLICY_LOSSES` entry: token PPO, GSPO...)
    computes the clipped term with pi_prox as its "old" policy. With pi_behav = pi_prox the
    weight is 1 and the loss is ``policy_loss``'s. With ``algo.use_tis`` the trainer replaces the
    weight by :func:`importance_correction`'s factor (the same as in the plain objective).

    Args:
        policy_loss: ``fn(log_probs, old_log_probs, advantages, mask, algo) -> (loss, ratio, clipped)``.
        log_probs, prox_log_probs, behav_log_probs, advantages, mask: [B, T].
        algo: the ``algo`` config section (clip ranges).
        max_weight: cap of the importance weight (TIS), None uncapped.

    Returns:
        (loss [B, T], ratio r [B, T], clipped [B, T] bool, importance weight [B, T]).
    """
    w = behaviour_importance_weight(prox_log_probs, behav_log_probs, max_weight)
    loss, ratio, clipped = policy_loss(log_probs, prox_log_probs, advantages, mask, algo)
    return loss * w, ratio, clipped, w


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, value_clip: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped value loss, per token: 0.5 * max((V - R)^2, (clip(V, V_old +- c) - R)^2)
    (Schulman et al. 2017; OpenAI baselines ppo2, verl ``compute_value_loss``).

    Returns:
        (loss [B, T], clipped [B, T] bool).
    """
    unclipped = (values - returns) ** 2
    if value_clip is None:
        return 0.5 * unclipped, torch.zeros_like(unclipped, dtype=torch.bool)
    v_clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)
    clipped = (v_clipped - returns) ** 2
    return 0.5 * torch.maximum(unclipped, clipped), clipped > unclipped


# the KL estimators of KL_ESTIMATORS (registered by name in .registries), of log_ratio = log pi - log pi_ref
def kl_k1(log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio


def kl_k2(log_ratio: torch.Tensor) -> torch.Tensor:
    return 0.5 * log_ratio.square()


def kl_k3(log_ratio: torch.Tensor) -> torch.Tensor:
    return torch.exp(-log_ratio) - 1.0 + log_ratio


def kl_low_var(log_ratio: torch.Tensor) -> torch.Tensor:
    x = log_ratio.clamp(-20.0, 20.0)
    return (torch.exp(-x) - 1.0 + x).clamp(-10.0, 10.0)


def kl_penalty(
    log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kl_type: str = "k3", mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman 2020,
    "Approximating KL Divergence"):

    * k1: log r, with log r = log pi - log pi_ref (unbiased, high variance, can be negative)
    * k2: (log r)^2 / 2
    * k3: exp(-log r) - 1 + log r (unbiased, non-negative; the GRPO paper's estimator, eq. 4),
      unclamped: inf where log r < -88 in fp32. verl's ``kl_penalty`` makes "k3" an alias of
      its ``low_var_kl``; here k3 is the plain estimator and low_var_kl the clamped one.
    * low_var_kl: k3 with log r clamped to [-20, 20] and the result to [-10, 10] (verl)

    k1, k2 and low_var_kl equal verl's estimators of those names.

    ``mask`` ([B, T] 0/1, optional): the log-ratio is set to 0 outside it before the estimator,
    so a masked token (a tool output, padding) gives KL 0 with a finite gradient; selecting
    afterwards (:func:`aggregate`) keeps the loss finite but not k3's gradient (0 * inf).

    Raises:
        ValueError: unknown ``kl_type``.
    """
    if kl_type not in KL_ESTIMATORS:
        raise ValueError(f"unknown kl type {kl_type!r}; choose one of {KL_ESTIMATORS.names()}")
    log_ratio = log_probs - ref_log_probs
    if mask is not None:
        log_ratio = masked_select(log_ratio, mask)
    return KL_ESTIMATORS.get(kl_type)(log_ratio)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim: [..., V] -> [...] (fp32)."""
    logits = logits.float()
    log_p = torch.log_softmax(logits, dim=-1)
    return -(log_p.exp() * log_p).sum(-1)


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token_mean",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    norm_length: float | None = None,
    norm_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce per-token values [B, T] to a scalar, counting only ``mask`` tokens.

    Modes (verl's ``agg_loss`` in ``verl/trainer/ppo/core_algos.py``, with its global-batch
    denominators), registered in :data:`LOSS_AGG_MODES`; ``S_i`` is sequence i's sum of
    ``values`` over its ``mask`` tokens, ``n_i`` its count of ``norm_mask`` tokens, ``S`` the
    sequences with at least one such token:

    * ``token_mean``: sum_i S_i / sum_i n_i (DAPO's token-level loss).
    * ``seq_mean_token_sum``: mean over S of S_i (Dr. GRPO without the constant).
    * ``seq_mean_token_mean``: mean over S of S_i / n_i (the GRPO paper, eq. 3).
    * ``seq_mean_token_sum_norm``: mean over S of S_i / ``norm_length`` (Dr. GRPO, Liu et al.
      2025, eq. 3: a constant, the max response length, instead of each length). As verl's
      mode since its global-batch rework (``loss_scale_factor`` = the max response length,
      verl's default being the padded response width); verl before 0.7.0 summed S_i over
      the micro-batch without dividing by the sequence count.

    Values outside ``mask`` are selected out, not multiplied by 0: an inf or NaN there does
    not reach the result (nor, when ``values`` is a leaf, its gradient).

    Args:
        values: [B, T] float per-token losses.
        mask: [B, T] 0/1, the tokens whose values are summed.
        num_tokens / num_seqs: override sum_i n_i / |S| (the global batch's counts), so that
            micro-batches of one global batch each divide by the global batch's counts and
            their gradients add up to the global batch's loss.
        norm_length: the constant of ``seq_mean_token_sum_norm``.
        norm_mask: [B, T] 0/1, the tokens counted in the denominators (n_i, S); default
            ``mask``. Masked importance sampling passes the loss mask here and the kept tokens
            as ``mask``: dropped tokens leave the sums and stay in the normalisers, as in
            every mode's ``num_tokens`` / ``num_seqs``.

    Raises:
        ValueError: unknown ``mode``, or ``seq_mean_token_sum_norm`` without ``norm_length``.
    """
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {LOSS_AGG_MODES.names()}")
    selected = masked_select(values, mask)
    counts = ((mask if norm_mask is None else norm_mask) != 0).sum(-1).to(values.dtype)
    if mode == "token_mean":
        denom = counts.sum().clamp(min=1.0) if num_tokens is None else max(float(num_tokens), 1.0)
        return selected.sum() / denom
    per_seq = LOSS_AGG_MODES.get(mode)(selected.sum(-1), counts, norm_length)
    has_tokens = counts > 0
    denom = has_tokens.sum().clamp(min=1).to(values.dtype) if num_seqs is None else max(float(num_seqs), 1.0)
    return masked_select(per_seq, has_tokens).sum() / denom


# Each sequence mode maps (token sums [B], token counts [B], norm_length) to per-sequence values [B],
# averaged over sequences by aggregate(); token_mean is handled there directly (one global denominator).
# (registered by name in .registries: token_mean and seq_mean_token_sum -> agg_token_sum, seq_mean_token_mean ->
# agg_token_mean, seq_mean_token_sum_norm -> agg_token_sum_norm)
def agg_token_sum(seq_sum: torch.Tensor, counts: torch.Tensor, norm_length: float | None) -> torch.Tensor:
    return seq_sum


def agg_token_mean(seq_sum: torch.Tensor, counts: torch.Tensor, norm_length: float | None) -> torch.Tensor:
    return seq_sum / counts.clamp(min=1.0)


def agg_token_sum_norm(seq_sum: torch.Tensor, counts: torch.Tensor, norm_length: float | None) -> torch.Tensor:
    if not norm_length:
        raise ValueError("seq_mean_token_sum_norm needs norm_length (the max response length)")
    return seq_sum / norm_length


# ---------------------------------------------------------------------------- registered policy losses
# (registered by name in .registries)


def ppo_policy_loss(
    log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, algo: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token-level PPO clip (:func:`ppo_clip_loss`) with ``algo.eps_clip``, ``eps_clip_high``, ``eps_clip_c``."""
    return ppo_clip_loss(log_probs, old_log_probs, advantages, algo.eps_clip, algo.eps_clip_high, algo.eps_clip_c)


def gspo_policy_loss(
    log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, algo: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GSPO: the PPO clip applied to the sequence-level ratio (:func:`gspo_ratio`), with the dual clip
    ``algo.eps_clip_c`` when set, as slime (its ``compute_policy_loss`` takes the GSPO sequence
    log-ratio and applies ``eps_clip_c``); verl's ``compute_policy_loss_gspo`` has no dual clip."""
    ratio = gspo_ratio(log_probs, old_log_probs, mask)
    return ppo_clip_loss(
        log_probs, old_log_probs, advantages, algo.eps_clip, algo.eps_clip_high, algo.eps_clip_c, ratio
    )
