"""The trainer's RMSNorm with gradients (reinforge/models/fused.py: _RMSNormFunction) against the eager
model code, forward and both gradients. Runs on CUDA, or on a CPU under Triton's interpreter
(``TRITON_INTERPRET=1``, fp32); otherwise it skips."""

import pytest
import torch

from reinforge.models import fused
from reinforge.models.transformer import RMSNorm
from tests.unit.test_paged_attention import KERNEL_DEVICE, needs_kernel

DTYPES = [(torch.float32, 1e-5)] + ([(torch.bfloat16, 2e-2)] if KERNEL_DEVICE == "cuda" else [])


@needs_kernel
@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_rms_norm_function_matches_eager_forward_and_gradients(dtype, tol, monkeypatch):
    monkeypatch.setattr(fused, "num_sms", lambda device: 3)  # few programs: each walks several row tiles
    for rows, hidden in [(1, 64), (7, 576), (231, 576), (50, 96), (9, 2048)]:  # tiles of 4 rows, partly filled
        g = torch.Generator().manual_seed(rows)
        x = torch.randn(rows, hidden, generator=g).to(KERNEL_DEVICE, dtype)
        w = torch.randn(hidden, generator=g).to(KERNEL_DEVICE)
        dy = torch.randn(rows, hidden, generator=g).to(KERNEL_DEVICE, dtype)
        eager = RMSNorm(hidden, 1e-6).to(KERNEL_DEVICE)
        outs = []
        for fn in (
            lambda x, w: torch.func.functional_call(eager, {"weight": w}, (x,)),
            lambda x, w: fused.rms_norm(x, w, 1e-6),
        ):
            xi, wi = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
            y = fn(xi, wi)
            (y.float() * dy.float()).sum().backward()
            outs.append((y, xi.grad, wi.grad))
        assert outs[1][0].dtype == dtype  # x's dtype, as Liger's (eager promotes to the fp32 weight's)
        for ref, got in zip(*outs):
            assert got.shape == ref.shape
            ref, got = ref.float(), got.float()
            torch.testing.assert_close(got, ref, atol=tol * ref.abs().max().item(), rtol=tol)


@needs_kernel
def test_rms_norm_function_stores_the_autocast_dtype(monkeypatch):
    """The trainer passes the autocast dtype: an fp32 residual stream's norm comes out in bf16 with the
    values autocast would give the next matmul (the fp32 output, rounded once), and the gradients of the
    fp32 path through that cast."""
    monkeypatch.setattr(fused, "num_sms", lambda device: 3)
    for rows, hidden in [(7, 576), (231, 576), (9, 2048)]:
        g = torch.Generator().manual_seed(rows)
        x = torch.randn(rows, hidden, generator=g).to(KERNEL_DEVICE)
        w = torch.randn(hidden, generator=g).to(KERNEL_DEVICE)
        dy = torch.randn(rows, hidden, generator=g).to(KERNEL_DEVICE, torch.bfloat16)
        outs = []
        for fn in (
            lambda x, w: fused.rms_norm(x, w, 1e-6).to(torch.bfloat16),  # fp32 out, cast (the path before)
            lambda x, w: fused.rms_norm(x, w, 1e-6, torch.bfloat16),
        ):
            xi, wi = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
            y = fn(xi, wi)
            (y.float() * dy.float()).sum().backward()
            outs.append((y, xi.grad, wi.grad))
        assert outs[1][0].dtype == torch.bfloat16 and outs[1][1].dtype == torch.float32
        # exact on a GPU (both round to nearest even); Triton's interpreter truncates a plain bf16 cast
        ulp = 0 if KERNEL_DEVICE == "cuda" else 2**-7
        torch.testing.assert_close(outs[1][0], outs[0][0], atol=0, rtol=ulp)
        for ref, got in zip(outs[0][1:], outs[1][1:]):
            torch.testing.assert_close(got, ref, atol=1e-5 * ref.abs().max().item(), rtol=1e-5)


def test_wider_norms_train_with_liger(monkeypatch):
    """Above RMS_BWD_MAX_HIDDEN the trainer's norm is Liger's (faster there); up to it, ours."""
    calls = []

    class Liger:
        class LigerRMSNormFunction:
            @staticmethod
            def apply(*args):
                calls.append("liger")
                return args[0]

    class Ours:
        @staticmethod
        def apply(*args):
            calls.append("ours")
            return args[0]

    monkeypatch.setattr(fused, "_liger", lambda: Liger)
    monkeypatch.setattr(fused, "_RMSNormFunction", Ours)
    for n in (fused.RMS_BWD_MAX_HIDDEN, fused.RMS_BWD_MAX_HIDDEN + 1):
        fused.rms_norm(torch.ones(2, n, requires_grad=True), torch.ones(n), 1e-6)
    assert calls == ["ours", "liger"]


@needs_kernel
@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_offset_norm_kernel_matches_the_eager_zero_centred_norm(dtype, tol, with_residual):
    """The engine's zero-centred norm (Qwen3-Next, Qwen3.5, Gemma: ``x_norm * (1 + w)`` in fp32) as one kernel,
    alone and after the residual add, against the model's eager code; the residual stream updated alike."""
    for rows, hidden in [(1, 64), (9, 256), (16, 2048)]:
        g = torch.Generator().manual_seed(rows)
        x = torch.randn(rows, hidden, generator=g).to(KERNEL_DEVICE, dtype)
        res = torch.randn(rows, hidden, generator=g).to(KERNEL_DEVICE, dtype)
        norm = RMSNorm(hidden, 1e-6, offset=1.0).to(KERNEL_DEVICE, dtype)
        with torch.no_grad():
            norm.weight.copy_(torch.randn(hidden, generator=g) * 0.3)
            res_ref, res_got = res.clone(), res.clone()
            if with_residual:
                res_ref += x
                ref = norm(res_ref)
                got = fused.add_rms_norm(x, res_got, norm.weight, 1e-6, dtype, offset=1.0)
                torch.testing.assert_close(res_got, res_ref, atol=0, rtol=0)
            else:
                ref, got = norm(x), fused.rms_norm(x, norm.weight, 1e-6, dtype, offset=1.0)
            norm.fused = True  # the module itself takes the kernel with fused kernels on and no gradients
            via_module = norm.add_forward(x, res.clone()) if with_residual else norm(x)
        assert got.dtype == dtype
        torch.testing.assert_close(got.float(), ref.float(), atol=tol * ref.abs().max().item(), rtol=tol)
        torch.testing.assert_close(via_module, got, atol=0, rtol=0)
    with pytest.raises(RuntimeError, match="inference-only"):
        fused.rms_norm(x, norm.weight.detach().requires_grad_(True), 1e-6, dtype, offset=1.0)
