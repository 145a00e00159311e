"""Offline objectives against hand-computed values (the formulas of their papers)."""

import math

import pytest
import torch

from reinforge.algo.preference import (
    OFFLINE_METHODS,
    PairLogps,
    bradley_terry_loss,
    cpo_loss,
    dpo_loss,
    ipo_loss,
    kto_loss,
    orpo_loss,
    sequence_logps,
    simpo_loss,
)


def sig(x):
    return 1 / (1 + math.exp(-x))


def pair():
    return PairLogps(
        torch.tensor([-3.0, -5.0]), torch.tensor([-4.0, -2.0]), torch.tensor([-3.5, -4.0]), torch.tensor([-3.5, -3.0])
    )


def test_dpo_and_label_smoothing():
    losses, rc, rr = dpo_loss(pair(), beta=0.5)
    # pair 0: (−3 − −3.5) − (−4 − −3.5) = 1.0 ; pair 1: (−5 − −4) − (−2 − −3) = −2.0
    assert losses.tolist() == pytest.approx([-math.log(sig(0.5)), -math.log(sig(-1.0))], rel=1e-6)
    assert rc.tolist() == pytest.approx([0.25, -0.5]) and rr.tolist() == pytest.approx([-0.25, 0.5])
    smooth, _, _ = dpo_loss(pair(), beta=0.5, label_smoothing=0.1)
    assert smooth[0].item() == pytest.approx(-0.9 * math.log(sig(0.5)) - 0.1 * math.log(sig(-0.5)), rel=1e-6)


def test_ipo():
    losses, _, _ = ipo_loss(pair(), beta=0.25)  # target 1 / (2 beta) = 2
    assert losses.tolist() == pytest.approx([(1.0 - 2) ** 2, (-2.0 - 2) ** 2])


def test_cpo_simpo_orpo_are_reference_free():
    lp = PairLogps(torch.tensor([-1.0]), torch.tensor([-2.0]))
    assert cpo_loss(lp, beta=0.1)[0].item() == pytest.approx(-math.log(sig(0.1)), rel=1e-6)
    assert simpo_loss(lp, beta=2.0, gamma=0.5)[0].item() == pytest.approx(-math.log(sig(2.0 - 0.5)), rel=1e-6)
    p_w, p_l = math.exp(-1.0), math.exp(-2.0)
    log_odds = math.log(p_w / (1 - p_w)) - math.log(p_l / (1 - p_l))
    assert orpo_loss(lp, beta=0.1)[0].item() == pytest.approx(-0.1 * math.log(sig(log_odds)), rel=1e-5)
    with pytest.raises(ValueError, match="reference"):
        dpo_loss(lp, beta=0.1)


def test_bradley_terry_with_margin():
    loss = bradley_terry_loss(torch.tensor([2.0]), torch.tensor([0.5]), torch.tensor([1.0]))
    assert loss.item() == pytest.approx(-math.log(sig(0.5)), rel=1e-6)


def test_kto():
    logps, ref = torch.tensor([-1.0, -1.0]), torch.tensor([-2.0, -2.0])
    losses, rewards = kto_loss(
        logps,
        ref,
        torch.tensor([True, False]),
        torch.tensor(0.25),
        beta=0.5,
        desirable_weight=1.0,
        undesirable_weight=2.0,
    )
    assert losses.tolist() == pytest.approx([1 - sig(0.5 * 0.75), 2 * (1 - sig(0.5 * -0.75))], rel=1e-6)
    assert rewards.tolist() == pytest.approx([0.5, 0.5])
    negative_kl, _ = kto_loss(logps, ref, torch.tensor([True, True]), torch.tensor(-3.0), beta=0.5)
    assert negative_kl[0].item() == pytest.approx(1 - sig(0.5), rel=1e-6)  # z is clamped at 0


def test_sequence_logps_sum_and_mean():
    lp = torch.tensor([[-1.0, -2.0, -9.0], [-3.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert sequence_logps(lp, mask, mean=False).tolist() == [-3.0, -3.0]
    assert sequence_logps(lp, mask, mean=True).tolist() == [-1.5, -3.0]


def test_registry_properties():
    assert OFFLINE_METHODS.names() == ["sft", "rm", "dpo", "ipo", "cpo", "simpo", "orpo", "kto", "gkd"]
    assert {m for m in OFFLINE_METHODS if OFFLINE_METHODS.info(m).get("reference")} == {"dpo", "ipo", "kto"}
    assert {m for m in OFFLINE_METHODS if OFFLINE_METHODS.info(m).get("length_normalized")} == {"ipo", "simpo", "orpo"}
