"""Offline objectives: SFT, reward-model, pairwise preference and KTO losses (pure functions),
and :data:`OFFLINE_METHODS`, the registry ``offline.method`` chooses from.

Sequence log-probabilities are sums over a response's tokens (``logps``) unless a method is
registered ``length_normalized`` (then they are means over its tokens: IPO, SimPO, ORPO, as in
TRL). Every pairwise loss returns per-pair values, so that the trainer can average them over the
global batch however it is split across micro-batches and ranks.

Each registered entry is the method's objective, ``fn(batch: OfflineBatch, offline_cfg) -> (loss,
stats)``, the one function the trainer calls per micro-batch. Registration properties (read by the
offline trainer):

* ``data``: ``messages`` (SFT), ``pairs`` (prompt / chosen / rejected) or ``unpaired`` (KTO);
* ``model``: ``policy`` (a causal LM) or ``reward`` (a scalar head);
* ``reference``: needs reference log-probs (DPO, IPO, KTO);
* ``teacher``: needs a teacher's logits (GKD: ``distill.teacher_path``);
* ``length_normalized``: sequence log-probs are token means.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from .masking import masked_select
from .registries import OFFLINE_METHODS as OFFLINE_METHODS  # names in .registries (read by the config, no torch)


@dataclass
class PairLogps:
    """Sequence log-probs of P pairs (all [P] float32).

    ``chosen`` / ``rejected``: the policy's (with gradient); ``ref_chosen`` / ``ref_rejected``:
    the reference model's (no gradient), or None for reference-free methods.
    """

    chosen: torch.Tensor
    rejected: torch.Tensor
    ref_chosen: torch.Tensor | None = None
    ref_rejected: torch.Tensor | None = None


def _smoothed_sigmoid_loss(logits: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """-(1 - e) log sigma(x) - e log sigma(-x): the conservative DPO loss (Mitchell 2023, "A note on
    DPO with noisy preferences"; TRL's ``label_smoothing``); e = 0 is the plain logistic loss."""
    return -(1.0 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)


def _ref_margin(lp: PairLogps) -> tuple[torch.Tensor, torch.Tensor]:
    if lp.ref_chosen is None or lp.ref_rejected is None:
        raise ValueError("this loss needs the reference model's log-probs")
    return lp.chosen - lp.ref_chosen, lp.rejected - lp.ref_rejected


def dpo_loss(
    lp: PairLogps, beta: float, label_smoothing: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DPO (Rafailov et al. 2023, eq. 7), with label smoothing (cDPO).

    r_w = beta * (log pi(y_w) - log pi_ref(y_w)), r_l likewise; loss = -log sigma(r_w - r_l).

    Returns:
        (losses [P], chosen rewards r_w [P], rejected rewards r_l [P]); rewards detached.
    """
    dc, dr = _ref_margin(lp)
    losses = _smoothed_sigmoid_loss(beta * (dc - dr), label_smoothing)
    return losses, beta * dc.detach(), beta * dr.detach()


def ipo_loss(lp: PairLogps, beta: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """IPO (Azar et al. 2023, "A General Theoretical Paradigm...", eq. 17): the squared distance of
    h = (log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l)) from 1 / (2 beta), with
    length-normalised log-probs (as TRL's ``loss_type="ipo"``)."""
    dc, dr = _ref_margin(lp)
    losses = (dc - dr - 1.0 / (2.0 * beta)) ** 2
    return losses, beta * dc.detach(), beta * dr.detach()


def cpo_loss(
    lp: PairLogps, beta: float, label_smoothing: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CPO's preference term (Xu et al. 2024, "Contrastive Preference Optimization", eq. 3):
    -log sigma(beta * (log pi(y_w) - log pi(y_l))), reference-free; the trainer adds
    ``cpo_alpha`` times the NLL of the chosen responses (eq. 5)."""
    losses = _smoothed_sigmoid_loss(beta * (lp.chosen - lp.rejected), label_smoothing)
    return losses, beta * lp.chosen.detach(), beta * lp.rejected.detach()


def simpo_loss(
    lp: PairLogps, beta: float, gamma: float, label_smoothing: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SimPO (Meng et al. 2024, eq. 6): -log sigma(beta * (mean log pi(y_w) - mean log pi(y_l)) - gamma),
    with token-mean log-probs and no reference model."""
    losses = _smoothed_sigmoid_loss(beta * (lp.chosen - lp.rejected) - gamma, label_smoothing)
    return losses, beta * lp.chosen.detach(), beta * lp.rejected.detach()


LOG1MEXP_MAX = -1e-30
""":func:`log1mexp` clamps its argument to at most this: log(1 - e^x) is -inf at x = 0 (p = 1, reached
in fp32 when every token's probability rounds to 1); at -1e-30 it is -69.1, finite with a finite gradient."""


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x <= 0, accurate over the whole range (Maechler 2012, "Accurately Computing
    log(1 - exp(-|a|))", eq. 7): ``log(-expm1(x))`` for x > -ln 2, ``log1p(-exp(x))`` otherwise.

    The naive ``log1p(-exp(x))`` (TRL's ORPO before January 2026) rounds ``exp(x)`` to 1 near x = 0 in fp32
    (x > -6e-8 gives log(0) = -inf); ``expm1`` keeps x's relative precision there. ``x`` is first
    clamped to at most :data:`LOG1MEXP_MAX` (so x = 0 gives a finite value and gradient).

    Args:
        x: float tensor of log-probabilities (<= 0), any shape.
    Returns:
        a tensor of ``x``'s shape and dtype.
    """
    x = x.clamp(max=LOG1MEXP_MAX)
    near_zero = x > -0.6931471805599453
    # each branch evaluated where it is accurate; the other side's argument is replaced so that
    # neither branch produces a non-finite value (whose gradient would be NaN through where)
    small = torch.log(-torch.expm1(torch.where(near_zero, x, torch.full_like(x, -1.0))))
    large = torch.log1p(-torch.exp(torch.where(near_zero, torch.full_like(x, -1.0), x)))
    return torch.where(near_zero, small, large)


def orpo_loss(lp: PairLogps, beta: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ORPO's odds-ratio term (Hong et al. 2024, eq. 6-7), weighted by lambda = ``beta``:
    log odds(y) = log p - log(1 - p) with p = exp(mean log pi(y));
    loss = -lambda * log sigma(log odds(y_w) - log odds(y_l)); the trainer adds the NLL of the chosen
    responses (the SFT term, eq. 6). Rewards are ``beta * mean log pi`` (TRL's).

    log(1 - p) is :func:`log1mexp`, accurate in fp32 near p = 1 (mean log p = -1e-8: log(1 - p) = -18.42,
    where the naive fp32 ``log1p(-exp(.))`` gives -inf). TRL's ``odds_ratio_loss`` computed the naive form
    until January 2026 and uses a ``log1mexp`` of its own since; the values agree in exact arithmetic.

    Args:
        lp: [P] token-mean log-probs (``chosen``, ``rejected``).
    Returns:
        (losses [P], chosen rewards [P], rejected rewards [P]); rewards detached.
    """
    log_odds = (lp.chosen - lp.rejected) - (log1mexp(lp.chosen) - log1mexp(lp.rejected))
    losses = -beta * F.logsigmoid(log_odds)
    return losses, beta * lp.chosen.detach(), beta * lp.rejected.detach()


def bradley_terry_loss(
    chosen: torch.Tensor, rejected: torch.Tensor, margin: torch.Tensor | None = None
) -> torch.Tensor:
    """Pairwise reward-model loss (Ouyang et al. 2022, eq. 1; Bradley & Terry 1952):
    -log sigma(r(x, y_w) - r(x, y_l) - m), with an optional per-pair margin m (Touvron et al. 2023,
    Llama 2, eq. 2). Inputs [P]; returns losses [P]."""
    diff = chosen - rejected
    if margin is not None:
        diff = diff - margin
    return -F.logsigmoid(diff)


def kto_loss(
    logps: torch.Tensor,
    ref_logps: torch.Tensor,
    desirable: torch.Tensor,
    kl: torch.Tensor,
    beta: float,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """KTO (Ethayarajh et al. 2024, eq. 8), per example.

    r = log pi(y|x) - log pi_ref(y|x); z = ``kl``, the batch's estimate of KL(pi || pi_ref) from
    mismatched (x, y') pairs, clamped at 0 and not differentiated. Desirable examples lose
    lambda_D * (1 - sigma(beta (r - z))), undesirable ones lambda_U * (1 - sigma(beta (z - r))).

    Args:
        logps, ref_logps: [B] sequence log-probs; desirable: [B] bool; kl: scalar.
    Returns:
        (losses [B], rewards beta * r [B] detached).
    """
    r = logps - ref_logps
    z = kl.detach().clamp(min=0)
    loss_d = desirable_weight * (1 - torch.sigmoid(beta * (r - z)))
    loss_u = undesirable_weight * (1 - torch.sigmoid(beta * (z - r)))
    return torch.where(desirable, loss_d, loss_u), beta * r.detach()


def sequence_logps(token_logps: torch.Tensor, mask: torch.Tensor, mean: bool) -> torch.Tensor:
    """Sequence log-probs: sums (or means) of the token log-probs over the mask's tokens.

    The tokens outside the mask are selected out (``torch.where``), not multiplied by 0: a -inf or
    NaN there (a masked position's log-prob) does not reach the sum or its gradient.

    Args:
        token_logps: [B, T] float token log-probs.
        mask: [B, T] 0/1 (any dtype), the response tokens.
        mean: divide by each row's token count (at least 1).
    Returns:
        [B] of ``token_logps``' dtype.
    """
    total = masked_select(token_logps, mask).sum(-1)
    return total / (mask != 0).sum(-1).clamp(min=1).to(total.dtype) if mean else total


# ---------------------------------------------------------------------------- registered methods
# Each method's registered entry is the objective the offline trainer calls on every micro-batch:
# fn(batch: OfflineBatch, offline_cfg) -> (loss: scalar with gradient, stats: token / example sums).


@dataclass
class OfflineBatch:
    """One micro-batch's per-row values (rows: pairs interleaved chosen, rejected; or single examples).

    Attributes:
        examples: examples (pairs) in the whole optimizer step, the losses' denominator.
        nll_tokens: response tokens in the whole step (the token-mean NLL's denominator).
        seq_logps: [B] the policy's sequence log-probs (sums, or means for ``length_normalized``);
            empty for a reward model.
        token_nll: [B] the policy's summed token NLL per row; empty for a reward model.
        ref_logps: [B] the reference's sequence log-probs, or None.
        rewards: [B] a reward model's scores (``rm``).
        margin: [P] per-pair margins (``rm`` with ``offline.margin_key``), or None.
        desirable: [B] bool (KTO); kl: scalar, KTO's z.
    """

    examples: float
    nll_tokens: float
    seq_logps: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    token_nll: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    ref_logps: torch.Tensor | None = None
    rewards: torch.Tensor | None = None
    margin: torch.Tensor | None = None
    desirable: torch.Tensor | None = None
    kl: torch.Tensor | None = None
    divergence: torch.Tensor | None = None  # [B] GKD: each row's summed per-token generalized JSD to the teacher


def pair_stats(
    rc: torch.Tensor, rr: torch.Tensor, lc: torch.Tensor | None, lr: torch.Tensor | None, nll: float | None
) -> dict[str, float]:
    """Sums over pairs: implicit rewards, their accuracy and margin, the sequence log-probs, the NLL."""
    out = {
        "rewards/chosen": float(rc.sum()),
        "rewards/rejected": float(rr.sum()),
        "rewards/accuracy": float((rc > rr).float().sum()),
        "rewards/margin": float((rc - rr).sum()),
    }
    if lc is not None and lr is not None:
        out["logps/chosen"], out["logps/rejected"] = float(lc.sum()), float(lr.sum())
    if nll is not None:
        out["nll"] = nll
    return out


def sft_objective(b: OfflineBatch, o: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """SFT: the token-mean NLL of the responses over the step."""
    return b.token_nll.sum() / max(b.nll_tokens, 1.0), {"nll": float(b.token_nll.detach().sum())}


def gkd_objective(b: OfflineBatch, o: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """GKD with the dataset's responses (TRL ``GKDTrainer`` with ``lmbda`` 0): the token mean over the step of
    the generalized JSD between the teacher's and the student's next-token distributions
    (:func:`~reinforge.algo.distill.generalized_jsd`, ``offline.gkd_beta``), as TRL's ``batchmean``."""
    assert b.divergence is not None, "the GKD objective needs OfflineBatch.divergence"
    return b.divergence.sum() / max(b.nll_tokens, 1.0), {
        "nll": float(b.token_nll.detach().sum()),
        "jsd": float(b.divergence.detach().sum()),
    }


def reward_model_objective(b: OfflineBatch, o: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """Reward model: :func:`bradley_terry_loss` averaged over the step's pairs."""
    assert b.rewards is not None, "the reward model objective needs OfflineBatch.rewards"
    chosen, rejected = b.rewards[0::2], b.rewards[1::2]
    losses = bradley_terry_loss(chosen, rejected, b.margin)
    return losses.sum() / b.examples, pair_stats(chosen.detach(), rejected.detach(), None, None, None)


def pairwise_objective(
    loss: Callable[[PairLogps, Any], tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    nll_weight: Callable[[Any], float] | None = None,
) -> Callable[..., Any]:
    """A pairwise preference loss (``loss(lp, offline_cfg) -> (losses [P], chosen rewards, rejected
    rewards)``) averaged over the step's pairs, plus ``nll_weight(offline_cfg)`` times the token-mean
    NLL of the chosen responses (CPO's behaviour-cloning term, ORPO's SFT term)."""

    def objective(b: OfflineBatch, o: Any) -> tuple[torch.Tensor, dict[str, float]]:
        lp = PairLogps(b.seq_logps[0::2], b.seq_logps[1::2])
        if b.ref_logps is not None:
            lp.ref_chosen, lp.ref_rejected = b.ref_logps[0::2], b.ref_logps[1::2]
        losses, rc, rr = loss(lp, o)
        total = losses.sum() / b.examples
        nll_chosen = b.token_nll[0::2].sum()
        if nll_weight is not None:
            total = total + nll_weight(o) * nll_chosen / max(b.nll_tokens, 1.0)
        return total, pair_stats(rc, rr, lp.chosen.detach(), lp.rejected.detach(), float(nll_chosen.detach()))

    return objective


def kto_objective(b: OfflineBatch, o: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """KTO: :func:`kto_loss` averaged over the step's examples."""
    assert b.ref_logps is not None and b.desirable is not None and b.kl is not None, (
        "KTO needs ref_logps, desirable, kl"
    )
    losses, rewards = kto_loss(
        b.seq_logps, b.ref_logps, b.desirable, b.kl, o.beta, o.kto_desirable_weight, o.kto_undesirable_weight
    )
    d = b.desirable.float()
    return losses.sum() / b.examples, {
        "rewards/desirable": float((rewards * d).sum()),
        "rewards/undesirable": float((rewards * (1 - d)).sum()),
        "logps": float(b.seq_logps.detach().sum()),
    }


# the objectives of OFFLINE_METHODS (registered by name, with their properties, in .registries)
dpo_objective = pairwise_objective(lambda lp, o: dpo_loss(lp, o.beta, o.label_smoothing))
ipo_objective = pairwise_objective(lambda lp, o: ipo_loss(lp, o.beta))
cpo_objective = pairwise_objective(
    lambda lp, o: cpo_loss(lp, o.beta, o.label_smoothing), nll_weight=lambda o: o.cpo_alpha
)
simpo_objective = pairwise_objective(lambda lp, o: simpo_loss(lp, o.beta, o.simpo_gamma, o.label_smoothing))
orpo_objective = pairwise_objective(lambda lp, o: orpo_loss(lp, o.beta), nll_weight=lambda o: 1.0)
