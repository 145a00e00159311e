"""From scored groups to per-token advantages: reward shaping, then the configured estimator."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algo.advantages import (gae_advantages, grpo_advantages, masked_whiten, reinforce_plus_plus_returns,
                               rloo_advantages)
from ..algo.losses import kl_penalty
from ..config import Config
from ..rollout.types import Sample, Status


def overlong_penalty(length: int, max_len: int, buffer: int, factor: float) -> float:
    """DAPO's soft over-long punishment (Yu et al. 2025, eq. 13): 0 up to ``max_len - buffer``
    tokens, then falling linearly to ``-factor`` at ``max_len``."""
    start = max_len - buffer
    if length <= start:
        return 0.0
    return -factor * min(length - start, buffer) / buffer


def shaped_rewards(cfg: Config, groups: list[list[Sample]]) -> torch.Tensor:
    """[num_groups, n] rewards after over-long punishment, clipping and normalisation."""
    a, r = cfg.algo, cfg.rollout
    rewards = torch.tensor([[float(s.reward) for s in g] for g in groups], dtype=torch.float32)
    if a.overlong_buffer_len:
        pen = [[overlong_penalty(s.response_length, r.rollout_max_response_len, a.overlong_buffer_len,
                                 a.overlong_penalty_factor) for s in g] for g in groups]
        rewards = rewards + torch.tensor(pen)
    if a.reward_clip is not None:
        rewards = rewards.clamp(-a.reward_clip, a.reward_clip)
    if a.normalize_rewards and rewards.numel() > 1:
        rewards = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
    return rewards


def apply_overlong_filter(cfg: Config, samples: list[Sample]) -> int:
    """Zero the loss mask of truncated samples (``algo.overlong_filter``); returns how many."""
    if not cfg.algo.overlong_filter:
        return 0
    n = 0
    for s in samples:
        if s.status == Status.TRUNCATED:
            s.loss_mask = [0] * s.response_length
            n += 1
    return n


def _grid(vectors: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample vectors -> right-padded [N, Rmax] grid and its 0/1 mask."""
    width = max((len(v) for v in vectors), default=0)
    grid = torch.zeros(len(vectors), max(width, 1))
    mask = torch.zeros_like(grid)
    for i, v in enumerate(vectors):
        grid[i, :len(v)] = v
        mask[i, :len(v)] = 1
    return grid, mask


def _rows(grid: torch.Tensor, lengths: list[int]) -> list[torch.Tensor]:
    return [grid[i, :n].clone() for i, n in enumerate(lengths)]


@dataclass
class Advantages:
    advantages: list[torch.Tensor]  # per sample, per response token
    returns: list[torch.Tensor] | None = None  # GAE only
    rewards: torch.Tensor | None = None  # shaped [num_groups, n]


def compute_advantages(cfg: Config, groups: list[list[Sample]], *, values: list[torch.Tensor] | None = None,
                       old_log_probs: list[torch.Tensor] | None = None,
                       ref_log_probs: list[torch.Tensor] | None = None) -> Advantages:
    """Advantages of every sample of ``groups`` (flattened group-major) for ``algo.advantage_estimator``.

    With ``algo.use_kl_in_reward`` each token's reward loses ``kl_coef * (log pi_old - log pi_ref)``
    (k1, as verl's ``apply_kl_penalty``); outcome estimators use the sequence's total.

    Raises:
        ValueError: ``gae`` without ``values``, or KL in the reward without log-probs.
    """
    a = cfg.algo
    flat = [s for g in groups for s in g]
    lengths = [s.response_length for s in flat]
    G, n = len(groups), len(groups[0])
    rewards = shaped_rewards(cfg, groups)
    kl_tok = None
    if a.use_kl_in_reward:
        if old_log_probs is None or ref_log_probs is None:
            raise ValueError("algo.use_kl_in_reward needs the policy's and the reference's log-probs")
        kl_tok = [a.kl_coef * kl_penalty(o, r, "k1") for o, r in zip(old_log_probs, ref_log_probs)]
    est = a.advantage_estimator
    if est in ("grpo", "dr_grpo", "rloo"):
        outcome = rewards.clone()
        if kl_tok is not None:
            outcome -= torch.tensor([float(k.sum()) for k in kl_tok]).view(G, n)
        if est == "rloo":
            adv = rloo_advantages(outcome)
        else:
            adv = grpo_advantages(outcome, std_normalization=est == "grpo" and a.grpo_std_normalization)
        flat_adv = adv.flatten()
        return Advantages([torch.full((L,), float(flat_adv[i])) for i, L in enumerate(lengths)], None, rewards)

    # token-level estimators: outcome reward at the last response token, KL penalty on every token
    outcome = rewards.flatten()
    if est == "reinforce_plus_plus_baseline":
        outcome = (rewards - rewards.mean(dim=1, keepdim=True)).flatten()
    token_rewards = [torch.zeros(L) for L in lengths]
    for i, L in enumerate(lengths):
        if L:
            token_rewards[i][L - 1] = outcome[i]
        if kl_tok is not None:
            token_rewards[i] = token_rewards[i] - kl_tok[i]
    tr, mask = _grid(token_rewards)
    loss_mask, _ = _grid([torch.tensor(s.loss_mask, dtype=torch.float32) for s in flat])
    if est in ("reinforce_plus_plus", "reinforce_plus_plus_baseline"):
        returns = reinforce_plus_plus_returns(tr, mask, a.gamma)
        adv = masked_whiten(returns, mask * loss_mask)
        return Advantages(_rows(adv, lengths), None, rewards)
    if est == "gae":
        if values is None:
            raise ValueError("advantage_estimator=gae needs the critic's values")
        v, _ = _grid(values)
        adv, returns = gae_advantages(tr, v, mask, a.gamma, a.lambd)
        adv = masked_whiten(adv, mask * loss_mask)
        return Advantages(_rows(adv, lengths), _rows(returns, lengths), rewards)
    raise ValueError(f"unknown advantage_estimator {est!r}")
