"""Advantage estimators.

Outcome estimators (GRPO, Dr. GRPO, RLOO, REINFORCE++) turn one scalar reward per sample
into one advantage per sample (broadcast to its tokens); GAE turns per-token rewards and a
critic's values into per-token advantages and returns. All are pure tensor functions.
"""

from __future__ import annotations

import torch


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
