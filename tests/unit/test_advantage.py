"""Reward shaping and the estimator dispatch over scored groups."""

import pytest
import torch

from reinforge.config import load_config
from reinforge.records import Sample, Status
from reinforge.train.rollout_advantages import (
    apply_overlong_filter,
    compute_advantages,
    overlong_penalty,
    shaped_rewards,
)


def advantages_of(cfg, groups, **kwargs):
    return compute_advantages(cfg.algo, groups, cfg.rollout.rollout_max_response_len, **kwargs)


def groups_of(rewards, lengths=None, status=Status.COMPLETED):
    out = []
    for gi, row in enumerate(rewards):
        g = []
        for j, r in enumerate(row):
            L = lengths[gi][j] if lengths else 3
            g.append(
                Sample(prompt="p", tokens=[1] * (2 + L), response_length=L, reward=r, loss_mask=[1] * L, status=status)
            )
        out.append(g)
    return out


def test_overlong_penalty():
    assert overlong_penalty(80, 100, 16, 1.0) == 0.0
    assert overlong_penalty(84, 100, 16, 1.0) == 0.0
    assert overlong_penalty(92, 100, 16, 1.0) == pytest.approx(-0.5)
    assert overlong_penalty(100, 100, 16, 2.0) == pytest.approx(-2.0)


def test_shaping_clip_and_normalise():
    cfg = load_config(None, ["algo.reward_clip=1.0", "n_samples_per_prompt=2"])
    assert shaped_rewards(cfg.algo, groups_of([[3.0, -0.5]]), 256).tolist() == [[1.0, -0.5]]
    cfg = load_config(None, ["algo.normalize_rewards=true", "n_samples_per_prompt=2"])
    r = shaped_rewards(cfg.algo, groups_of([[1.0, 3.0], [5.0, 7.0]]), 256)
    assert r.mean().item() == pytest.approx(0.0, abs=1e-6) and r.std().item() == pytest.approx(1.0, rel=1e-4)
    cfg = load_config(None, ["algo.overlong_buffer_len=4", "rollout_max_response_len=8", "n_samples_per_prompt=2"])
    assert shaped_rewards(
        cfg.algo, groups_of([[1.0, 1.0]], [[4, 6]]), cfg.rollout.rollout_max_response_len
    ).tolist() == [[1.0, 0.5]]


def test_overlong_filter_masks_truncated():
    cfg = load_config(None, ["algo.overlong_filter=true"])
    g = groups_of([[1.0, 0.0]])
    g[0][1].status = Status.TRUNCATED
    assert apply_overlong_filter(cfg.algo, g[0]) == 1
    assert g[0][0].loss_mask == [1, 1, 1] and g[0][1].loss_mask == [0, 0, 0]


@pytest.mark.parametrize(
    "est,expected",
    [
        ("grpo", [1 / (2**0.5) / 1.0000007, -1 / (2**0.5)]),  # (r - 0.5) / std, std = 0.7071
        ("dr_grpo", [0.5, -0.5]),
        ("rloo", [1.0, -1.0]),
    ],
)
def test_outcome_estimators(est, expected):
    cfg = load_config(None, [f"algo.advantage_estimator={est}", "n_samples_per_prompt=2"])
    adv = advantages_of(cfg, groups_of([[1.0, 0.0]])).advantages
    assert [a[0].item() for a in adv] == pytest.approx(expected, rel=1e-4)
    assert all(len(a) == 3 and torch.all(a == a[0]) for a in adv)


def test_reinforce_plus_plus_is_whitened_over_tokens():
    cfg = load_config(None, ["algo.advantage_estimator=reinforce_plus_plus", "n_samples_per_prompt=2"])
    adv = advantages_of(cfg, groups_of([[1.0, 0.0], [0.0, 0.0]], [[2, 3], [1, 1]])).advantages
    flat = torch.cat(adv)
    assert flat.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert flat.std().item() == pytest.approx(1.0, rel=1e-3)
    assert adv[0][0] > adv[1][0]  # the rewarded sample's tokens get the larger advantage


def test_kl_in_reward_lowers_outcome():
    cfg = load_config(
        None,
        [
            "algo.advantage_estimator=dr_grpo",
            "n_samples_per_prompt=2",
            "algo.use_kl_in_reward=true",
            "algo.kl_coef=0.5",
        ],
    )
    g = groups_of([[1.0, 1.0]])
    old = [torch.tensor([0.0, 0.0, 0.0]), torch.tensor([0.0, 0.0, 0.0])]
    ref = [torch.tensor([-1.0, -1.0, 0.0]), torch.tensor([0.0, 0.0, 0.0])]  # sample 0 drifted: KL sum 2
    adv = advantages_of(cfg, g, old_log_probs=old, ref_log_probs=ref).advantages
    # outcomes 1 - 0.5 * 2 = 0 and 1: advantages -0.5 and 0.5
    assert [a[0].item() for a in adv] == pytest.approx([-0.5, 0.5])
    with pytest.raises(ValueError, match="log-probs"):
        advantages_of(cfg, g)


def test_gae_needs_values_and_returns_them():
    cfg = load_config(None, ["algo.advantage_estimator=gae", "n_samples_per_prompt=2", "algo.lambd=1.0"])
    g = groups_of([[1.0, 0.0]], [[2, 2]])
    with pytest.raises(ValueError, match="values"):
        advantages_of(cfg, g)
    out = advantages_of(cfg, g, values=[torch.zeros(2), torch.zeros(2)])
    assert [r.tolist() for r in out.returns] == [[1.0, 1.0], [0.0, 0.0]]
    assert out.advantages[0][0] > 0 > out.advantages[1][0]
