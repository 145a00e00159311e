"""Distillation: pure tensor functions for on-policy distillation (OPD) and generalized knowledge distillation (GKD).

On-policy distillation (Agarwal et al. 2024, "On-Policy Distillation of Language Models: Learning from
Self-Generated Mistakes"; Qwen3 technical report; Thinking Machines, "On-Policy Distillation", 2025):
the student samples, a teacher scores the student's own tokens, and each token's reward is the negative
per-token reverse KL estimate ``log p_teacher(x_t) - log p_student(x_t)``. With discount 0 (the default,
as Tinker's recipe) that reward is the token's advantage; with a discount ``gamma`` > 0 the advantage is
its discounted return-to-go over the student's own tokens (tool outputs of an agent episode are stepped
over, as REINFORCE++'s returns do: :func:`~reinforge.algo.advantages.reinforce_plus_plus_returns`).

GKD's generalized Jensen-Shannon divergence (Agarwal et al. 2024, eq. 5; TRL's
``GKDTrainer.generalized_jsd_loss``): ``beta`` 0 is the forward KL ``KL(teacher || student)``, ``beta`` 1
the reverse KL ``KL(student || teacher)``, in between ``beta KL(teacher || M) + (1 - beta) KL(student || M)``
with the mixture ``M = beta teacher + (1 - beta) student``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .advantages import reinforce_plus_plus_returns


def reverse_kl_rewards(
    teacher_log_probs: torch.Tensor, student_log_probs: torch.Tensor, mask: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    """[N, T] per-token rewards ``log p_teacher - log p_student`` on the student's own tokens (``mask`` and
    ``loss_mask`` both 1), 0 elsewhere (padding, tool outputs): the negative of the k1 estimate of the
    reverse KL ``KL(student || teacher)`` at each sampled token.

    Args:
        teacher_log_probs, student_log_probs: [N, T] float, right-padded log-probs of the sampled tokens.
        mask: [N, T], 1 on response tokens; loss_mask: [N, T], 0 on tokens not trained (tool outputs).
    """
    keep = (mask != 0) & (loss_mask != 0)
    diff = (teacher_log_probs - student_log_probs).to(torch.float32)
    return torch.where(keep, diff, torch.zeros_like(diff))


def distill_advantages(
    teacher_log_probs: torch.Tensor,
    student_log_probs: torch.Tensor,
    mask: torch.Tensor,
    loss_mask: torch.Tensor,
    discount: float = 0.0,
) -> torch.Tensor:
    """[N, T] OPD advantages: the :func:`reverse_kl_rewards` themselves with ``discount`` 0, else their
    discounted return-to-go over the student's tokens (tool outputs passed over). 0 on padding and on
    tokens with loss mask 0."""
    rewards = reverse_kl_rewards(teacher_log_probs, student_log_probs, mask, loss_mask)
    if discount == 0:
        return rewards
    return reinforce_plus_plus_returns(rewards, mask.float(), discount, loss_mask.float())


def generalized_jsd(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float = 0.5, temperature: float = 1.0
) -> torch.Tensor:
    """Per-position generalized JSD between the teacher's and the student's next-token distributions.

    Args:
        student_logits, teacher_logits: [..., V] logits over the same vocabulary (the teacher's may have
            more padded columns: they are cut to the student's V by the caller).
        beta: 0 the forward KL ``KL(teacher || student)``, 1 the reverse KL ``KL(student || teacher)``,
            in between the generalized JSD (TRL ``GKDConfig.beta``).
        temperature: both distributions are softened by it (TRL ``GKDConfig.temperature``).
    Returns:
        [...] float32 divergence per position (>= 0).
    Raises:
        ValueError: ``beta`` outside [0, 1] or the vocabularies differ.
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"generalized_jsd: beta must be in [0, 1], got {beta}")
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"generalized_jsd: student logits {tuple(student_logits.shape)} and teacher logits "
            f"{tuple(teacher_logits.shape)} differ (the same tokens over the same vocabulary are needed)"
        )
    s = F.log_softmax(student_logits.float() / temperature, dim=-1)
    t = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    if beta == 0:
        return _kl(t, s)
    if beta == 1:
        return _kl(s, t)
    m = torch.logsumexp(torch.stack([s + math.log(1 - beta), t + math.log(beta)]), dim=0)
    return beta * _kl(t, m) + (1 - beta) * _kl(s, m)


def _kl(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:
    """KL(p || q) over the last dimension, from log-probabilities (0 log 0 = 0)."""
    p = p_log.exp()
    return torch.where(p > 0, p * (p_log - q_log), torch.zeros_like(p)).sum(-1)


def masked_token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over the positions where ``mask`` is nonzero (0 when none): TRL's
    ``batchmean`` over the completion tokens of GKD."""
    m = mask.to(values.dtype)
    return (values * m).sum() / m.sum().clamp(min=1.0)
