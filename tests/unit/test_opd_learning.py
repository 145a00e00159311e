"""On-policy distillation learns: the reverse-KL advantage (:func:`reinforge.algo.distill.distill_advantages`)
through the trainer's policy objective (:func:`reinforge.algo.objective.policy_objective`, the PPO clip at ratio 1,
token mean) is a sampled estimate of the gradient of ``-KL(student || teacher)``, and AdamW steps on it lower the
exact reverse KL. A context-free student (a logits vector over a small vocabulary) keeps the check exact and fast;
the loop's alignment of the teacher's and the student's tokens is tested in tests/integration/test_distill.py."""

import torch

from reinforge.algo.distill import distill_advantages
from reinforge.algo.objective import ObjectiveInputs, policy_objective
from reinforge.config import AlgoConfig


def _reverse_kl(student_logits, teacher_logits):
    s, t = student_logits.log_softmax(-1), teacher_logits.log_softmax(-1)
    return (s.exp() * (s - t)).sum(-1)


def _opd_loss(logits, teacher_logits, n, gen):
    """The OPD loss of ``n`` tokens sampled from the student (rows of 8 tokens), as the trainer computes it."""
    log_probs = logits.log_softmax(-1)
    tokens = torch.multinomial(log_probs.detach().exp(), n, replacement=True, generator=gen).view(-1, 8)
    lp = log_probs[tokens]
    mask = torch.ones_like(lp)
    adv = distill_advantages(teacher_logits.log_softmax(-1)[tokens], lp.detach(), mask, mask)
    x = ObjectiveInputs(lp, lp.detach(), lp.detach(), adv, mask, torch.zeros_like(lp))
    loss, _ = policy_objective(
        x, AlgoConfig(), decoupled=False, num_tokens=float(n), num_seqs=float(n // 8), norm_length=8
    )
    return loss


def test_the_opd_loss_gradient_estimates_the_reverse_kl_gradient():
    gen = torch.Generator().manual_seed(0)
    teacher = torch.randn(16, generator=gen) * 2
    logits = (torch.randn(16, generator=gen) * 2).requires_grad_(True)
    (exact,) = torch.autograd.grad(_reverse_kl(logits, teacher), logits)
    (sampled,) = torch.autograd.grad(_opd_loss(logits, teacher, 40_000, gen), logits)
    assert torch.nn.functional.cosine_similarity(exact, sampled, dim=0) > 0.98
    assert (sampled.norm() / exact.norm() - 1).abs() < 0.1  # the same scale: no normalisation of the advantage


def test_opd_steps_lower_the_reverse_kl():
    gen = torch.Generator().manual_seed(1)
    teacher = torch.randn(32, generator=gen) * 2
    logits = (torch.randn(32, generator=gen) * 2).requires_grad_(True)
    opt = torch.optim.AdamW([logits], lr=0.1, weight_decay=0.0)
    kls = [float(_reverse_kl(logits.detach(), teacher))]
    for _ in range(40):  # 64 sampled tokens a step
        opt.zero_grad()
        _opd_loss(logits, teacher, 64, gen).backward()
        opt.step()
        kls.append(float(_reverse_kl(logits.detach(), teacher)))
    assert kls[0] > 1.0 and kls[-1] < 0.4 * kls[0], kls
