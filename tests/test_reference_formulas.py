"""Every advantage estimator, policy loss, KL estimator and loss aggregation against values
computed here from the published formulas, in plain Python over lists of floats (written from
the papers and verl's documented definitions, independently of reinforge/algo/).

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
from reinforge.algo.losses import (aggregate, behaviour_importance_weight, clipped_value_loss, gspo_ratio,
                                   kl_penalty, ppo_clip_loss)
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


def ref_ppo(log_p, old_log_p, adv, eps_low, eps_high, clip_c=None):
    """-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), r = exp(clamp(log r, -20, 20)) (PPO eq. 7 with
    verl's clamp); dual clip (Ye et al. 2020): for A < 0 at most -clip_c A."""
    r = math.exp(max(-20.0, min(20.0, log_p - old_log_p)))
    loss = max(-r * adv, -min(max(r, 1 - eps_low), 1 + eps_high) * adv)
    if clip_c is not None and adv < 0:
        loss = min(loss, -clip_c * adv)
    return loss


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
        out[i, :len(row)] = torch.tensor(row, dtype=torch.float32)
    return out


def inputs_of(rewards, lengths, loss_masks, kl=None, values=None, pad_fill=0.0):
    T = max(lengths)
    return AdvantageInputs(
        rewards=torch.tensor(rewards), mask=grid([[1.0] * L for L in lengths], T),
        loss_mask=grid([[float(x) for x in lm] for lm in loss_masks], T),
        token_kl=None if kl is None else grid(kl, T, pad_fill),
        values=None if values is None else grid(values, T, pad_fill))


def algo(**kw):
    base = dict(gamma=1.0, lambd=0.95, grpo_std_normalization=True)
    base.update(kw)
    return SimpleNamespace(**base)


def rows(t, lengths):
    return [t[i, :L].tolist() for i, L in enumerate(lengths)]


# ----------------------------------------------------------------------------- outcome estimators


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("est", ["grpo", "grpo_no_std", "dr_grpo", "rloo"])
def test_outcome_estimators(seed, est):
    rng = random.Random(seed)
    rewards, lengths, loss_masks, kl = rand_batch(rng, groups=4, n=4, max_len=6)
    rewards[0] = [0.7] * 4  # equal rewards: only the KL differs
    inp = inputs_of(rewards, lengths, loss_masks, kl, pad_fill=float("nan"))
    name = "grpo" if est == "grpo_no_std" else est
    adv, ret = ADV_ESTIMATORS.get(name)(inp, algo(grpo_std_normalization=est != "grpo_no_std"))
    assert ret is None
    k = 0
    for g, row in enumerate(rewards):
        s = [row[j] - sum(kl[g * 4 + j]) for j in range(4)]  # outcome: r minus the summed KL
        for j in range(4):
            others = [s[i] for i in range(4) if i != j]
            if est == "grpo":
                want = (s[j] - ref_mean(s)) / (ref_std(s) + 1e-6)
            elif est in ("grpo_no_std", "dr_grpo"):
                want = s[j] - ref_mean(s)
            else:
                want = s[j] - ref_mean(others)
            assert adv[k, :lengths[k]].tolist() == pytest.approx([want] * lengths[k], rel=1e-4, abs=1e-5)
            assert adv[k, lengths[k]:].abs().sum().item() == 0.0  # padding (NaN KL there) stays 0
            k += 1


def test_equal_rewards_give_zero_advantage():
    for name in ("grpo", "dr_grpo", "rloo"):
        adv, _ = ADV_ESTIMATORS.get(name)(inputs_of([[1.0, 1.0, 1.0]], [2, 3, 1], [[1, 1], [1, 1, 1], [1]]), algo())
        assert adv.abs().max().item() == 0.0


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
        token_r = [-x for x in kl[i]]
        token_r[L - 1] += flat_r[i]  # the outcome at the last token, -kl_coef * KL at every token
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
    outs = [gae_advantages(r, torch.tensor([[0.1, 0.2, v, v, 0.3]]), torch.ones(1, 5), 1.0, 0.95, lm)
            for v in (0.0, 100.0, float("nan"))]
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
    values = [[rng.uniform(-1, 1) if loss_masks[i][t] else rng.choice([1e6, float("inf")]) for t in range(L)]
              for i, L in enumerate(lengths)]
    inp = inputs_of(rewards, lengths, loss_masks, kl, values, pad_fill=float("nan"))
    adv, ret = ADV_ESTIMATORS.get("gae")(inp, algo(gamma=gamma, lambd=lam))
    flat_r = [r for row in rewards for r in row]
    raw, rets = [], []
    for i, L in enumerate(lengths):
        token_r = [-x for x in kl[i]]
        token_r[L - 1] += flat_r[i]
        a, R = ref_gae(token_r, values[i], loss_masks[i], gamma, lam)
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
    adv, _ = gae_advantages(torch.tensor([[0.0, 0.0, 1.0]]), torch.zeros(1, 3), torch.ones(1, 3), 1.0, 1.0,
                            torch.tensor([[1.0, 1.0, 0.0]]))
    assert adv[0].tolist() == [1.0, 1.0, 0.0]


def test_loss_mask_reaches_gae_from_samples():
    """compute_advantages passes each sample's loss mask to GAE: tool-token values change nothing."""
    cfg = load_config(None, ["algo.advantage_estimator=gae", "n_samples_per_prompt=2"])

    def run(v):
        groups = [[Sample(prompt="p", tokens=[1] * 7, response_length=5, reward=r, loss_mask=[1, 1, 0, 0, 1])
                   for r in (1.0, 0.0)]]
        values = [torch.tensor([0.1, 0.2, v, v, 0.3]), torch.tensor([0.0, 0.5, v, v, 0.2])]
        return compute_advantages(cfg.algo, groups, cfg.rollout.rollout_max_response_len, values=values)

    a, b = run(0.0), run(100.0)
    for x, y in zip(a.advantages + a.returns, b.advantages + b.returns):
        assert torch.allclose(x, y)


# ----------------------------------------------------------------------------- policy loss


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("eps_low,eps_high,clip_c", [(0.2, 0.2, None), (0.2, 0.28, None), (0.2, 0.28, 3.0)])
def test_ppo_clip_loss(seed, eps_low, eps_high, clip_c):
    rng = random.Random(seed)
    n = 64
    lp = [rng.uniform(-5, 0) for _ in range(n)]
    old = [x + rng.choice([rng.uniform(-0.5, 0.5), rng.uniform(-150, 150)]) for x in lp]  # some extreme
    adv = [rng.choice([rng.uniform(-2, 2), 0.0]) for _ in range(n)]
    lp_t = torch.tensor([lp], requires_grad=True)
    loss, ratio, clipped = ppo_clip_loss(lp_t, torch.tensor([old]), torch.tensor([adv]), eps_low, eps_high, clip_c)
    want = [ref_ppo(a, b, c, eps_low, eps_high, clip_c) for a, b, c in zip(lp, old, adv)]
    assert loss[0].tolist() == pytest.approx(want, rel=1e-4, abs=1e-6)
    loss.sum().backward()
    assert torch.isfinite(lp_t.grad).all()


def test_ppo_extreme_log_ratio_is_finite_with_zero_gradient_when_clipped():
    """log ratio 100 (fp32 exp overflows above ~88.7): the ratio is exp(20), the loss finite, and the
    clipped token's gradient 0 (not NaN)."""
    lp = torch.tensor([[0.0, 0.0, -200.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-100.0, -100.0, 0.0, -100.0]])
    adv = torch.tensor([[1.0, -1.0, -1.0, 0.0]])
    loss, ratio, clipped = ppo_clip_loss(lp, old, adv, 0.2, 0.2, 3.0)
    assert torch.isfinite(loss).all() and torch.isfinite(ratio).all()
    assert ratio[0, 0].item() == pytest.approx(math.exp(20.0), rel=1e-5)
    assert loss[0].tolist() == pytest.approx([-1.2, 3.0, 0.8, 0.0])  # clip high, dual clip, clip low, A = 0
    loss.sum().backward()
    assert lp.grad.tolist() == [[0.0, 0.0, 0.0, 0.0]]


def test_behaviour_weight_is_finite():
    w = behaviour_importance_weight(torch.tensor([0.0, 0.0]), torch.tensor([-100.0, 0.5]))
    assert torch.isfinite(w).all() and w[0].item() == pytest.approx(math.exp(20.0), rel=1e-5)
    assert w[1].item() == pytest.approx(math.exp(-0.5))


def test_gspo_ratio_ignores_masked_tokens():
    """GSPO (Zheng et al. 2025, eq. 7): s_i = exp(mean over the sequence's tokens of log r)."""
    lp = torch.tensor([[-1.0, -2.0, -3.0]])
    old = torch.tensor([[-1.5, -1.0, float("-inf")]])
    r = gspo_ratio(lp, old, torch.tensor([[1.0, 1.0, 0.0]]))
    assert r[0, :2].tolist() == pytest.approx([math.exp((0.5 - 1.0) / 2)] * 2)


def test_clipped_value_loss():
    rng = random.Random(0)
    v, old, R = ([rng.uniform(-2, 2) for _ in range(32)] for _ in range(3))
    loss, _ = clipped_value_loss(torch.tensor(v), torch.tensor(old), torch.tensor(R), 0.2)
    want = [0.5 * max((a - c) ** 2, (b + max(-0.2, min(0.2, a - b)) - c) ** 2) for a, b, c in zip(v, old, R)]
    assert loss.tolist() == pytest.approx(want, rel=1e-5)


# ----------------------------------------------------------------------------- KL estimators


@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "low_var_kl"])
def test_kl_estimators(kind):
    """Schulman 2020, "Approximating KL Divergence", with log r = log pi - log pi_ref; low_var_kl as
    verl's: log r clamped to [-20, 20], the estimate to [-10, 10]."""
    rng = random.Random(1)
    lp = [rng.uniform(-8, 0) for _ in range(64)] + [0.0, -30.0]
    ref = [rng.uniform(-8, 0) for _ in range(64)] + [-30.0, 0.0]
    got = kl_penalty(torch.tensor(lp), torch.tensor(ref), kind).tolist()
    want = []
    for a, b in zip(lp, ref):
        x = a - b
        if kind == "k1":
            want.append(x)
        elif kind == "k2":
            want.append(x * x / 2)
        elif kind == "k3":
            want.append(math.exp(-x) - 1 + x)
        else:
            x = max(-20.0, min(20.0, x))
            want.append(max(-10.0, min(10.0, math.exp(-x) - 1 + x)))
    assert got == pytest.approx(want, rel=1e-4, abs=1e-5)


def test_k3_on_a_masked_tool_token_keeps_loss_and_gradient_finite():
    """A tool token where log pi - log pi_ref = -100 (k3 = exp(100) = inf in fp32): with the mask given
    to kl_penalty and aggregate, the loss and its gradient are finite and the other token's are k3's."""
    lp = torch.tensor([[-1.0, -120.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -20.0]])
    mask = torch.tensor([[1.0, 0.0]])
    loss = aggregate(kl_penalty(lp, ref, "k3", mask), mask, "token_mean")
    assert loss.item() == pytest.approx(math.exp(-0.5) - 1 + 0.5)
    loss.backward()
    assert lp.grad[0].tolist() == pytest.approx([1 - math.exp(-0.5), 0.0])


# ----------------------------------------------------------------------------- aggregation


def ref_aggregate(values, mask, mode, norm_mask=None, norm_length=None):
    """verl's agg_loss definitions (global-batch form), written out per sequence."""
    norm_mask = norm_mask or mask
    sums = [sum(v for v, m in zip(vs, ms) if m) for vs, ms in zip(values, mask)]
    counts = [sum(1 for m in ms if m) for ms in norm_mask]
    live = [i for i, c in enumerate(counts) if c > 0]
    if mode == "token_mean":
        return sum(sums) / sum(counts)
    per_seq = {"seq_mean_token_sum": lambda i: sums[i],
               "seq_mean_token_mean": lambda i: sums[i] / counts[i],
               "seq_mean_token_sum_norm": lambda i: sums[i] / norm_length}[mode]
    return sum(per_seq(i) for i in live) / len(live)


MODES = ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "seq_mean_token_sum_norm"]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("mode", MODES)
def test_aggregation_modes(seed, mode):
    rng = random.Random(seed)
    B, T = 5, 7
    lengths = [rng.randint(1, T) for _ in range(B)]
    mask = [[1 if t < L and rng.random() > 0.2 else 0 for t in range(T)] for L in lengths]
    mask[0] = [0] * T  # a fully masked sequence (over-long filtered): not a sequence of the mean
    vals = [[rng.uniform(-3, 3) if mask[i][t] else rng.choice([float("nan"), float("inf"), 1e30])
             for t in range(T)] for i in range(B)]
    v = torch.tensor(vals, requires_grad=True)
    got = aggregate(v, torch.tensor(mask, dtype=torch.float32), mode, norm_length=T)
    assert got.item() == pytest.approx(ref_aggregate(vals, mask, mode, norm_length=T), rel=1e-5)
    got.backward()
    assert torch.isfinite(v.grad).all()
    assert v.grad[torch.tensor(mask) == 0].abs().sum().item() == 0.0


@pytest.mark.parametrize("mode", MODES)
def test_masked_importance_sampling_keeps_dropped_tokens_in_normalisers(mode):
    """tis_mode: mask drops tokens from the sums (``mask``) and keeps them in every normaliser
    (``norm_mask`` = the loss mask), as docs/algorithms.md says."""
    vals = [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 0.0, 0.0], [7.0, 0.0, 0.0, 0.0]]
    loss_mask = [[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]]
    kept = [[1, 0, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]]  # sequence 2: every token dropped, still counted
    got = aggregate(torch.tensor(vals), torch.tensor(kept, dtype=torch.float32), mode, norm_length=8,
                    norm_mask=torch.tensor(loss_mask, dtype=torch.float32))
    want = ref_aggregate(vals, kept, mode, norm_mask=loss_mask, norm_length=8)
    assert got.item() == pytest.approx(want)
    if mode == "seq_mean_token_mean":
        assert want == pytest.approx(((1 + 3 + 4) / 4 + 6 / 2 + 0) / 3)


def test_seq_mean_token_sum_norm_is_dr_grpo():
    """Dr. GRPO (Liu et al. 2025, eq. 3): (1 / G) sum_i sum_t loss_it / L, L the max response length;
    independent of how the sequences are split into micro-batches."""
    vals = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [0.5, 0.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    whole = aggregate(vals, mask, "seq_mean_token_sum_norm", norm_length=10)
    assert whole.item() == pytest.approx((6 + 4 + 1) / 10 / 3)
    parts = sum(aggregate(vals[i:i + 1], mask[i:i + 1], "seq_mean_token_sum_norm", num_seqs=3, norm_length=10)
                for i in range(3))
    assert parts.item() == pytest.approx(whole.item())


# ----------------------------------------------------------------------------- pass@k


def test_pass_at_k():
    """HumanEval (Chen et al. 2021): 1 - C(n - c, k) / C(n, k)."""
    for n in range(1, 12):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)
