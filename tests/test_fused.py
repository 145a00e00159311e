"""The engine's fused RMSNorm and RoPE kernels against the eager model code (CUDA only)."""

import pytest
import torch

from reinforge.models import fused
from reinforge.models.transformer import RMSNorm, apply_rope
from reinforge.utils.triton import triton_available

pytestmark = pytest.mark.skipif(not triton_available("cuda"), reason="Triton kernels run on CUDA")


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1.6e-2)])
def test_fused_rms_norm_and_rope_match_eager(dtype, tol):
    torch.manual_seed(0)
    for hidden, heads, D in [(576, 9, 64), (896, 14, 64), (1024, 8, 128)]:
        x = torch.randn(4, 7, hidden, device="cuda").to(dtype)
        norm = RMSNorm(hidden, 1e-6).to("cuda", dtype)
        norm.weight.data.normal_()
        with torch.no_grad():
            ref = norm(x)
            norm.fused = True
            out = norm(x)
        torch.testing.assert_close(out, ref, atol=tol * ref.abs().max().item(), rtol=tol)
        q = torch.randn(4, 7, heads, D, device="cuda").to(dtype)
        cos, sin = torch.randn(2, 4, 7, D, device="cuda").to(dtype)
        ref = apply_rope(q, cos, sin)
        torch.testing.assert_close(fused.rope(q, cos, sin), ref, atol=tol * ref.abs().max().item(), rtol=tol)


def test_fused_kernels_stay_off_with_gradients():
    norm = RMSNorm(64, 1e-6).to("cuda")
    norm.fused = True
    x = torch.randn(3, 64, device="cuda", requires_grad=True)
    norm(x).sum().backward()  # the eager path: the kernel has no backward
    assert x.grad is not None
