"""Advantages, losses, KL estimators, aggregation and pass@k against hand-computed values."""

import math

import pytest
import torch

from reinforge.algo.advantages import grpo_advantages
from reinforge.algo.losses import aggregate, entropy_from_logits, kl_penalty, ppo_clip_loss
from reinforge.algo.passk import pass_at_k
from reinforge.utils.triton import triton_available

needs_cuda = pytest.mark.skipif(not triton_available("cuda"), reason="the fused log-prob kernels run on CUDA")


def test_grpo_advantages_std_normalised():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]])
    adv = grpo_advantages(r, std_normalization=True, eps=0.0 + 1e-6)
    # group 0: mean 0.5, unbiased std sqrt(1/3) = 0.57735
    expected = 0.5 / math.sqrt(1 / 3)
    assert adv[0].tolist() == pytest.approx([expected, -expected, -expected, expected], rel=1e-5)
    assert adv[1].tolist() == [0.0, 0.0, 0.0, 0.0]  # equal rewards: no signal


def test_grpo_advantages_without_std():
    r = torch.tensor([[3.0, 1.0, 2.0]])
    assert grpo_advantages(r, std_normalization=False).tolist() == [[1.0, -1.0, 0.0]]


def test_grpo_single_sample_group_is_zero():
    assert grpo_advantages(torch.tensor([[5.0], [1.0]])).tolist() == [[0.0], [0.0]]


def test_grpo_rejects_flat_rewards():
    with pytest.raises(ValueError, match="num_groups"):
        grpo_advantages(torch.tensor([1.0, 0.0]))


def test_ppo_clip_loss_values():
    old = torch.zeros(1, 4)
    lp = torch.log(torch.tensor([[1.5, 0.5, 1.1, 0.7]]))
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    loss, ratio, clipped = ppo_clip_loss(lp, old, adv, eps_clip=0.2, eps_clip_high=0.3)
    # token 0: ratio 1.5, A>0 -> min(1.5, 1.3) = 1.3 -> loss -1.3, clipped
    # token 1: ratio 0.5, A>0 -> min(0.5, 0.8) = 0.5 -> loss -0.5, not clipped
    # token 2: ratio 1.1, A<0 -> min(-1.1, -1.1) -> loss 1.1, not clipped
    # token 3: ratio 0.7, A<0 -> min(-0.7, -0.8) = -0.8 -> loss 0.8, clipped
    assert loss[0].tolist() == pytest.approx([-1.3, -0.5, 1.1, 0.8], rel=1e-5)
    assert ratio[0].tolist() == pytest.approx([1.5, 0.5, 1.1, 0.7], rel=1e-5)
    assert clipped[0].tolist() == [True, False, False, True]


def test_ppo_clip_symmetric_default():
    lp = torch.log(torch.tensor([[1.25]]))
    loss, _, _ = ppo_clip_loss(lp, torch.zeros(1, 1), torch.ones(1, 1), eps_clip=0.2)
    assert loss.item() == pytest.approx(-1.2)


def test_ppo_gradient_is_zero_when_clipped():
    lp = torch.log(torch.tensor([[1.5]])).requires_grad_()
    loss, _, _ = ppo_clip_loss(lp, torch.zeros(1, 1), torch.ones(1, 1), eps_clip=0.2)
    loss.sum().backward()
    assert lp.grad.item() == 0.0


def test_kl_estimators():
    lp = torch.tensor([math.log(0.5)])
    ref = torch.tensor([math.log(0.25)])
    log_r = math.log(2.0)
    assert kl_penalty(lp, ref, "k1").item() == pytest.approx(log_r)
    assert kl_penalty(lp, ref, "k2").item() == pytest.approx(0.5 * log_r**2)
    assert kl_penalty(lp, ref, "k3").item() == pytest.approx(0.5 - 1 + log_r)
    assert kl_penalty(lp, ref, "low_var_kl").item() == pytest.approx(0.5 - 1 + log_r)
    assert kl_penalty(lp, lp, "k3").item() == 0.0
    with pytest.raises(ValueError, match="unknown kl type"):
        kl_penalty(lp, ref, "k9")


def test_low_var_kl_is_clamped():
    assert kl_penalty(torch.tensor([-30.0]), torch.tensor([0.0]), "low_var_kl").item() == 10.0


def test_k3_is_unbiased_kl():
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(6), 0)
    q = torch.softmax(torch.randn(6), 0)
    exact = float((p * (p.log() - q.log())).sum())
    x = torch.multinomial(p, 200_000, replacement=True)
    est = kl_penalty(p.log()[x], q.log()[x], "k3").mean().item()
    assert est == pytest.approx(exact, abs=0.01)


def test_entropy():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25]]))
    assert entropy_from_logits(logits).item() == pytest.approx(-(0.5 * math.log(0.5) + 0.5 * math.log(0.25)))


def test_aggregation_modes():
    v = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    m = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert aggregate(v, m, "token_mean").item() == pytest.approx(10 / 4)
    assert aggregate(v, m, "seq_mean_token_sum").item() == pytest.approx((6 + 4) / 2)
    assert aggregate(v, m, "seq_mean_token_mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate(v, m, "token_mean", num_tokens=8).item() == pytest.approx(10 / 8)
    assert aggregate(v, m, "seq_mean_token_sum", num_seqs=4).item() == pytest.approx(10 / 4)
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aggregate(v, m, "mean")


def test_token_mean_micro_batches_add_up():
    torch.manual_seed(0)
    v, m = torch.randn(4, 5), (torch.rand(4, 5) > 0.3).float()
    whole = aggregate(v, m, "token_mean")
    parts = aggregate(v[:2], m[:2], "token_mean", num_tokens=m.sum()) + aggregate(
        v[2:], m[2:], "token_mean", num_tokens=m.sum()
    )
    assert parts.item() == pytest.approx(whole.item(), rel=1e-6)


def test_pass_at_k():
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 4, 2) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    # 1 - C(3, 2) / C(5, 2) = 1 - 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(10, 3, 10) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


# --------------------------------------------------------------------------- issue 4 estimators / losses
from reinforge.algo.advantages import (
    gae_advantages,
    masked_whiten,
    reinforce_plus_plus_returns,  # noqa: E402
    rloo_advantages,
)
from reinforge.algo.losses import clipped_value_loss, gspo_ratio  # noqa: E402


def test_rloo_leave_one_out():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    # sample 0: 1 - mean(0, 0, 1) = 2/3; sample 1: 0 - mean(1, 0, 1) = -2/3
    assert rloo_advantages(r)[0].tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    assert rloo_advantages(torch.tensor([[3.0]])).tolist() == [[0.0]]


def test_gae_hand_computed():
    # one sequence of 3 tokens, reward 1 at the end, values 0.5, 0.2, 0.4; gamma 0.9, lam 0.8
    r = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    v = torch.tensor([[0.5, 0.2, 0.4, 9.0]])  # the 4th position is padding
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    adv, ret = gae_advantages(r, v, m, gamma=0.9, lam=0.8)
    d2 = 1.0 - 0.4
    d1 = 0.0 + 0.9 * 0.4 - 0.2
    d0 = 0.0 + 0.9 * 0.2 - 0.5
    a2, a1 = d2, d1 + 0.72 * d2
    a0 = d0 + 0.72 * a1
    assert adv[0].tolist() == pytest.approx([a0, a1, a2, 0.0], abs=1e-6)
    assert ret[0].tolist() == pytest.approx([a0 + 0.5, a1 + 0.2, a2 + 0.4, 0.0], abs=1e-6)


def test_gae_lambda_one_gamma_one_is_return_minus_value():
    r = torch.tensor([[0.0, 0.0, 2.0]])
    v = torch.tensor([[0.3, 0.1, 0.7]])
    adv, ret = gae_advantages(r, v, torch.ones(1, 3), gamma=1.0, lam=1.0)
    assert adv[0].tolist() == pytest.approx([1.7, 1.9, 1.3])
    assert ret[0].tolist() == pytest.approx([2.0, 2.0, 2.0])


def test_reinforce_plus_plus_returns_and_whiten():
    r = torch.tensor([[0.1, 0.0, 1.0], [0.0, 2.0, 0.0]])
    m = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    g = reinforce_plus_plus_returns(r, m, gamma=0.5)
    assert g[0].tolist() == pytest.approx([0.1 + 0.5 * 0.5, 0.5, 1.0])
    assert g[1].tolist() == pytest.approx([1.0, 2.0, 0.0])
    w = masked_whiten(g, m)
    vals = torch.tensor([0.35, 0.5, 1.0, 1.0, 2.0])
    expected = ((vals - vals.mean()) / vals.std()).tolist()
    assert w[m.bool()].tolist() == pytest.approx(expected, rel=1e-5)
    assert w[1, 2].item() == 0.0


def test_dual_clip():
    lp = torch.log(torch.tensor([[5.0, 5.0]]))
    adv = torch.tensor([[-1.0, 1.0]])
    loss, _, clipped = ppo_clip_loss(lp, torch.zeros(1, 2), adv, eps_clip=0.2, clip_c=3.0)
    # A<0, ratio 5: PPO loss max(5, 1.2) = 5, bounded by clip_c * |A| = 3; A>0: -min(5, 1.2) = -1.2
    assert loss[0].tolist() == pytest.approx([3.0, -1.2])
    assert clipped[0].tolist() == [True, True]


def test_gspo_ratio_is_sequence_level_with_token_gradients():
    lp = torch.log(torch.tensor([[0.5, 0.2, 0.9]])).requires_grad_()
    old = torch.log(torch.tensor([[0.25, 0.4, 0.9]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    ratio = gspo_ratio(lp, old, mask)
    s = math.exp((math.log(2.0) + math.log(0.5)) / 2)  # geometric mean of 2 and 0.5 = 1
    assert ratio[0, :2].tolist() == pytest.approx([s, s])
    (ratio[0, 0]).backward()
    assert lp.grad[0].tolist() == pytest.approx([s, 0.0, 0.0])


def test_clipped_value_loss():
    v = torch.tensor([[1.0, 0.0]])
    old = torch.tensor([[0.5, 0.5]])
    ret = torch.tensor([[0.0, 1.0]])
    loss, clipped = clipped_value_loss(v, old, ret, value_clip=0.2)
    # token 0: (1-0)^2=1 vs clip(1, 0.3, 0.7)=0.7 -> 0.49: max 1 -> 0.5
    # token 1: (0-1)^2=1 vs clip(0 -> 0.3) -> 0.49: max 1 -> 0.5
    assert loss[0].tolist() == pytest.approx([0.5, 0.5])
    v2 = torch.tensor([[0.55]])
    loss2, clipped2 = clipped_value_loss(v2, torch.tensor([[0.5]]), torch.tensor([[2.0]]), value_clip=0.01)
    # unclipped (0.55-2)^2 = 2.1025, clipped value 0.51 -> (0.51-2)^2 = 2.2201 (larger, taken)
    assert loss2.item() == pytest.approx(0.5 * 2.2201) and clipped2.item()


def test_seq_mean_token_sum_norm():
    v = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    m = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert aggregate(v, m, "seq_mean_token_sum_norm", norm_length=10).item() == pytest.approx((0.6 + 0.4) / 2)
    with pytest.raises(ValueError, match="norm_length"):
        aggregate(v, m, "seq_mean_token_sum_norm")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "chunk, device, vocab",
    [
        (1, "cpu", 67),
        (5, "cpu", 67),
        (4096, "cpu", 67),
        # CUDA: the fused Triton kernels (algo/fused_logprobs.py), within one block and over 3 blocks of 4096
        pytest.param(5, "cuda", 67, marks=needs_cuda),
        pytest.param(5, "cuda", 3 * 4096 + 17, marks=needs_cuda),
    ],
)
def test_token_log_probs_match_log_softmax(dtype, chunk, device, vocab):
    """Values and gradients (log-prob and entropy terms) equal autograd through the fp32 expression,
    for the chunked PyTorch path (CPU) and the fused kernels (CUDA)."""
    from reinforge.algo.logprobs import token_log_probs

    g = torch.Generator().manual_seed(0)
    x = (torch.randn(23, vocab, generator=g) * 4).to(dtype).to(device).requires_grad_()
    t = torch.randint(0, vocab, (23,), generator=g).to(device)
    w_lp, w_ent = torch.randn(23, generator=g).to(device), torch.randn(23, generator=g).to(device)
    lp, ent = token_log_probs(x, t, 0.8, chunk=chunk, with_entropy=True)
    ((lp * w_lp).sum() + (ent * w_ent).sum()).backward()
    ours = x.grad.clone()
    x.grad = None
    z = x.float() / 0.8
    ref_lp = torch.log_softmax(z, -1).gather(-1, t[:, None]).squeeze(-1)
    ref_ent = entropy_from_logits(z)
    ((ref_lp * w_lp).sum() + (ref_ent * w_ent).sum()).backward()
    assert ours.dtype == dtype
    assert torch.allclose(lp, ref_lp, atol=1e-5) and torch.allclose(ent, ref_ent, atol=1e-5)
    assert torch.allclose(ours.float(), x.grad.float(), atol=1e-5 if dtype == torch.float32 else 1e-2)
    # log-probs alone (entropy unused): no entropy term in the gradient
    x.grad = None
    token_log_probs(x, t, 0.8, chunk=chunk)[0].sum().backward()
    only = x.grad.clone()
    x.grad = None
    torch.log_softmax(x.float() / 0.8, -1).gather(-1, t[:, None]).sum().backward()
    assert torch.allclose(only.float(), x.grad.float(), atol=1e-5 if dtype == torch.float32 else 1e-2)
    with pytest.raises(ValueError, match="chunk"):
        token_log_probs(x, t, chunk=0)
