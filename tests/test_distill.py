"""On-policy distillation (issue 55): the reverse-KL advantages, GKD's generalized JSD, the teachers
(checkpoint and endpoint), and a CPU run in which the student moves toward a different teacher."""

from __future__ import annotations

import math

import pytest
import torch

from reinforge.algo.distill import distill_advantages, generalized_jsd, reverse_kl_rewards
from reinforge.config import AlgoConfig, ConfigError
from reinforge.config.distill import DistillConfig
from reinforge.records import Sample, Status
from reinforge.train.rollout_advantages import compute_advantages


def test_reverse_kl_rewards_are_teacher_minus_student_on_the_students_own_tokens_only():
    teacher = torch.tensor([[-1.0, -2.0, -3.0, -4.0]])
    student = torch.tensor([[-1.5, -1.0, -3.5, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last column is padding
    loss_mask = torch.tensor([[1.0, 0.0, 1.0, 1.0]])  # the second token is a tool's output
    assert reverse_kl_rewards(teacher, student, mask, loss_mask).tolist() == [[0.5, 0.0, 0.5, 0.0]]
    assert distill_advantages(teacher, student, mask, loss_mask).tolist() == [[0.5, 0.0, 0.5, 0.0]]  # discount 0


def test_a_discount_sums_the_later_student_tokens_rewards_stepping_over_tool_outputs():
    teacher = torch.tensor([[0.0, 0.0, 0.0]])
    student = torch.tensor([[-1.0, -5.0, -2.0]])  # rewards 1, (5: a tool token, not counted), 2
    adv = distill_advantages(teacher, student, torch.ones(1, 3), torch.tensor([[1.0, 0.0, 1.0]]), discount=0.5)
    assert adv.tolist() == [[1.0 + 0.5 * 2.0, 0.0, 2.0]]


def _groups(rewards, lengths):
    return [
        [
            Sample(
                prompt="p",
                tokens=[1] * (2 + n),
                response_length=n,
                reward=r,
                loss_mask=[1] * n,
                rollout_log_probs=[-1.0] * n,
                status=Status.COMPLETED,
            )
            for r, n in zip(group, lens)
        ]
        for group, lens in zip(rewards, lengths)
    ]


def test_the_distillation_advantage_is_added_to_the_task_advantage_or_replaces_it():
    groups = _groups([[1.0, 0.0]], [[2, 3]])
    teacher = [torch.tensor([-1.0, -2.0]), torch.tensor([-1.0, -1.0, -1.0])]
    student = [torch.tensor([-2.0, -2.0]), torch.tensor([-1.0, -3.0, -1.0])]
    a = AlgoConfig(advantage_estimator="rloo")
    task = compute_advantages(a, groups, 8).advantages  # rloo: +1 and -1
    d = DistillConfig(teacher_path="/teacher", kl_coef=0.5)
    mixed = compute_advantages(a, groups, 8, distill=d, teacher_log_probs=teacher, student_log_probs=student)
    assert mixed.advantages[0].tolist() == pytest.approx((task[0] + 0.5 * torch.tensor([1.0, 0.0])).tolist())
    assert mixed.advantages[1].tolist() == pytest.approx((task[1] + 0.5 * torch.tensor([0.0, 2.0, 0.0])).tolist())
    assert mixed.reverse_kl == pytest.approx((-3.0, 5.0))  # sum of log p_student - log p_teacher, tokens
    d.use_task_reward = False
    alone = compute_advantages(a, groups, 8, distill=d, teacher_log_probs=teacher, student_log_probs=student)
    assert [t.tolist() for t in alone.advantages] == [[0.5, 0.0], [0.0, 1.0, 0.0]]
    with pytest.raises(ValueError, match="teacher's and the student's log-probs"):
        compute_advantages(a, groups, 8, distill=d)


def test_a_failed_sample_gets_no_distillation_advantage():
    groups = _groups([[1.0, 0.0]], [[2, 2]])
    groups[0][1].status, groups[0][1].loss_mask = Status.FAILED, [0, 0]
    d = DistillConfig(teacher_path="/teacher", use_task_reward=False)
    lp = [torch.tensor([0.0, 0.0]), torch.tensor([0.0, 0.0])]
    out = compute_advantages(
        AlgoConfig(advantage_estimator="rloo"),
        groups,
        8,
        distill=d,
        teacher_log_probs=lp,
        student_log_probs=[torch.tensor([-1.0, -1.0])] * 2,
    )
    assert [t.tolist() for t in out.advantages] == [[1.0, 1.0], [0.0, 0.0]]


def _kl(p, q):
    return sum(a * math.log(a / b) for a, b in zip(p, q) if a > 0)


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_generalized_jsd_matches_its_definition_computed_by_hand(beta):
    p_s, p_t = [0.7, 0.2, 0.1], [0.1, 0.3, 0.6]
    expected = (
        _kl(p_t, p_s)
        if beta == 0
        else _kl(p_s, p_t)
        if beta == 1
        else beta * _kl(p_t, [beta * t + (1 - beta) * s for s, t in zip(p_s, p_t)])
        + (1 - beta) * _kl(p_s, [beta * t + (1 - beta) * s for s, t in zip(p_s, p_t)])
    )
    got = generalized_jsd(torch.tensor(p_s).log()[None], torch.tensor(p_t).log()[None], beta)
    assert got.item() == pytest.approx(expected, rel=1e-5)
    # the symmetric JSD at beta 0.5 (natural log): 0.5 KL(P||M) + 0.5 KL(Q||M) of a textbook pair is ln 2
    half = generalized_jsd(torch.tensor([[0.0, -1e9]]), torch.tensor([[-1e9, 0.0]]), 0.5)
    assert half.item() == pytest.approx(math.log(2), rel=1e-5)


def test_the_distill_section_checks_its_keys():
    with pytest.raises(ConfigError, match="distill.use_task_reward=false"):
        DistillConfig(use_task_reward=False).validate()
    with pytest.raises(ConfigError, match="distill.kl_coef"):
        DistillConfig(teacher_path="/t", kl_coef=0).validate()
    d = DistillConfig(teacher_path="/local", teachers={"code": "http://h:8000/v1"})
    assert d.local_teachers() == {"": "/local"} and d.endpoint_teachers() == {"code": "http://h:8000/v1"}


def test_a_row_naming_an_unknown_teacher_is_refused_in_words():
    from reinforge.distill.teachers import check_teacher_names

    d = DistillConfig(teachers={"math": "/m"})
    check_teacher_names([{"teacher": "math"}], d)
    with pytest.raises(ConfigError, match="metadata.teacher='code' is not a key of distill.teachers"):
        check_teacher_names([{"teacher": "math"}, {"teacher": "code"}], d)
    with pytest.raises(ConfigError, match="names no teacher"):
        check_teacher_names([{}], d)
