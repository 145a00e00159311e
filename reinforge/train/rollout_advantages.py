"""A rollout's advantages: from scored groups of samples to per-token advantages (and returns).

Reward shaping (DAPO's over-long punishment, clipping, normalisation), the over-long filter,
the KL penalty in the reward, then the estimator registered under ``algo.advantage_estimator``
(:data:`reinforge.algo.advantages.ADV_ESTIMATORS`), applied to the samples laid out on a
right-padded [N, T] grid.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algo.advantages import ADV_ESTIMATORS, AdvantageInputs, BatchSum, place_turn_rewards, turn_discounts
from ..algo.distill import distill_advantages
from ..algo.losses import kl_penalty
from ..config import AlgoConfig
from ..config.distill import DistillConfig
from ..records import Sample, Status
from ..utils.ragged import prefix_mask, right_padded, unpad_rows


def overlong_penalty(length: int, max_len: int, buffer: int, factor: float) -> float:
    """DAPO's soft over-long punishment (Yu et al. 2025, eq. 13): 0 up to ``max_len - buffer``
    tokens, then falling linearly to ``-factor`` at ``max_len``."""
    start = max_len - buffer
    if length <= start:
        return 0.0
    return -factor * min(length - start, buffer) / buffer


def shaped_rewards(a: AlgoConfig, groups: list[list[Sample]], max_response_len: int) -> torch.Tensor:
    """[num_groups, n] rewards after over-long punishment, clipping and normalisation
    (``max_response_len``: ``rollout.rollout_max_response_len``)."""
    rewards = torch.tensor([[float(s.reward) for s in g] for g in groups], dtype=torch.float32)
    valid = valid_samples(groups)
    if a.overlong_buffer_len:
        pen = [
            [
                overlong_penalty(s.response_length, max_response_len, a.overlong_buffer_len, a.overlong_penalty_factor)
                for s in g
            ]
            for g in groups
        ]
        rewards = rewards + torch.tensor(pen)
    if a.reward_clip is not None:
        rewards = rewards.clamp(-a.reward_clip, a.reward_clip)
    if a.normalize_rewards and int(valid.sum()) > 1:
        kept = rewards[valid]
        rewards = torch.where(valid, (rewards - kept.mean()) / (kept.std() + 1e-6), torch.zeros_like(rewards))
    return rewards


def valid_samples(groups: list[list[Sample]]) -> torch.Tensor:
    """[num_groups, n] bool: False for samples whose episode failed for infrastructure reasons
    (status ``failed``: a sandbox or environment failure, not the model's doing). They are left
    out of their group's statistics and of batch normalisations, and get advantage 0."""
    return torch.tensor([[s.status != Status.FAILED for s in g] for g in groups], dtype=torch.bool)


def apply_overlong_filter(a: AlgoConfig, samples: list[Sample]) -> int:
    """Zero the loss mask of truncated samples (``algo.overlong_filter``); returns how many."""
    if not a.overlong_filter:
        return 0
    n = 0
    for s in samples:
        if s.status == Status.TRUNCATED:
            s.loss_mask = [0] * s.response_length
            n += 1
    return n


@dataclass
class Advantages:
    advantages: list[torch.Tensor]  # per sample, per response token
    returns: list[torch.Tensor] | None = None  # estimators with a critic only
    rewards: torch.Tensor | None = None  # shaped [num_groups, n], of every group
    reverse_kl: tuple[float, float] | None = None  # distillation: (sum of log p_student - log p_teacher, tokens)


def compute_advantages(
    a: AlgoConfig,
    groups: list[list[Sample]],
    max_response_len: int,
    *,
    values: list[torch.Tensor] | None = None,
    old_log_probs: list[torch.Tensor] | None = None,
    ref_log_probs: list[torch.Tensor] | None = None,
    turn_discount: float | None = None,
    owned: list[int] | None = None,
    batch_sum: BatchSum | None = None,
    distill: DistillConfig | None = None,
    teacher_log_probs: list[torch.Tensor] | None = None,
    student_log_probs: list[torch.Tensor] | None = None,
) -> Advantages:
    """Advantages of every sample of ``groups`` (flattened group-major) for ``algo.advantage_estimator``.

    ``owned`` (a data-parallel rank's share, :class:`~reinforge.train.rollout_share.RolloutShare`):
    the indices of the groups this rank holds, whose samples ``values`` and the log-probs are given
    for (flattened group-major, in ``owned`` order); the advantages and returns are theirs. Rewards
    are still shaped over every group (their normalisation is the batch's) and the estimator's
    batch statistics are summed over the ranks by ``batch_sum``
    (:attr:`~reinforge.algo.advantages.AdvantageInputs.batch_sum`), so each sample gets the
    advantage it gets with ``owned`` None (all groups), up to float summation order.

    With ``algo.use_kl_in_reward`` each token's reward loses ``kl_coef * (log pi_old - log pi_ref)``
    (k1) on the tokens with loss mask 1 only: tool outputs (loss mask 0) carry no KL penalty, as in
    verl's ``apply_kl_penalty`` (``kld * response_mask``); outcome estimators use the sequence's
    total over those tokens (:meth:`~reinforge.algo.advantages.AdvantageInputs.reward_kl`).

    ``turn_discount`` None: a multi-turn sample's per-turn rewards count through its reward, their
    sum (``agent.turn_reward: sum``). A number (``agent.turn_reward: discounted``, token-level
    estimators only): each turn's reward sits at the last token of that turn's model output
    (:func:`turn_reward_grids`), the rest of the shaped reward (final reward, over-long penalty,
    clipping or normalisation) at the response's last token, and returns are discounted by it
    from one turn to the next.

    On-policy distillation (``distill`` enabled, ``teacher_log_probs`` and ``student_log_probs`` given, one
    [response_length] tensor per sample like ``values``): each token's advantage gains ``distill.kl_coef *``
    :func:`~reinforge.algo.distill.distill_advantages` (``log p_teacher - log p_student``, discounted by
    ``distill.discount``) on the tokens with loss mask 1 of the valid samples; with ``distill.use_task_reward``
    false it is the whole advantage. ``Advantages.reverse_kl`` then holds (sum, count) of
    ``log p_student - log p_teacher`` over those tokens.

    Raises:
        ValueError: an estimator that needs a critic without ``values``, KL in the reward without
            log-probs, ``turn_discount`` with an estimator that is not token-level, or distillation
            without both log-probs.
    """
    all_rewards = shaped_rewards(a, groups, max_response_len)
    rewards = all_rewards
    if owned is not None:
        groups = [groups[g] for g in owned]
        rewards = all_rewards[torch.tensor(owned, dtype=torch.long)]
    flat = [s for g in groups for s in g]
    lengths = [s.response_length for s in flat]
    token_kl = None
    if a.use_kl_in_reward:
        if old_log_probs is None or ref_log_probs is None:
            raise ValueError("algo.use_kl_in_reward needs the policy's and the reference's log-probs")
        token_kl = right_padded([a.kl_coef * kl_penalty(o, r, "k1") for o, r in zip(old_log_probs, ref_log_probs)])
    inputs = AdvantageInputs(
        rewards=rewards,
        mask=prefix_mask(lengths).float(),
        loss_mask=right_padded([s.loss_mask for s in flat]),
        token_kl=token_kl,
        values=right_padded(values) if values is not None else None,
        batch_sum=batch_sum,
    )
    if turn_discount is not None:
        if not ADV_ESTIMATORS.info(a.advantage_estimator).get("token_level"):
            raise ValueError(f"per-turn rewards need a token-level estimator, not {a.advantage_estimator}")
        inputs.turn_rewards, inputs.turn_discount = turn_reward_grids(flat, turn_discount, inputs.mask.shape[1])
    valid = valid_samples(groups)
    if not bool(valid.all()):
        inputs.valid = valid
        inputs.loss_mask = inputs.loss_mask * valid.flatten()[:, None].to(inputs.loss_mask.dtype)
    adv, returns = ADV_ESTIMATORS.get(a.advantage_estimator)(inputs, a)
    reverse_kl = None
    if distill is not None and distill.enabled:
        if teacher_log_probs is None or student_log_probs is None:
            raise ValueError("distill: the teacher's and the student's log-probs are needed for the advantages")
        width = inputs.mask.shape[1]
        teacher, student = _grid(teacher_log_probs, width), _grid(student_log_probs, width)
        opd = distill_advantages(teacher, student, inputs.mask, inputs.loss_mask, distill.discount)
        adv = (adv if distill.use_task_reward else torch.zeros_like(adv)) + distill.kl_coef * opd
        policy = (inputs.mask != 0) & (inputs.loss_mask != 0)
        reverse_kl = (float((student - teacher)[policy].sum()), float(policy.sum()))
    return Advantages(
        unpad_rows(adv, lengths), unpad_rows(returns, lengths) if returns is not None else None, all_rewards, reverse_kl
    )


def _grid(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    """[N, width] float32, right-padded with 0 (``right_padded`` to exactly ``width`` columns)."""
    out = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        r = torch.as_tensor(r, dtype=torch.float32).flatten()[:width]
        out[i, : r.numel()] = r
    return out


TURN_REWARDS = "turn_rewards"
"""``sample.metadata`` key: the reward of each stepped turn of an agent episode (None: none)."""
TURN_ENDS = "turn_ends"
"""``sample.metadata`` key: for each model turn, the response position (0-based) of its last token."""


def turn_reward_grids(samples: list[Sample], discount: float, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([N, width] turn rewards at their turns' last tokens, [N, width] per-turn discounts) of
    ``samples`` from their ``metadata`` (:data:`TURN_REWARDS`, :data:`TURN_ENDS`, written by the
    agent loop); a sample without them (one turn, not an agent sample) or a failed one gets none.

    Raises:
        ValueError: a sample's turn positions do not fit its response (the message names its index).
    """
    rewards, ends = [], []
    for s in samples:
        keep = s.status != Status.FAILED
        rewards.append(list(s.metadata.get(TURN_REWARDS) or []) if keep else [])
        ends.append([int(e) for e in s.metadata.get(TURN_ENDS) or []] if keep else [])
    lengths = [s.response_length for s in samples]
    return place_turn_rewards(rewards, ends, lengths, width), turn_discounts(ends, width, discount)
