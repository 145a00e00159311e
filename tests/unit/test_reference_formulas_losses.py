"""The policy loss, KL estimators, loss aggregation, the off-policy corrections between engine and
trainer (TIS, masked IS, rejection, the decoupled objective) and the offline preference losses against
values computed here from the published formulas and the reference implementations (verl, slime,
TRL), written out in plain Python over floats (float64), independently of reinforge/algo/.
The advantage estimators are in tests/unit/test_reference_formulas.py.
"""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch

from reinforge.algo.losses import (
    aggregate,
    behaviour_importance_weight,
    clipped_value_loss,
    gspo_ratio,
    kl_penalty,
    ppo_clip_loss,
)
from reinforge.algo.objective import ObjectiveInputs, policy_objective
from reinforge.algo.preference import PairLogps, orpo_loss, sequence_logps

# ----------------------------------------------------------------------------- reference formulas


def ref_ppo(log_p, old_log_p, adv, eps_low, eps_high, clip_c=None):
    """-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), r = exp(clamp(log r, -20, 20)) (PPO eq. 7 with
    verl's clamp); dual clip (Ye et al. 2020): for A < 0 at most -clip_c A."""
    r = math.exp(max(-20.0, min(20.0, log_p - old_log_p)))
    loss = max(-r * adv, -min(max(r, 1 - eps_low), 1 + eps_high) * adv)
    if clip_c is not None and adv < 0:
        loss = min(loss, -clip_c * adv)
    return loss


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
    per_seq = {
        "seq_mean_token_sum": lambda i: sums[i],
        "seq_mean_token_mean": lambda i: sums[i] / counts[i],
        "seq_mean_token_sum_norm": lambda i: sums[i] / norm_length,
    }[mode]
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
    vals = [
        [rng.uniform(-3, 3) if mask[i][t] else rng.choice([float("nan"), float("inf"), 1e30]) for t in range(T)]
        for i in range(B)
    ]
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
    got = aggregate(
        torch.tensor(vals),
        torch.tensor(kept, dtype=torch.float32),
        mode,
        norm_length=8,
        norm_mask=torch.tensor(loss_mask, dtype=torch.float32),
    )
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
    parts = sum(
        aggregate(vals[i : i + 1], mask[i : i + 1], "seq_mean_token_sum_norm", num_seqs=3, norm_length=10)
        for i in range(3)
    )
    assert parts.item() == pytest.approx(whole.item())


# ----------------------------------------------------------------------------- off-policy correction


def ref_objective(lp, old, roll, adv, mask, ref_lp, *, mode, decoupled, loss, clip, low, eps, eps_high, kl_coef):
    """The token-mean loss of policy_objective, per token: c * pg + kl_coef * k1 over the tokens kept,
    divided by the loss-mask token count. w = exp(clamp(old - rollout, -20, 20)) and c is
    * truncate: min(w, clip)                       (TIS, Yao et al. 2025)
    * mask:     w if low <= w <= clip else 0       (slime icepop_function; verl IcePop)
    * reject:   1, tokens outside leave the loss   (verl rollout_rs token_k1)
    * no TIS:   w with the decoupled objective (AReaL eq. 5), else 1.
    GSPO's sequence ratio exp(mean log r) runs over the tokens kept (all loss tokens but under reject)."""
    total, count = 0.0, sum(sum(m) for m in mask)
    for i in range(len(lp)):
        T = len(lp[i])
        w = [math.exp(max(-20.0, min(20.0, old[i][t] - roll[i][t]))) for t in range(T)]
        inside = [low <= x <= clip for x in w]
        kept = [bool(mask[i][t]) and (mode != "reject" or inside[t]) for t in range(T)]
        c = {
            "truncate": [min(x, clip) for x in w],
            "mask": [x if ok else 0.0 for x, ok in zip(w, inside)],
            "reject": [1.0] * T,
            None: w if decoupled else [1.0] * T,
        }[mode]
        if loss == "gspo":
            toks = [t for t in range(T) if kept[t]]
            s = math.exp(min(10.0, sum(lp[i][t] - old[i][t] for t in toks) / max(len(toks), 1)))
            pg = [max(-s * a, -min(max(s, 1 - eps), 1 + eps_high) * a) for a in adv[i]]
        else:
            pg = [ref_ppo(lp[i][t], old[i][t], adv[i][t], eps, eps_high) for t in range(T)]
        total += sum(c[t] * pg[t] + kl_coef * (lp[i][t] - ref_lp[i][t]) for t in range(T) if kept[t])
    return total / count


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("loss", ["ppo", "gspo"])
@pytest.mark.parametrize("decoupled", [False, True])
@pytest.mark.parametrize("mode", [None, "truncate", "mask", "reject"])
def test_off_policy_correction(seed, loss, decoupled, mode):
    """Each tis_mode gives the same loss in the plain and the decoupled objective; ``mask`` weights the
    kept tokens by w (masked IS as slime's icepop_function / verl's IcePop), ``reject`` drops the
    tokens outside without weighting the others (verl's rollout_rs)."""
    rng = random.Random(seed)
    B, T = 3, 6
    mask = [[1, 1, 0, 0, 1, 1], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]]  # tool span, padding
    lp = [[rng.uniform(-3, -0.1) for _ in range(T)] for _ in range(B)]
    old = [[x + rng.uniform(-0.3, 0.3) for x in row] for row in lp]
    roll = [[x + rng.uniform(-0.9, 0.9) for x in row] for row in old]  # w from 0.4 to 2.5
    adv = [[rng.uniform(-2, 2)] * T for _ in range(B)]
    ref_lp = [[x + rng.uniform(-0.5, 0.5) for x in row] for row in lp]
    a = SimpleNamespace(
        policy_loss=loss,
        eps_clip=0.2,
        eps_clip_high=0.28,
        eps_clip_c=None,
        use_tis=mode is not None,
        tis_mode=mode or "truncate",
        tis_clip=1.5,
        tis_clip_low=0.6,
        kl_loss_type="k1",
        kl_loss_coef=0.1,
        entropy_coef=0.0,
        loss_agg_mode="token_mean",
    )
    t = lambda rows: torch.tensor(rows, dtype=torch.float32)  # noqa: E731
    x = ObjectiveInputs(
        log_probs=t(lp).requires_grad_(),
        old_log_probs=t(old),
        rollout_log_probs=t(roll),
        advantages=t(adv),
        mask=t(mask),
        entropy=torch.zeros(B, T),
        ref_log_probs=t(ref_lp),
    )
    got, stats = policy_objective(x, a, decoupled=decoupled, num_tokens=sum(map(sum, mask)), num_seqs=B, norm_length=T)
    want = ref_objective(
        lp,
        old,
        roll,
        adv,
        mask,
        ref_lp,
        mode=mode,
        decoupled=decoupled,
        loss=loss,
        clip=1.5,
        low=0.6,
        eps=0.2,
        eps_high=0.28,
        kl_coef=0.1,
    )
    assert got.item() == pytest.approx(want, rel=1e-5, abs=1e-6)
    if mode in ("mask", "reject"):
        outside = sum(
            1 for i in range(B) for j in range(T) if mask[i][j] and not 0.6 <= math.exp(old[i][j] - roll[i][j]) <= 1.5
        )
        assert 0 < outside < sum(map(sum, mask)) and stats["tis_masked"].item() == outside
    got.backward()
    assert torch.isfinite(x.log_probs.grad).all()


# ----------------------------------------------------------------------------- offline losses


def ref_trl_orpo(chosen, rejected, beta):
    """TRL's odds_ratio_loss term in float64: log_odds = (c - r) - (log1p(-exp(c)) - log1p(-exp(r))),
    loss = -beta log sigma(log_odds); and its derivatives in c and r (d/dx [x - log(1 - e^x)] =
    1 / (1 - e^x), with 1 - e^x = -expm1(x) to keep float64's precision)."""
    lo = (chosen - rejected) - (math.log1p(-math.exp(chosen)) - math.log1p(-math.exp(rejected)))
    loss = beta * (math.log1p(math.exp(-lo)) if lo > -30 else -lo)  # -log sigma(lo)
    dlo = -beta / (1.0 + math.exp(lo))  # d loss / d log_odds = -beta sigma(-lo)
    return loss, dlo / -math.expm1(chosen), -dlo / -math.expm1(rejected)


@pytest.mark.parametrize(
    "chosen,rejected",
    [(-1e-8, -0.5), (-1e-5, -1e-3), (-0.5, -1e-8), (-0.69, -0.7), (-2.0, -3.0), (-40.0, -0.01), (-1e-3, -1e-3)],
)
def test_orpo_matches_float64_reference_near_p_one(chosen, rejected):
    """Mean log p near 0 (p near 1): log(1 - p) as log1mexp matches TRL's formula evaluated in float64,
    value and gradient (fp32 log1p(-exp(x)) rounds exp(-1e-8) to 1)."""
    c = torch.tensor([chosen], requires_grad=True)
    r = torch.tensor([rejected], requires_grad=True)
    loss, _, _ = orpo_loss(PairLogps(c, r), beta=0.5)
    want, dc, dr = ref_trl_orpo(chosen, rejected, 0.5)
    assert loss.item() == pytest.approx(want, rel=1e-4, abs=1e-7)
    loss.sum().backward()
    assert [c.grad.item(), r.grad.item()] == pytest.approx([dc, dr], rel=1e-3, abs=1e-6)


def test_orpo_at_p_one_is_finite():
    c = torch.tensor([0.0, -0.2], requires_grad=True)
    loss, _, _ = orpo_loss(PairLogps(c[:1], c[1:]), beta=1.0)
    loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(c.grad).all()


def test_sequence_logps_selects_masked_positions():
    """-inf (or NaN) at a masked position: the sum and mean over the mask's tokens, a finite gradient."""
    lp = torch.tensor([[-1.0, -2.0, float("-inf")], [-0.5, float("nan"), -1.5]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])
    assert sequence_logps(lp, mask, mean=False).tolist() == [-3.0, -2.0]
    means = sequence_logps(lp, mask, mean=True)
    assert means.tolist() == [-1.5, -1.0]
    means.sum().backward()
    assert lp.grad.tolist() == [[0.5, 0.5, 0.0], [0.5, 0.0, 0.5]]
