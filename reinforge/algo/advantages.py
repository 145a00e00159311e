"""Advantage estimators for outcome rewards (one scalar reward per sample)."""

from __future__ import annotations

import torch


def grpo_advantages(rewards: torch.Tensor, std_normalization: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Group-relative advantages (GRPO, Shao et al. 2024, "DeepSeekMath", eq. in sec. 4.1.2).

    A_i = (r_i - mean(r_group)) / (std(r_group) + eps), or r_i - mean(r_group) without
    std normalisation (Dr. GRPO, Liu et al. 2025). The std is the unbiased sample std, as
    in verl's ``compute_grpo_outcome_advantage`` (``torch.std``); a group of one sample
    gets advantage 0.

    Args:
        rewards: [num_groups, n_samples_per_prompt] float.
    Returns:
        advantages of the same shape and dtype.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [num_groups, n_samples_per_prompt], got shape {tuple(rewards.shape)}")
    n = rewards.shape[1]
    if n < 2:
        return torch.zeros_like(rewards)
    centered = rewards - rewards.mean(dim=1, keepdim=True)
    if not std_normalization:
        return centered
    return centered / (rewards.std(dim=1, keepdim=True) + eps)
