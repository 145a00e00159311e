"""The decode matmuls with a folded prologue (reinforge/engine/prologue_linear.py) against the separate
kernels and eager PyTorch: norm, add + norm (and the new residual), the gated SiLU-and-multiply epilogue, bias, partial
tiles. Runs on CUDA, or on a CPU under Triton's interpreter (``TRITON_INTERPRET=1``, fp32)."""

import pytest
import torch
import torch.nn.functional as F

from reinforge.engine.prologue_linear import prologue_linear
from reinforge.models.transformer import RMSNorm

from .test_paged_attention import KERNEL_DEVICE, needs_kernel

DTYPE, TOL = (torch.bfloat16, 2e-2) if KERNEL_DEVICE == "cuda" else (torch.float32, 1e-5)
# (rows, K, N): a row tile partly filled, K not a multiple of the K step, N not of the column tile
SHAPES = [(3, 64, 96), (37, 200, 130), (70, 576, 64)]


def _data(M, K, N, seed, x_cols=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, x_cols or K, generator=g)
    w = torch.randn(N, K, generator=g) * K**-0.5
    return x.to(KERNEL_DEVICE, DTYPE), w.to(KERNEL_DEVICE, DTYPE), torch.randn(N, generator=g).to(KERNEL_DEVICE, DTYPE)


def _close(got, ref):
    assert got.shape == ref.shape and got.dtype == ref.dtype
    torch.testing.assert_close(got.float(), ref.float(), atol=TOL * ref.float().abs().max().item(), rtol=TOL)


def _norm(x, nw):
    norm = RMSNorm(x.shape[1], 1e-6).to(KERNEL_DEVICE, DTYPE)
    norm.weight.data.copy_(nw)
    return norm(x)


@needs_kernel
@pytest.mark.parametrize("M,K,N", SHAPES)
def test_plain_and_bias(M, K, N):
    x, w, b = _data(M, K, N, 0)
    _close(prologue_linear(x, w, config=(16, 32, 4)), F.linear(x, w))
    _close(prologue_linear(x, w, b, config=(16, 32, 4)), F.linear(x, w, b))


@needs_kernel
@pytest.mark.parametrize("M,K,N", SHAPES)
def test_rms_norm_prologue_is_norm_then_matmul(M, K, N):
    x, w, _ = _data(M, K, N, 1)
    nw = 1 + torch.randn(K, generator=torch.Generator().manual_seed(2)).to(KERNEL_DEVICE, DTYPE) * 0.1
    got = prologue_linear(x, w, prologue="rms_norm", norm_weight=nw, eps=1e-6, config=(16, 32, 4))
    _close(got, F.linear(_norm(x, nw), w))


@needs_kernel
@pytest.mark.parametrize("M,K,N", SHAPES)
def test_add_rms_norm_prologue_returns_the_new_residual(M, K, N):
    x, w, _ = _data(M, K, N, 3)
    res = torch.randn(M, K, generator=torch.Generator().manual_seed(4)).to(KERNEL_DEVICE, DTYPE)
    nw = 1 + torch.randn(K, generator=torch.Generator().manual_seed(5)).to(KERNEL_DEVICE, DTYPE) * 0.1
    before = res.clone()
    y, new_res = prologue_linear(
        x, w, prologue="add_rms_norm", norm_weight=nw, eps=1e-6, residual=res, config=(16, 32, 4)
    )
    torch.testing.assert_close(res, before)  # the stream passed in is left as it was
    assert torch.equal(new_res, x + res)  # rounded once to the stream's dtype, as eager's add
    _close(y, F.linear(_norm(x + res, nw), w))


@needs_kernel
@pytest.mark.parametrize("M,K,N", SHAPES)
def test_gated_epilogue_is_silu_mul_of_the_packed_product(M, K, N):
    x, w, _ = _data(M, K, 2 * N, 6)
    res = torch.randn(M, K, generator=torch.Generator().manual_seed(7)).to(KERNEL_DEVICE, DTYPE)
    nw = 1 + torch.randn(K, generator=torch.Generator().manual_seed(8)).to(KERNEL_DEVICE, DTYPE) * 0.1
    y, new_res = prologue_linear(
        x, w, prologue="add_rms_norm", norm_weight=nw, eps=1e-6, residual=res, gated=True, config=(16, 32, 4)
    )
    g, u = F.linear(_norm(x + res, nw), w).chunk(2, dim=-1)
    _close(y, F.silu(g) * u)
    assert torch.equal(new_res, x + res)


def test_bad_arguments_are_named():
    x, w = torch.zeros(4, 8), torch.zeros(6, 8)
    with pytest.raises(ValueError, match="prologue 'gelu'"):
        prologue_linear(x, w, prologue="gelu")
    with pytest.raises(ValueError, match="needs norm_weight"):
        prologue_linear(x, w, prologue="rms_norm")
    with pytest.raises(ValueError, match="needs a residual"):
        prologue_linear(x, w, prologue="add_rms_norm", norm_weight=torch.ones(8))
    with pytest.raises(ValueError, match="does not fit"):
        prologue_linear(torch.zeros(4, 7), w)
    with pytest.raises(ValueError, match="over MAX_K"):
        prologue_linear(torch.zeros(4, 2048), torch.zeros(6, 2048))
    with pytest.raises(ValueError, match="gated: an even number of rows"):
        prologue_linear(x, torch.zeros(5, 8), gated=True)
