"""Every advantage estimator (and the rollout glue that feeds it: KL in the reward, shaping) against
values computed here from the published formulas, in plain Python over lists of floats (written from
the papers and verl's documented definitions, independently of reinforge/algo/). The policy loss, KL
estimators, loss aggregation, off-policy corrections and offline losses are in
tests/unit/test_reference_formulas_losses.py.

Inputs are random, with the cases where implementations tend to differ: right padding, groups
of one sample, groups with equal rewards, extreme log-ratios, non-finite values outside the
mask and tool-output tokens (loss mask 0 inside a response).
"""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch

from reinforge.algo.advantages import ADV_ESTIMATORS, AdvantageInputs, gae_advantages
from reinforge.algo.passk import pass_at_k
from reinforge.config import load_config
from reinforge.records import Sample
from reinforge.train.rollout_advantages import compute_advantages

# ----------------------------------------------------------------------------- reference formulas


def ref_mean(xs):
    return sum(xs) / len(xs)


def ref_std(xs):  # unbiased sample standard deviation
    m = ref_mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def ref_whiten(per_seq, eps=1e-8):
    """(x - mean) / sqrt(var + eps) over every value of every sequence, unbiased var."""
    flat = [x for seq in per_seq for x in seq]
    m = ref_mean(flat)
    var = sum((x - m) ** 2 for x in flat) / (len(flat) - 1)
    return [[(x - m) / math.sqrt(var + eps) for x in seq] for seq in per_seq]


def ref_policy_tokens(loss_mask):
    return [t for t, keep in enumerate(loss_mask) if keep]


def ref_step_rewards(rewards, loss_mask):
    """Rewards per policy step: a tool token's reward belongs to the policy token before it."""
    steps = ref_policy_tokens(loss_mask)
    out = []
    for k, t in enumerate(steps):
        end = steps[k + 1] if k + 1 < len(steps) else len(rewards)
        out.append(sum(rewards[t:end]))
    return steps, out


def ref_gae(rewards, values, loss_mask, gamma, lam):
    """Schulman et al. 2016, eq. 16 on the sequence of policy tokens: A_k = sum_l (gamma lam)^l delta_{k+l},
    delta_k = r_k + gamma V_{k+1} - V_k, V after the last step 0. Returns ({token: A}, {token: A + V})."""
    steps, r = ref_step_rewards(rewards, loss_mask)
    v = [values[t] for t in steps]
    deltas = [r[k] + gamma * (v[k + 1] if k + 1 < len(v) else 0.0) - v[k] for k in range(len(steps))]
    adv = {}
    for k, t in enumerate(steps):
        adv[t] = sum((gamma * lam) ** (j - k) * deltas[j] for j in range(k, len(steps)))
    return adv, {t: adv[t] + values[t] for t in steps}


def ref_discounted_returns(rewards, loss_mask, gamma):
    """G_k = sum_l gamma^l r_{k+l} over the policy steps (REINFORCE++, Hu 2025)."""
    steps, r = ref_step_rewards(rewards, loss_mask)
    return {t: sum(gamma ** (j - k) * r[j] for j in range(k, len(steps))) for k, t in enumerate(steps)}


# ----------------------------------------------------------------------------- helpers


def rand_batch(rng, groups, n, max_len, tool_tokens=False):
    """Random rewards [groups][n], right-padded lengths, loss masks (with tool spans) and KL."""
    rewards = [[rng.choice([0.0, 1.0, 0.5, rng.uniform(-1, 2)]) for _ in range(n)] for _ in range(groups)]
    lengths = [rng.randint(1, max_len) for _ in range(groups * n)]
    loss_masks = []
    for L in lengths:
        lm = [1] * L
        if tool_tokens and L >= 4:
            a = rng.randint(1, L - 2)
            b = rng.randint(a, L - 2)
            for t in range(a, b + 1):
                lm[t] = 0
        loss_masks.append(lm)
    kl = [[rng.uniform(-0.3, 0.3) for _ in range(L)] for L in lengths]
    return rewards, lengths, loss_masks, kl


def grid(rows, width, fill=0.0):
    out = torch.full((len(rows), width), fill)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out


def inputs_of(rewards, lengths, loss_masks, kl=None, values=None, pad_fill=0.0):
    T = max(lengths)
    return AdvantageInputs(
        rewards=torch.tensor(rewards),
        mask=grid([[1.0] * L for L in lengths], T),
        loss_mask=grid([[float(x) for x in lm] for lm in loss_masks], T),
        token_kl=None if kl is None else grid(kl, T, pad_fill),
        values=None if values is None else grid(values, T, pad_fill),
    )


def algo(**kw):
    base = dict(gamma=1.0, lambd=0.95, grpo_std_normalization=True)
    base.update(kw)
    return SimpleNamespace(**base)


def rows(t, lengths):
    return [t[i, :L].tolist() for i, L in enumerate(lengths)]


# ----------------------------------------------------------------------------- outcome estimators


def ref_kl_sum(kl, loss_mask):
    """The KL penalty of a sequence in the reward: summed over its loss-mask tokens only (verl's
    apply_kl_penalty: kld * response_mask, the response mask 0 on tool outputs)."""
    return sum(x for x, m in zip(kl, loss_mask) if m)


def ref_token_rewards(outcome, kl, loss_mask):
    """verl's token_level_rewards: the outcome at the last token, minus the KL on loss-mask tokens."""
    out = [-x if m else 0.0 for x, m in zip(kl, loss_mask)]
    out[-1] += outcome
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("tool_tokens", [False, True])
@pytest.mark.parametrize("est", ["grpo", "grpo_no_std", "dr_grpo", "rloo"])
def test_outcome_estimators(seed, tool_tokens, est):
    rng = random.Random(seed)
    rewards, lengths, loss_masks, kl = rand_batch(rng, groups=4, n=4, max_len=6, tool_tokens=tool_tokens)
    rewards[0] = [0.7] * 4  # equal rewards: only the KL differs
    inp = inputs_of(rewards, lengths, loss_masks, kl, pad_fill=float("nan"))
    name = "grpo" if est == "grpo_no_std" else est
    adv, ret = ADV_ESTIMATORS.get(name)(inp, algo(grpo_std_normalization=est != "grpo_no_std"))
    assert ret is None
    k = 0
    for g, row in enumerate(rewards):
        s = [row[j] - ref_kl_sum(kl[g * 4 + j], loss_masks[g * 4 + j]) for j in range(4)]  # r minus the KL
        for j in range(4):
            others = [s[i] for i in range(4) if i != j]
            if est == "grpo":
                want = (s[j] - ref_mean(s)) / (ref_std(s) + 1e-6)
            elif est in ("grpo_no_std", "dr_grpo"):
                want = s[j] - ref_mean(s)
            else:
                want = s[j] - ref_mean(others)
            assert adv[k, : lengths[k]].tolist() == pytest.approx([want] * lengths[k], rel=1e-4, abs=1e-5)
            assert adv[k, lengths[k] :].abs().sum().item() == 0.0  # padding (NaN KL there) stays 0
            k += 1


def test_equal_rewards_give_zero_advantage():
    for name in ("grpo", "dr_grpo", "rloo"):
        adv, _ = ADV_ESTIMATORS.get(name)(inputs_of([[1.0, 1.0, 1.0]], [2, 3, 1], [[1, 1], [1, 1, 1], [1]]), algo())
        assert adv.abs().max().item() == 0.0


@pytest.mark.parametrize("est", ["grpo", "grpo_no_std", "dr_grpo", "rloo", "reinforce_plus_plus_baseline"])
def test_equal_non_dyadic_rewards_give_exactly_zero_advantage(est):
    """All-equal groups of rewards that fp32 cannot hold exactly: the fp32 group mean differs from
    them by an ulp, which (r - mean) / (std + 1e-6) turned into advantages up to 0.8 (and batch
    whitening into order 1). The published formula gives 0 (r_i = mean), so the samples are skipped."""
    values = [0.1, 0.7, 10.1, 123.456, 1 / 3]
    rewards = [[v] * 8 for v in values]
    lengths = [3] * (8 * len(values))
    inp = inputs_of(rewards, lengths, [[1] * 3] * len(lengths))
    name = "grpo" if est == "grpo_no_std" else est
    adv, _ = ADV_ESTIMATORS.get(name)(inp, algo(grpo_std_normalization=est != "grpo_no_std"))
    assert adv.abs().max().item() == 0.0
    if est == "grpo":  # through the rollout glue: every sample's advantages are exactly 0 (skipped by the actor)
        cfg = load_config(None, ["n_samples_per_prompt=3"])
        groups = [
            [Sample(prompt="p", tokens=[1] * 4, response_length=2, reward=0.1, loss_mask=[1, 1]) for _ in range(3)]
        ]
        out = compute_advantages(cfg.algo, groups, cfg.rollout.rollout_max_response_len)
        assert not any(bool(a.any()) for a in out.advantages)


# ----------------------------------------------------------------------------- REINFORCE++


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_plus_plus(seed, gamma):
    rng = random.Random(seed)
    rewards, lengths, loss_masks, kl = rand_batch(rng, groups=3, n=2, max_len=7, tool_tokens=True)
    inp = inputs_of(rewards, lengths, loss_masks, kl, pad_fill=float("inf"))
    adv, _ = ADV_ESTIMATORS.get("reinforce_plus_plus")(inp, algo(gamma=gamma))
    flat_r = [r for row in rewards for r in row]
    per_seq = []
    for i, L in enumerate(lengths):
        token_r = ref_token_rewards(flat_r[i], kl[i], loss_masks[i])  # -kl_coef * KL on loss-mask tokens
        G = ref_discounted_returns(token_r, loss_masks[i], gamma)
        per_seq.append([G[t] for t in sorted(G)])
    white = ref_whiten(per_seq)
    for i, L in enumerate(lengths):
        got = adv[i, :L].tolist()
        steps = ref_policy_tokens(loss_masks[i])
        assert [got[t] for t in steps] == pytest.approx(white[i], rel=1e-4, abs=1e-5)
        assert all(got[t] == 0.0 for t in range(L) if t not in steps)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n", [1, 3])  # n = 1: groups of one keep their outcome (no baseline)
def test_reinforce_plus_plus_baseline_matches_verl_definition(seed, n):
    """verl's reinforce_plus_plus_baseline: s_i = r_i - sum_t KL_it, minus the group mean (none for a
    group of one), the same value on every response token, whitened over the batch's tokens."""
    rng = random.Random(seed)
    rewards, lengths, loss_masks, kl = rand_batch(rng, groups=3, n=n, max_len=6)
    inp = inputs_of(rewards, lengths, loss_masks, kl)
    adv, _ = ADV_ESTIMATORS.get("reinforce_plus_plus_baseline")(inp, algo(gamma=0.5))  # gamma is not read
    per_seq = []
    for g, row in enumerate(rewards):
        s = [row[j] - sum(kl[g * n + j]) for j in range(n)]
        base = ref_mean(s) if n > 1 else 0.0
        per_seq += [[s[j] - base] * lengths[g * n + j] for j in range(n)]
    white = ref_whiten(per_seq)
    for i, L in enumerate(lengths):
        assert adv[i, :L].tolist() == pytest.approx(white[i], rel=1e-4, abs=1e-5)


def test_reinforce_plus_plus_baseline_refuses_gamma():
    from reinforge.config import ConfigError

    with pytest.raises(ConfigError, match="algo.gamma set"):
        load_config(None, ["algo.advantage_estimator=reinforce_plus_plus_baseline", "algo.gamma=0.9"])


# ----------------------------------------------------------------------------- GAE


def test_gae_issue_example_ignores_values_on_tool_tokens():
    """rewards [0,0,0,0,1], loss mask [1,1,0,0,1], values [.1,.2,v,v,.3]: tokens 2-3 are a tool's
    output; the critic's value there must not matter."""
    r = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]])
    lm = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0]])
    outs = [
        gae_advantages(r, torch.tensor([[0.1, 0.2, v, v, 0.3]]), torch.ones(1, 5), 1.0, 0.95, lm)
        for v in (0.0, 100.0, float("nan"))
    ]
    want_adv, want_ret = ref_gae([0, 0, 0, 0, 1], [0.1, 0.2, 0, 0, 0.3], [1, 1, 0, 0, 1], 1.0, 0.95)
    # by hand: A_4 = 0.7, A_1 = 0.1 + 0.95 * 0.7 = 0.765, A_0 = 0.1 + 0.95 * 0.765 = 0.82675
    assert [want_adv[t] for t in (0, 1, 4)] == pytest.approx([0.82675, 0.765, 0.7])
    for adv, ret in outs:
        assert adv[0].tolist() == pytest.approx([want_adv[0], want_adv[1], 0.0, 0.0, want_adv[4]])
        assert ret[0].tolist() == pytest.approx([want_ret[0], want_ret[1], 0.0, 0.0, want_ret[4]])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.8), (1.0, 1.0)])
def test_gae_estimator(seed, gamma, lam):
    rng = random.Random(seed)
    rewards, lengths, loss_masks, kl = rand_batch(rng, groups=3, n=2, max_len=8, tool_tokens=True)
    values = [
        [rng.uniform(-1, 1) if loss_masks[i][t] else rng.choice([1e6, float("inf")]) for t in range(L)]
        for i, L in enumerate(lengths)
    ]
    inp = inputs_of(rewards, lengths, loss_masks, kl, values, pad_fill=float("nan"))
    adv, ret = ADV_ESTIMATORS.get("gae")(inp, algo(gamma=gamma, lambd=lam))
    flat_r = [r for row in rewards for r in row]
    raw, rets = [], []
    for i, L in enumerate(lengths):
        a, R = ref_gae(ref_token_rewards(flat_r[i], kl[i], loss_masks[i]), values[i], loss_masks[i], gamma, lam)
        raw.append([a[t] for t in sorted(a)])
        rets.append(R)
    white = ref_whiten(raw)
    for i, L in enumerate(lengths):
        steps = ref_policy_tokens(loss_masks[i])
        got_a, got_r = adv[i, :L].tolist(), ret[i, :L].tolist()
        assert [got_a[t] for t in steps] == pytest.approx(white[i], rel=1e-4, abs=1e-5)
        assert [got_r[t] for t in steps] == pytest.approx([rets[i][t] for t in steps], rel=1e-5, abs=1e-5)
        assert torch.isfinite(adv[i]).all() and torch.isfinite(ret[i]).all()


def test_gae_reward_on_a_trailing_tool_token_is_kept():
    """A response that ends in a tool's output: its reward goes to the last policy token."""
    adv, _ = gae_advantages(
        torch.tensor([[0.0, 0.0, 1.0]]), torch.zeros(1, 3), torch.ones(1, 3), 1.0, 1.0, torch.tensor([[1.0, 1.0, 0.0]])
    )
    assert adv[0].tolist() == [1.0, 1.0, 0.0]


def test_loss_mask_reaches_gae_from_samples():
    """compute_advantages passes each sample's loss mask to GAE: tool-token values change nothing."""
    cfg = load_config(None, ["algo.advantage_estimator=gae", "n_samples_per_prompt=2"])

    def run(v):
        groups = [
            [
                Sample(prompt="p", tokens=[1] * 7, response_length=5, reward=r, loss_mask=[1, 1, 0, 0, 1])
                for r in (1.0, 0.0)
            ]
        ]
        values = [torch.tensor([0.1, 0.2, v, v, 0.3]), torch.tensor([0.0, 0.5, v, v, 0.2])]
        return compute_advantages(cfg.algo, groups, cfg.rollout.rollout_max_response_len, values=values)

    a, b = run(0.0), run(100.0)
    for x, y in zip(a.advantages + a.returns, b.advantages + b.returns):
        assert torch.allclose(x, y)


def ref_verl_gae(token_rewards, values, response_mask, gamma, lam):
    """verl's compute_gae_advantage_return, its loop written out (observation tokens, response_mask 0,
    carry the next value and the running advantage); returns (advantages before whitening, returns)."""
    next_value, last, adv = 0.0, 0.0, [0.0] * len(values)
    for t in reversed(range(len(values))):
        delta = token_rewards[t] + gamma * next_value - values[t]
        stepped = delta + gamma * lam * last
        m = response_mask[t]
        next_value = values[t] * m + (1 - m) * next_value
        last = stepped * m + (1 - m) * last
        adv[t] = last
    return adv, [a + v for a, v in zip(adv, values)]


def kl_in_reward_samples(rewards, loss_masks, tool_kl):
    """Samples of one group, and old / ref log-probs whose k1 KL is ``tool_kl[i]`` on each tool token
    (loss mask 0) of sample i and 0 elsewhere."""
    samples, old, ref = [], [], []
    for r, lm, k in zip(rewards, loss_masks, tool_kl):
        samples.append(
            Sample(prompt="p", tokens=[1] * (len(lm) + 2), response_length=len(lm), reward=r, loss_mask=list(lm))
        )
        old.append(torch.zeros(len(lm)))
        ref.append(torch.tensor([0.0 if m else -k for m in lm]))
    return [samples], old, ref


def test_kl_in_reward_skips_tool_tokens_issue_example():
    """Rewards (1, 0), KL only on tool tokens (sample 0: 2 nats, times kl_coef 0.5 = its whole reward):
    verl's apply_kl_penalty masks the KL with the response mask, so GRPO gives (0.707, -0.707)."""
    cfg = load_config(None, ["n_samples_per_prompt=2", "algo.use_kl_in_reward=true", "algo.kl_coef=0.5"])
    groups, old, ref = kl_in_reward_samples([1.0, 0.0], [[1, 1, 0, 0, 1]] * 2, [1.0, 0.0])
    out = compute_advantages(cfg.algo, groups, 64, old_log_probs=old, ref_log_probs=ref)
    want = 0.5 / (ref_std([1.0, 0.0]) + 1e-6)
    assert out.advantages[0].tolist() == pytest.approx([want] * 5)
    assert out.advantages[1].tolist() == pytest.approx([-want] * 5)


@pytest.mark.parametrize("seed", range(4))
def test_kl_in_reward_gae_matches_verl(seed):
    """GAE with KL in the reward, tool spans with KL (and garbage values) on them: the returns equal
    verl's (apply_kl_penalty then compute_gae_advantage_return) on the policy tokens, and the
    advantages verl's whitened over the response mask."""
    rng = random.Random(seed)
    cfg = load_config(
        None,
        [
            "algo.advantage_estimator=gae",
            "n_samples_per_prompt=2",
            "algo.use_kl_in_reward=true",
            "algo.kl_coef=0.3",
            "algo.gamma=0.95",
            "algo.lambd=0.9",
        ],
    )
    rewards = [rng.uniform(-1, 2), rng.uniform(-1, 2)]
    loss_masks = [[1] * 6 + [0] * 2 + [1], [1, 0, 0, 1, 1]]  # a tool span in each
    lengths = [len(lm) for lm in loss_masks]
    old = [torch.tensor([rng.uniform(-2, 0) for _ in range(L)]) for L in lengths]
    ref = [o - torch.tensor([rng.uniform(-1, 1) for _ in range(len(o))]) for o in old]
    values = [torch.tensor([rng.uniform(-1, 1) if m else 50.0 for m in lm]) for lm in loss_masks]
    groups = [
        [
            Sample(prompt="p", tokens=[1] * (L + 2), response_length=L, reward=r, loss_mask=lm)
            for r, L, lm in zip(rewards, lengths, loss_masks)
        ]
    ]
    out = compute_advantages(cfg.algo, groups, 64, values=values, old_log_probs=old, ref_log_probs=ref)
    raw = []
    for i, lm in enumerate(loss_masks):
        kl = (0.3 * (old[i] - ref[i])).tolist()
        a, R = ref_verl_gae(ref_token_rewards(rewards[i], kl, lm), values[i].tolist(), lm, 0.95, 0.9)
        steps = ref_policy_tokens(lm)
        assert [out.returns[i][t].item() for t in steps] == pytest.approx([R[t] for t in steps], rel=1e-5, abs=1e-5)
        raw.append([a[t] for t in steps])
    white = ref_whiten(raw)
    for i, lm in enumerate(loss_masks):
        assert [out.advantages[i][t].item() for t in ref_policy_tokens(lm)] == pytest.approx(
            white[i], rel=1e-4, abs=1e-5
        )


# ----------------------------------------------------------------------------- pass@k


def test_pass_at_k():
    """HumanEval (Chen et al. 2021): 1 - C(n - c, k) / C(n, k)."""
    for n in range(1, 12):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)
