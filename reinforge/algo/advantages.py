"""Advantage estimators: pure tensor functions, and the registry the config chooses from.

Outcome estimators (GRPO, Dr. GRPO, RLOO, REINFORCE++-baseline) turn one scalar reward per
sample into one advantage per sample (broadcast to its tokens); token-level estimators
(REINFORCE++, GAE) turn per-token rewards (the outcome at the last token, minus any KL penalty) and, for GAE, a
critic's values into per-token advantages and returns. Tokens with loss mask 0 inside a
response (tool outputs of a multi-turn rollout) are not the policy's actions: the token-level
estimators step over them, and a KL penalty in the reward counts only the loss-mask tokens (verl's
``apply_kl_penalty`` multiplies the KL by its ``response_mask``, 0 on tool outputs). Groups whose
outcomes are all exactly equal get advantage exactly 0 (decided by comparing the values, before any
division).

Every registered estimator has the signature ``fn(inputs: AdvantageInputs, algo) ->
(advantages [N, T], returns [N, T] | None)`` where ``algo`` is the ``algo`` config section.
Adding one (docs/design.md has a worked example)::

    @ADV_ESTIMATORS.register("my_estimator", group_based=True, reads=("gamma",))
    def my_estimator(inputs, algo):
        ...

Registration properties: ``group_based`` (needs ``n_samples_per_prompt >= 2``),
``needs_critic`` (a value model is trained and its values are passed in ``inputs.values``),
``reads`` (the ``algo.*`` keys it uses; setting one with another estimator is refused),
``token_level`` (it reads per-token rewards, ``inputs.token_rewards``, and the discount
``inputs.discount``: multi-turn episodes may then place each turn's reward at its turn's last
token, ``agent.turn_reward: discounted``).

The rows an estimator receives are whole groups, but not always the whole batch: with several
data-parallel trainer ranks each rank runs it on the groups it holds. Group statistics need
nothing more; a statistic over the batch (REINFORCE++'s and GAE's whitening) sums through
``inputs.batch_sum`` (:func:`masked_whiten` does), which is None when the rows are the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .masking import masked_select
from .registries import ADV_ESTIMATORS as ADV_ESTIMATORS  # the registry, read by the config without torch

Estimator = Callable[["AdvantageInputs", Any], "tuple[torch.Tensor, torch.Tensor | None]"]
BatchSum = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class AdvantageInputs:
    """What every estimator receives, for N = G * n samples flattened group-major.

    Attributes:
        rewards: [G, n] float32 scalar rewards after shaping (over-long penalty, clip, normalisation).
        mask: [N, T] float32, 1 on response tokens (right-padded to the longest response T).
        loss_mask: [N, T] float32, additionally 0 on tokens excluded from the loss.
        token_kl: [N, T] float32 ``kl_coef * KL`` per token (KL in the reward), or None. Only the
            tokens where ``mask`` and ``loss_mask`` are both 1 count (tool outputs and padding are
            selected out, whatever they hold), as verl's ``apply_kl_penalty``
            (``kld * response_mask``, its response mask being 0 on tool outputs).
        values: [N, T] float32 critic values, or None (estimators registered ``needs_critic`` get them).
        valid: [G, n] bool, False for samples left out of their group's statistics (an episode that
            failed for infrastructure reasons: their loss mask is all 0 and their advantage 0), or
            None (all valid). Group statistics are then those of the group's valid samples: a
            group of k valid samples is treated as a group of k.
        turn_rewards: [N, T] float32, each turn's reward of a multi-turn episode at the last token of
            that turn's model output (:func:`place_turn_rewards`), or None: the rewards hold the
            turns' sum (``agent.turn_reward: sum``). Token-level estimators only; the outcome at the
            last token is then the reward minus these (the rest: the final reward, any shaping).
        turn_discount: [N, T] float32, the per-turn discount (``agent.turn_discount``) at those last
            tokens, 1 elsewhere, or None (:meth:`discount`).
        batch_sum: None when the N rows are the whole batch. When they are one data-parallel rank's
            share of it (whole groups: ``TrainWorker.score``), a function summing a tensor over the
            ranks (a collective: every rank's estimator calls it in the same order); a statistic
            over the batch (:func:`masked_whiten`) goes through it, so each rank's rows get the
            advantages they would get in the whole batch.
    """

    rewards: torch.Tensor
    mask: torch.Tensor
    loss_mask: torch.Tensor
    token_kl: torch.Tensor | None = None
    values: torch.Tensor | None = None
    valid: torch.Tensor | None = None
    turn_rewards: torch.Tensor | None = None
    turn_discount: torch.Tensor | None = None
    batch_sum: BatchSum | None = None

    def discount(self, gamma: float) -> float | torch.Tensor:
        """The discount from each token to the next policy token: ``gamma``, times the per-turn
        discount at the turns' last tokens when ``turn_discount`` is set ([N, T] then)."""
        return gamma if self.turn_discount is None else gamma * self.turn_discount

    def reward_kl(self) -> torch.Tensor | None:
        """[N, T] ``token_kl`` on the policy's tokens (``mask`` and ``loss_mask`` 1), 0 elsewhere; None
        without KL in the reward."""
        if self.token_kl is None:
            return None
        return masked_select(self.token_kl, (self.mask != 0) & (self.loss_mask != 0))

    def outcome(self) -> torch.Tensor:
        """[G, n] rewards minus each sequence's KL penalty summed over its loss-mask tokens (outcome
        estimators; verl's outcome estimators sum ``token_level_rewards`` likewise)."""
        kl = self.reward_kl()
        if kl is None:
            return self.rewards
        return self.rewards - kl.sum(-1).view_as(self.rewards)

    def token_rewards(self, outcome: torch.Tensor) -> torch.Tensor:
        """[N, T]: ``outcome`` ([G, n] or [N]) at each response's last token, minus the KL penalty on
        the loss-mask tokens (verl's ``token_level_rewards``). With ``turn_rewards`` each turn's
        reward sits at its turn's last token and the last token gets the outcome minus their sum,
        so a row still sums to the outcome (minus the KL)."""
        lengths = self.mask.sum(-1).long()
        out = torch.zeros_like(self.mask)
        rows = torch.nonzero(lengths > 0).flatten()
        final = outcome.flatten().to(out.dtype)
        if self.turn_rewards is not None:  # the turns' rewards at their own tokens, the rest at the last
            final = final - self.turn_rewards.sum(-1)
            out = out + masked_select(self.turn_rewards, self.mask != 0)
        out[rows, lengths[rows] - 1] += final[rows]
        kl = self.reward_kl()
        return out if kl is None else out - kl

    def broadcast(self, per_sample: torch.Tensor) -> torch.Tensor:
        """[G, n] or [N] per-sample values -> [N, T] on the response tokens."""
        return per_sample.flatten()[:, None].to(self.mask.dtype) * self.mask


def _check_groups(rewards: torch.Tensor) -> None:
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [num_groups, n_samples_per_prompt], got shape {tuple(rewards.shape)}")


def group_centered(rewards: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """r_i - mean(r_group) per group, exactly 0 in a group whose values are all equal.

    Equality is decided on the values themselves (max == min), not on the rounded difference:
    the fp32 mean of three equal non-dyadic values (0.1, 0.1, 0.1) can differ from them by an
    ulp, which the std normalisation of GRPO (dividing by a std of the same order plus 1e-6)
    would turn into advantages of order 1. Such a group gets exactly 0, so the trainer skips
    its samples (no policy gradient) as it does for any all-equal group.

    Args:
        rewards: [num_groups, n] float.
        valid: [num_groups, n] bool or None: the mean, the equality test and the result use the
            valid entries only (0 at the others).
    Returns:
        [num_groups, n], same dtype.
    """
    v, centered = _masked_centered(rewards, valid)
    inf = torch.full_like(rewards, float("inf"))
    equal = torch.where(v, rewards, -inf).amax(dim=1, keepdim=True) == torch.where(v, rewards, inf).amin(
        dim=1, keepdim=True
    )
    return torch.where(equal, torch.zeros_like(centered), centered)


def _masked_centered(rewards: torch.Tensor, valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(valid [G, n] bool, r_i - mean of the group's valid r, 0 at invalid entries)."""
    v = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid.bool()
    count = v.sum(dim=1, keepdim=True).clamp(min=1).to(rewards.dtype)
    mean = torch.where(v, rewards, torch.zeros_like(rewards)).sum(dim=1, keepdim=True) / count
    return v, torch.where(v, rewards - mean, torch.zeros_like(rewards))


def _valid_counts(rewards: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """[num_groups, 1] number of valid samples per group (``n`` everywhere when ``valid`` is None)."""
    if valid is None:
        return torch.full((rewards.shape[0], 1), rewards.shape[1], dtype=rewards.dtype)
    return valid.bool().sum(dim=1, keepdim=True).to(rewards.dtype)


def grpo_advantages(
    rewards: torch.Tensor, std_normalization: bool = True, eps: float = 1e-6, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """Group-relative advantages (GRPO, Shao et al. 2024, "DeepSeekMath", sec. 4.1.2).

    A_i = (r_i - mean(r_group)) / (std(r_group) + eps), or r_i - mean(r_group) without
    std normalisation (Dr. GRPO, Liu et al. 2025, "Understanding R1-Zero-Like Training").
    The std is the unbiased sample std, as in verl's ``compute_grpo_outcome_advantage``;
    a group of one sample gets advantage 0, and so does a group whose rewards are all exactly
    equal (:func:`group_centered`: decided before dividing, so fp32 rounding of the mean is
    not amplified by the std normalisation).

    Args:
        rewards: [num_groups, n_samples_per_prompt] float.
        valid: [num_groups, n_samples_per_prompt] bool or None: statistics over the valid
            samples only (a group of k valid samples is a group of k); 0 at the others.
    Returns:
        advantages of the same shape and dtype.
    """
    _check_groups(rewards)
    k = _valid_counts(rewards, valid)
    centered = torch.where(k >= 2, group_centered(rewards, valid), torch.zeros_like(rewards))
    if not std_normalization:
        return centered
    _, raw = _masked_centered(rewards, valid)
    std = ((raw**2).sum(dim=1, keepdim=True) / (k - 1).clamp(min=1)).sqrt()
    return centered / (std + eps)


def rloo_advantages(rewards: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024, "Back to Basics").

    A_i = r_i - mean_{j != i} r_j = k / (k - 1) * (r_i - mean(r_group)), k the group's (valid)
    samples. Groups of one sample, and groups whose rewards are all exactly equal
    (:func:`group_centered`), get advantage 0.

    Args:
        rewards: [num_groups, n] float.
        valid: [num_groups, n] bool or None, as in :func:`grpo_advantages`.
    """
    _check_groups(rewards)
    k = _valid_counts(rewards, valid)
    factor = torch.where(k >= 2, k / (k - 1).clamp(min=1), torch.zeros_like(k))
    return group_centered(rewards, valid) * factor


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8, batch_sum: BatchSum | None = None
) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over the entries where ``mask`` is 1 (unbiased variance,
    as verl's ``masked_whiten``); entries outside the mask are returned as 0 whatever they hold.

    Args:
        values, mask: same shape; ``mask`` 0/1.
        batch_sum: the rows are one rank's share of the batch: sums the count, the sum and the
            squared deviations over the ranks (:attr:`AdvantageInputs.batch_sum`), so the mean and
            variance are the whole batch's (two collectives). None: these rows are the batch.
    """
    total = batch_sum if batch_sum is not None else (lambda t: t)
    count = total((mask != 0).sum().to(values.dtype))
    mean = total(masked_select(values, mask).sum()) / count.clamp(min=1)
    centred = masked_select(values - mean, mask)
    var = total((centred**2).sum()) / (count - 1).clamp(min=1)
    return centred * torch.rsqrt(var + eps)


def _at(gamma: float | torch.Tensor, t: int) -> float | torch.Tensor:
    """The discount at column ``t``: a float, or the column of a [B, T] tensor."""
    return gamma[:, t] if isinstance(gamma, torch.Tensor) else gamma


def place_turn_rewards(
    turn_rewards: list[list[float | None]], turn_ends: list[list[int]], lengths: list[int], width: int
) -> torch.Tensor:
    """[N, width] float32: each turn's reward at the response position where that turn's model
    output ends (``turn_ends``, 0-based in the response), 0 elsewhere. Row i takes
    ``turn_rewards[i][k]`` at ``turn_ends[i][k]``; a turn without a reward (None) adds nothing; a
    row may list more ends than rewards (a last turn that was not stepped); an empty response
    (``lengths[i]`` 0) gets nothing.

    Raises:
        ValueError: a reward without an end, or an end outside the row's ``lengths[i]`` tokens.
    """
    out = torch.zeros(len(turn_rewards), width)
    for i, (rewards, ends, n) in enumerate(zip(turn_rewards, turn_ends, lengths, strict=True)):
        if len(rewards) > len(ends):
            raise ValueError(f"sample {i}: {len(rewards)} turn rewards but {len(ends)} turn ends")
        for r, end in zip(rewards, ends):
            if r is None or n == 0:
                continue
            if not 0 <= end < n:
                raise ValueError(f"sample {i}: a turn ends at {end}, outside its {n} response tokens")
            out[i, end] += float(r)
    return out


def turn_discounts(turn_ends: list[list[int]], width: int, discount: float) -> torch.Tensor:
    """[N, width] float32: ``discount`` at every turn's last token but a row's last turn, 1
    elsewhere: the factor between a turn's last policy token and the next turn's first, so a reward
    k turns later counts ``discount**k`` (times the per-token ``gamma``)."""
    out = torch.ones(len(turn_ends), width)
    for i, ends in enumerate(turn_ends):
        for end in ends[:-1]:
            if 0 <= end < width:
                out[i, end] = discount
    return out


def _policy_steps(mask: torch.Tensor, loss_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(response [B, T] bool, policy step [B, T] bool): the policy's steps are the response tokens
    with loss mask 1; the others inside a response (tool outputs) are environment tokens."""
    response = mask != 0
    steps = response if loss_mask is None else response & (loss_mask != 0)
    return response, steps


def reinforce_plus_plus_returns(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    gamma: float | torch.Tensor = 1.0,
    loss_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Discounted return-to-go per token, G_t = r_t + gamma * G_{t+1} over the policy's tokens.

    With the outcome reward at the last token and per-token KL penalties elsewhere this is
    REINFORCE++'s token return (Hu 2025, "REINFORCE++", sec. 3; verl
    ``compute_reinforce_plus_plus_outcome_advantage``), which is then whitened over the batch.

    Tokens with ``mask`` 1 but ``loss_mask`` 0 (tool outputs inside a multi-turn response) are
    not time steps: the return passes over them undiscounted (as verl since 0.9.0, PR #7300,
    "carry running_return through observation spans"; verl 0.8 and older restarted the return
    there, so earlier turns never saw the outcome) and their rewards, if any, are added to the
    preceding policy token's (verl drops them; the KL penalty is 0 there in both, so they differ
    only when a response ends in a tool's output, where the outcome reward sits).

    Args:
        token_rewards, mask: [B, T] float; right-padded responses, ``mask`` 1 on response tokens.
        gamma: discount per policy token; or [B, T], the discount from each policy token to the next
            (a per-turn discount at the turns' last tokens: :meth:`AdvantageInputs.discount`).
        loss_mask: [B, T] 0/1, or None (every response token is a policy token).
    Returns:
        [B, T] returns, 0 on padding and on non-policy tokens.
    """
    response, steps = _policy_steps(mask, loss_mask)
    zero = torch.zeros(token_rewards.shape[0], dtype=token_rewards.dtype, device=token_rewards.device)
    returns = torch.zeros_like(token_rewards)
    running, pending = zero, zero
    for t in range(token_rewards.shape[1] - 1, -1, -1):
        r = masked_select(token_rewards[:, t], response[:, t])
        stepped = r + pending + _at(gamma, t) * running
        running = torch.where(steps[:, t], stepped, torch.where(response[:, t], running, zero))
        pending = torch.where(steps[:, t] | ~response[:, t], zero, pending + r)
        returns[:, t] = torch.where(steps[:, t], running, zero)
    return returns


def gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float | torch.Tensor = 1.0,
    lam: float = 0.95,
    loss_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016, eq. 16), per policy token.

    delta_t = r_t + gamma * V_{t'} - V_t, A_t = delta_t + gamma * lam * A_{t'}, where t' is the
    next policy token (V and A after the last one are 0); returns R_t = A_t + V_t. As verl's
    ``compute_gae_advantage_return`` (without the whitening, which callers apply).

    Tokens with ``mask`` 1 but ``loss_mask`` 0 (tool outputs inside a multi-turn response) are
    skipped as verl skips its masked "observation tokens": the next value and the running
    advantage are carried across them, so the critic's values there (never fitted) do not enter
    any advantage. Their rewards, if any, are added to the preceding policy token's (verl drops
    them; with the outcome reward on a policy token both agree).

    Args:
        token_rewards, values, mask: [B, T] float; right-padded responses, ``mask`` 1 on response tokens.
        gamma, lam: discount and GAE lambda, per policy token; ``gamma`` may be [B, T], the discount
            from each policy token to the next (as in :func:`reinforce_plus_plus_returns`).
        loss_mask: [B, T] 0/1, or None (every response token is a policy token).
    Returns:
        (advantages [B, T], returns [B, T]), 0 on padding and on non-policy tokens.
    """
    response, steps = _policy_steps(mask, loss_mask)
    zero = torch.zeros(values.shape[0], dtype=values.dtype, device=values.device)
    adv = torch.zeros_like(values)
    last, next_value, pending = zero, zero, zero
    for t in range(values.shape[1] - 1, -1, -1):
        r = masked_select(token_rewards[:, t], response[:, t])
        v = masked_select(values[:, t], steps[:, t])
        g = _at(gamma, t)
        delta = r + pending + g * next_value - v
        stepped = delta + g * lam * last
        keep = torch.where(response[:, t], last, zero)  # carried over a tool token, reset on padding
        last = torch.where(steps[:, t], stepped, keep)
        next_value = torch.where(steps[:, t], v, torch.where(response[:, t], next_value, zero))
        pending = torch.where(steps[:, t] | ~response[:, t], zero, pending + r)
        adv[:, t] = torch.where(steps[:, t], last, zero)
    returns = masked_select(adv + masked_select(values, steps), steps)
    return adv, returns


# ---------------------------------------------------------------------------- registered estimators
# (registered by name in .estimators, which the config reads without importing torch)


def grpo_estimator(inputs: AdvantageInputs, algo: Any) -> tuple[torch.Tensor, None]:
    """GRPO (:func:`grpo_advantages`), optionally without the std (``algo.grpo_std_normalization``)."""
    return inputs.broadcast(grpo_advantages(inputs.outcome(), algo.grpo_std_normalization, valid=inputs.valid)), None


def dr_grpo_estimator(inputs: AdvantageInputs, algo: Any) -> tuple[torch.Tensor, None]:
    """Dr. GRPO: the group-mean baseline without std normalisation (Liu et al. 2025)."""
    return inputs.broadcast(grpo_advantages(inputs.outcome(), std_normalization=False, valid=inputs.valid)), None


def rloo_estimator(inputs: AdvantageInputs, algo: Any) -> tuple[torch.Tensor, None]:
    """RLOO (:func:`rloo_advantages`)."""
    return inputs.broadcast(rloo_advantages(inputs.outcome(), inputs.valid)), None


def reinforce_plus_plus_estimator(inputs: AdvantageInputs, algo: Any) -> tuple[torch.Tensor, None]:
    """REINFORCE++: discounted token returns (:func:`reinforce_plus_plus_returns`) whitened over
    the batch's loss tokens (Hu 2025)."""
    returns = reinforce_plus_plus_returns(
        inputs.token_rewards(inputs.rewards), inputs.mask, inputs.discount(algo.gamma), inputs.loss_mask
    )
    return masked_whiten(returns, inputs.mask * inputs.loss_mask, batch_sum=inputs.batch_sum), None


def reinforce_plus_plus_baseline_advantages(outcome: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """REINFORCE++ with a group baseline, per sample, before whitening (Hu 2025, "REINFORCE++",
    the "baseline" variant for many samples per prompt; verl
    ``compute_reinforce_plus_plus_baseline_outcome_advantage``).

    A_i = s_i - mean(s_group), s_i the sample's outcome (reward minus its summed KL penalty, if
    KL is in the reward); a group of one sample keeps s_i (no baseline), as verl; a group whose
    outcomes are all exactly equal gets exactly 0 (:func:`group_centered`: otherwise the batch
    whitening would scale the mean's rounding error up to order 1). No discount: the same value
    goes to every token of the sample, and the caller whitens over the batch.

    Args:
        outcome: [num_groups, n_samples_per_prompt] float.
        valid: [num_groups, n_samples_per_prompt] bool or None, as in :func:`grpo_advantages`.
    Returns:
        [num_groups, n_samples_per_prompt] group-centred outcomes.
    """
    _check_groups(outcome)
    k = _valid_counts(outcome, valid)
    alone = torch.where(valid.bool(), outcome, torch.zeros_like(outcome)) if valid is not None else outcome
    return torch.where(k >= 2, group_centered(outcome, valid), alone)


def reinforce_plus_plus_baseline_estimator(inputs: AdvantageInputs, algo: Any) -> tuple[torch.Tensor, None]:
    """REINFORCE++-baseline (:func:`reinforce_plus_plus_baseline_advantages`) on every response
    token, whitened over the batch's loss tokens, as verl's ``reinforce_plus_plus_baseline``.
    It reads no ``algo.gamma`` (verl's ignores it; setting it is refused)."""
    per_sample = inputs.broadcast(reinforce_plus_plus_baseline_advantages(inputs.outcome(), inputs.valid))
    return masked_whiten(per_sample, inputs.mask * inputs.loss_mask, batch_sum=inputs.batch_sum), None


def gae_estimator(inputs: AdvantageInputs, algo: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's GAE (:func:`gae_advantages`) over the policy's tokens (tool outputs skipped),
    advantages whitened over the batch's loss tokens.

    Raises:
        ValueError: ``inputs.values`` is None.
    """
    if inputs.values is None:
        raise ValueError("advantage_estimator=gae needs the critic's values")
    adv, returns = gae_advantages(
        inputs.token_rewards(inputs.rewards),
        inputs.values,
        inputs.mask,
        inputs.discount(algo.gamma),
        algo.lambd,
        inputs.loss_mask,
    )
    return masked_whiten(adv, inputs.mask * inputs.loss_mask, batch_sum=inputs.batch_sum), returns
