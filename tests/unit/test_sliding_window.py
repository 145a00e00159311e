"""Sliding-window attention and attention sinks in the shared attention code (trainer side): the plain
SDPA path, the packed rows' path, and the per-layer windows a config gives (``ModelArgs.layer_windows``).
The engine's paths are checked against the trainer in the family tests (tests/integration/test_gemma3.py)."""

import pytest
import torch

from reinforge.models.args import layer_windows
from reinforge.models.packing import PackedAttention
from reinforge.models.sdpa import causal_mask, kernel_args, sdpa


def reference_attention(q, k, v, window=0, sinks=None, scale=None, q_pos=None, k_pos=None):
    """Softmax attention written out: q [T, H, D], k, v [S, KVH, D]; positions default to 0..T-1 / 0..S-1."""
    T, H, D = q.shape
    S, KVH, _ = k.shape
    q_pos = torch.arange(T) if q_pos is None else q_pos
    k_pos = torch.arange(S) if k_pos is None else k_pos
    kk, vv = k.repeat_interleave(H // KVH, 1), v.repeat_interleave(H // KVH, 1)
    scores = torch.einsum("thd,shd->hts", q, kk) * (D**-0.5 if scale is None else scale)
    visible = k_pos[None, :] <= q_pos[:, None]
    if window:
        visible &= k_pos[None, :] > q_pos[:, None] - window
    e = scores.masked_fill(~visible, float("-inf")).exp()
    denom = e.sum(-1, keepdim=True)
    if sinks is not None:
        denom = denom + sinks.exp()[:, None, None]
    return torch.einsum("hts,shd->thd", e / denom, vv)


def _qkv(T=11, H=4, KVH=2, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(1, T, H, D, generator=g),
        torch.randn(1, T, KVH, D, generator=g),
        torch.randn(1, T, KVH, D, generator=g),
    )


def test_causal_mask_window_is_transformers_sliding_window():
    """Window w: query i sees keys i - w < j <= i (w keys, its own included), as transformers'
    ``sliding_window_causal_mask_function``."""
    from transformers.masking_utils import sliding_window_causal_mask_function

    fn = sliding_window_causal_mask_function(3)
    t = torch.tensor
    ref = torch.tensor([[bool(fn(t(0), t(0), t(i), t(j))) for j in range(7)] for i in range(7)])
    assert torch.equal(causal_mask(7, 7, window=3), ref)
    assert causal_mask(7, 7, window=3).sum(1).tolist() == [1, 2, 3, 3, 3, 3, 3]


@pytest.mark.parametrize("window", [0, 1, 4])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_sdpa_window_and_sinks_equal_the_written_out_softmax(window, with_sinks):
    q, k, v = _qkv()
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], requires_grad=True) if with_sinks else None
    mask = causal_mask(11, 11, window=window) if window else None
    out = sdpa(q, k, v, mask, scale=0.4, sinks=sinks)
    ref_sinks = sinks.detach().clone().requires_grad_(True) if with_sinks else None
    ref = reference_attention(q[0], k[0], v[0], window, ref_sinks, scale=0.4)
    torch.testing.assert_close(out[0], ref, atol=1e-6, rtol=1e-5)
    if with_sinks:  # the sinks learn: their gradient is the written-out softmax's
        out.square().sum().backward()
        ref.square().sum().backward()
        torch.testing.assert_close(sinks.grad, ref_sinks.grad, atol=1e-6, rtol=1e-5)
        assert sinks.grad.abs().min() > 0


@pytest.mark.parametrize("masked", [False, True])
def test_kernel_args_give_the_same_attention(masked):
    """The GPU path's shapes (models/sdpa.kernel_args: a narrower v padded, grouped-query k and v expanded under
    a mask, so SDPA's fused kernels accept them) give the attention of the plain grouped-query call."""
    import torch.nn.functional as F

    q, k, v = _qkv(D=8)
    v = v[..., :6]  # value heads narrower than q and k (multi-head latent attention)
    mask = causal_mask(11, 11, window=4) if masked else None
    (qq, kk, vv), gqa = kernel_args(q, k, v, mask)
    assert vv.shape[-1] == 8 and gqa is not masked and kk.shape[1] == (4 if masked else 2)
    out = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, is_causal=mask is None, enable_gqa=gqa)
    ref = sdpa(q, k, v, mask)
    torch.testing.assert_close(out[..., :6].transpose(1, 2), ref, atol=1e-6, rtol=1e-5)
    assert out[..., 6:].abs().max() == 0


@pytest.mark.parametrize("with_sinks", [False, True])
def test_packed_rows_with_a_window_equal_each_sequence_alone(with_sinks):
    """Two sequences and padding packed in a row, and a shared prompt with two responses: each
    position sees the last `window` positions of its own sequence (a response's continuing after the
    prompt), sinks or not."""
    q, k, v = _qkv(T=12)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0]) if with_sinks else None
    window = 3
    doc = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, -1]])
    ctx = PackedAttention(doc)
    out = ctx.attend(0, q, k, v, window=window, sinks=sinks)
    for a, b in [(0, 5), (5, 11)]:
        ref = reference_attention(q[0, a:b], k[0, a:b], v[0, a:b], window, sinks)
        torch.testing.assert_close(out[0, a:b], ref, atol=1e-6, rtol=1e-5)
    # a prompt of 4 shared by responses of 3 and 4 tokens (positions 4.. each)
    doc = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2, -1]])
    shared = torch.zeros(1, 12, dtype=torch.bool)
    shared[0, :4] = True
    ctx = PackedAttention(doc, shared)
    assert ctx.positions[0, :11].tolist() == [0, 1, 2, 3, 4, 5, 6, 4, 5, 6, 7]
    out = ctx.attend(0, q, k, v, window=window, sinks=sinks)
    for a, b in [(4, 7), (7, 11)]:
        idx = torch.cat([torch.arange(4), torch.arange(a, b)])
        ref = reference_attention(q[0, idx], k[0, idx], v[0, idx], window, sinks)
        torch.testing.assert_close(out[0, a:b], ref[4:], atol=1e-6, rtol=1e-5)


def test_layer_windows_from_layer_types():
    cfg = type(
        "C",
        (),
        dict(num_hidden_layers=4, sliding_window=64, layer_types=["sliding_attention"] * 3 + ["full_attention"]),
    )()
    assert layer_windows(cfg) == (64, 64, 64, 0)
    cfg.sliding_window = None
    with pytest.raises(ValueError, match="sliding_window=None"):
        layer_windows(cfg)
    cfg.layer_types = ["full_attention"] * 4
    assert layer_windows(cfg) == ()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the varlen flash kernel needs CUDA")
def test_varlen_window_equals_the_masked_path_on_cuda():
    """bf16 on a GPU: flash attention's window_size=(window - 1, 0) over packed rows and a shared prompt gives
    the masked SDPA path's output (the CPU tests check the masked path against the written-out softmax)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 12, n, 64, generator=g).cuda().bfloat16() for n in (4, 2, 2))
    doc = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2, -1]]).cuda()
    shared = torch.zeros(1, 12, dtype=torch.bool).cuda()
    shared[0, :4] = True
    for sh in (None, shared):
        fast = PackedAttention(doc, sh)
        slow = PackedAttention(doc, sh, varlen=False)
        assert fast.use_varlen
        for window in (1, 3, 6):
            a = fast.attend(0, q, k, v, window=window, scale=0.2)
            b = slow.attend(0, q, k, v, window=window, scale=0.2)
            valid = doc[0] >= 0
            torch.testing.assert_close(a[0, valid].float(), b[0, valid].float(), atol=2e-2, rtol=2e-2)
