"""Advantage estimators: pure tensor functions, and the registry the config chooses from.

Outcome estimators (GRPO, Dr. GRPO, RLOO) turn one scalar reward per sample into one
advantage per sample (broadcast to its tokens); token-level estimators (REINFORCE++, GAE)
turn per-token rewards (the outcome at the last token, minus any KL penalty) and, for GAE, a
critic's values into per-token advantages and returns.

Every registered estimator has the signature ``fn(inputs: AdvantageInputs, algo) ->
(advantages [N, T], returns [N, T] | None)`` where ``algo`` is the ``algo`` config section.
Adding one (docs/design.md has a worked example)::

    @ADV_ESTIMATORS.register("my_estimator", group_based=True, reads=("gamma",))
    def my_estimator(inputs, algo):
        ...

Registration properties: ``group_based`` (needs ``n_samples_per_prompt >= 2``),
``needs_critic`` (a value model is trained and its values are passed in ``inputs.values``),
``reads`` (the ``algo.*`` keys it uses; setting one with another estimator is refused).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..utils.registry import Registry

Estimator = Callable[["AdvantageInputs", Any], "tuple[torch.Tensor, torch.Tensor | None]"]
ADV_ESTIMATORS: Registry[Estimator] = Registry("advantage estimator", "algo.advantage_estimator")


@dataclass
class AdvantageInputs:
    """What every estimator receives, for N = G * n samples flattened group-major.

    Attributes:
        rewards: [G, n] float32 scalar rewards after shaping (over-long penalty, clip, normalisation).
        mask: [N, T] float32, 1 on response tokens (right-padded to the longest response T).
        loss_mask: [N, T] float32, additionally 0 on tokens excluded from the loss.
        token_kl: [N, T] float32 ``kl_coef * KL`` per token (KL in the reward), or None.
        values: [N, T] float32 critic values, or None (estimators registered ``needs_critic`` get them).
    """

    rewards: torch.Tensor
    mask: torch.Tensor
    loss_mask: torch.Tensor
    token_kl: torch.Tensor | None = None
    values: torch.Tensor | None = None

    def outcome(self) -> torch.Tensor:
        """[G, n] rewards minus each sequence's summed KL penalty (outcome estimators)."""
        if self.token_kl is None:
            return self.rewards
        return self.rewards - (self.token_kl * self.mask).sum(-1).view_as(self.rewards)

    def token_rewards(self, outcome: torch.Tensor) -> torch.Tensor:
        """[N, T]: ``outcome`` ([G, n] or [N]) at each response's last token, minus the KL penalty."""
        lengths = self.mask.sum(-1).long()
        out = torch.zeros_like(self.mask)
        rows = torch.nonzero(lengths > 0).flatten()
        out[rows, lengths[rows] - 1] = outcome.flatten()[rows].to(out.dtype)
        if self.token_kl is not None:
            out = out - self.token_kl * self.mask
        return out

    def broadcast(self, per_sample: torch.Tensor) -> torch.Tensor:
        """[G, n] or [N] per-sample values -> [N, T] on the response tokens."""
        return per_sample.flatten()[:, None].to(self.mask.dtype) * self.mask


def _check_groups(rewards: torch.Tensor) -> None:
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [num_groups, n_samples_per_prompt], got shape {tuple(rewards.shape)}")


def grpo_advantages(rewards: torch.Tensor, std_normalization: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Group-relative advantages (GRPO, Shao et al. 2024, "DeepSeekMath", sec. 4.1.2).

    A_i = (r_i - mean(r_group)) / (std(r_group) + eps), or r_i - mean(r_group) without
    std normalisation (Dr. GRPO, Liu et al. 2025, "Understanding R1-Zero-Like Training").
    The std is the unbiased sample std, as in verl's ``compute_grpo_outcome_advantage``;
    a group of one sample gets advantage 0.

    Args:
        rewards: [num_groups, n_samples_per_prompt] float.
    Returns:
        advantages of the same shape and dtype.
    """
    _check_groups(rewards)
    if rewards.shape[1] < 2:
        return torch.zeros_like(rewards)
    centered = rewards - rewards.mean(dim=1, keepdim=True)
    if not std_normalization:
        return centered
    return centered / (rewards.std(dim=1, keepdim=True) + eps)


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024, "Back to Basics").

    A_i = r_i - mean_{j != i} r_j = n / (n - 1) * (r_i - mean(r_group)).
    Groups of one sample get advantage 0.
    """
    _check_groups(rewards)
    n = rewards.shape[1]
    if n < 2:
        return torch.zeros_like(rewards)
    return (rewards - rewards.mean(dim=1, keepdim=True)) * (n / (n - 1))


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the entries where ``mask`` is 1 (unbiased variance, as verl's
    ``masked_whiten``); entries outside the mask are returned as 0."""
    mask = mask.to(values.dtype)
    count = mask.sum()
    mean = (values * mask).sum() / count.clamp(min=1)
    var = (((values - mean) * mask) ** 2).sum() / (count - 1).clamp(min=1)
    return (values - mean) * torch.rsqrt(var + eps) * mask


def reinforce_plus_plus_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Discounted return-to-go per token: G_t = sum_{l >= t} gamma^(l - t) r_l (masked).

    With the outcome reward at the last token and per-token KL penalties elsewhere this is
    REINFORCE++'s token return (Hu 2025, "REINFORCE++"; verl
    ``compute_reinforce_plus_plus_outcome_advantage``), which is then whitened over the batch.

    Args:
        token_rewards, mask: [B, T]; right-padded responses.
    """
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros(token_rewards.shape[0], dtype=token_rewards.dtype, device=token_rewards.device)
    m = mask.to(token_rewards.dtype)
    for t in range(token_rewards.shape[1] - 1, -1, -1):
        running = token_rewards[:, t] + gamma * running * m[:, t]
        returns[:, t] = running * m[:, t]
    return returns


def gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016), per token.

    delta_t = r_t + gamma * V_{t+1} - V_t (V after the last token is 0),
    A_t = sum_l (gamma * lam)^l delta_{t+l}, returns R_t = A_t + V_t. As verl's
    ``compute_gae_advantage_return`` (without the whitening, which callers apply).

    Args:
        token_rewards, values, mask: [B, T] right-padded responses (mask 1 on response tokens).
    Returns:
        (advantages [B, T], returns [B, T]), 0 outside the mask.
    """
    m = mask.to(values.dtype)
    B, T = values.shape
    adv = torch.zeros_like(values)
    last = torch.zeros(B, dtype=values.dtype, device=values.device)
    next_value = torch.zeros(B, dtype=values.dtype, device=values.device)
    for t in range(T - 1, -1, -1):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        last = delta + gamma * lam * last
        # outside the mask (padding after the response) nothing propagates
        last = last * m[:, t]
        adv[:, t] = last
        next_value = values[:, t] * m[:, t]
    returns = (adv + values) * m
    return adv, returns


# ---------------------------------------------------------------------------- registered estimators

@ADV_ESTIMATORS.register("grpo", group_based=True, reads=("grpo_std_normalization",))
def grpo_estimator(inputs: AdvantageInputs, algo: Any) -> tuple[torch.Tensor, None]:
    """GRPO (:func:`grpo_advantages`), optionally without the std (``algo.grpo_std_normalization``)."""
    return inputs.broadcast(grpo_advantages(inputs.outcome(), std_normalization=algo.grpo_std_normalization)), None


@ADV_ESTIMATORS.register("dr_grpo", group_based=True)
def dr_grpo_estimator(inputs: AdvantageInputs, algo: Any) -> tuple[torch.Tensor, None]:
    """Dr. GRPO: the group-mean baseline without std normalisation (Liu et al. 2025)."""
    return inputs.broadcast(grpo_advantages(inputs.outcome(), std_normalization=False)), None


@ADV_ESTIMATORS.register("rloo", group_based=True)
def rloo_estimator(inputs: AdvantageInputs, algo: Any) -> tuple[torch.Tensor, None]:
    """RLOO (:func:`rloo_advantages`)."""
    return inputs.broadcast(rloo_advantages(inputs.outcome())), None


@ADV_ESTIMATORS.register("reinforce_plus_plus", reads=("gamma",))
def reinforce_plus_plus_estimator(inputs: AdvantageInputs, algo: Any) -> tuple[torch.Tensor, None]:
    """REINFORCE++: discounted token returns whitened over the batch (Hu 2025)."""
    returns = reinforce_plus_plus_returns(inputs.token_rewards(inputs.rewards), inputs.mask, algo.gamma)
    return masked_whiten(returns, inputs.mask * inputs.loss_mask), None


@ADV_ESTIMATORS.register("reinforce_plus_plus_baseline", reads=("gamma",))
def reinforce_plus_plus_baseline_estimator(inputs: AdvantageInputs, algo: Any) -> tuple[torch.Tensor, None]:
    """REINFORCE++ with the group-mean reward subtracted first (verl's ``reinforce_plus_plus_baseline``)."""
    centered = inputs.rewards - inputs.rewards.mean(dim=1, keepdim=True)
    returns = reinforce_plus_plus_returns(inputs.token_rewards(centered), inputs.mask, algo.gamma)
    return masked_whiten(returns, inputs.mask * inputs.loss_mask), None


@ADV_ESTIMATORS.register("gae", needs_critic=True, reads=("gamma", "lambd"))
def gae_estimator(inputs: AdvantageInputs, algo: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's GAE (:func:`gae_advantages`), advantages whitened over the batch.

    Raises:
        ValueError: ``inputs.values`` is None.
    """
    if inputs.values is None:
        raise ValueError("advantage_estimator=gae needs the critic's values")
    adv, returns = gae_advantages(inputs.token_rewards(inputs.rewards), inputs.values, inputs.mask, algo.gamma,
                                  algo.lambd)
    return masked_whiten(adv, inputs.mask * inputs.loss_mask), returns
