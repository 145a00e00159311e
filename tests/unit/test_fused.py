"""The fused RMSNorm, RoPE and SiLU-and-multiply kernels against the eager model code: reinforge's
forward kernels (no gradients) and Liger-Kernel's autograd functions (with gradients), CUDA only."""

import pytest
import torch

from reinforge.models import fused
from reinforge.models.transformer import RMSNorm, Variant, apply_rope
from reinforge.utils.triton import liger_available, triton_available

pytestmark = pytest.mark.skipif(not triton_available("cuda"), reason="Triton kernels run on CUDA")
needs_liger = pytest.mark.skipif(not liger_available(), reason="the training kernels come from liger-kernel")


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
        out = fused.rope_qk(q, q[:, :, :1], cos, sin)
        torch.testing.assert_close(out[0], ref, atol=tol * ref.abs().max().item(), rtol=tol)
        torch.testing.assert_close(out[1], ref[:, :, :1], atol=tol * ref.abs().max().item(), rtol=tol)


def _value_and_grads(fn, *inputs):
    inputs = [t.detach().clone().requires_grad_(True) for t in inputs]
    y = fn(*inputs)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(y.device, y.dtype)
    (y.float() * dy.float()).sum().backward()
    return [y] + [t.grad for t in inputs]


@needs_liger
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_fused_backward_matches_eager(dtype, tol):
    torch.manual_seed(0)
    x = torch.randn(3, 77, 576, device="cuda").to(dtype)  # 231 rows: several rows per backward program
    w = torch.randn(576, device="cuda")
    eager = RMSNorm(576, 1e-6).to("cuda")
    pairs = [
        (
            lambda x, w: torch.func.functional_call(eager, {"weight": w}, (x,)),
            lambda x, w: fused.rms_norm(x, w, 1e-6),
            (x, w),
        )
    ]
    cos, sin = torch.randn(2, 3, 77, 32, device="cuda").repeat(1, 1, 1, 2).to(dtype)  # RoPE tables: equal halves
    pairs.append(
        (
            lambda q, k: torch.cat([apply_rope(q, cos, sin), apply_rope(k, cos, sin)], 2),
            lambda q, k: torch.cat(fused.rope_qk(q * 1, k * 1, cos, sin), 2),  # (written in place)
            (torch.randn(3, 77, 9, 64, device="cuda").to(dtype), torch.randn(3, 77, 3, 64, device="cuda").to(dtype)),
        )
    )
    g, u = torch.randn(2, 3, 77, 1536, device="cuda").to(dtype)
    pairs.append((lambda g, u: torch.nn.functional.silu(g) * u, fused.silu_mul, (g, u)))
    for ref_fn, fused_fn, inputs in pairs:
        for ref, out in zip(_value_and_grads(ref_fn, *inputs), _value_and_grads(fused_fn, *inputs)):
            ref, out = ref.float(), out.float()
            torch.testing.assert_close(out, ref, atol=tol * ref.abs().max().item(), rtol=tol)


def tiny_cuda_model(model_type: str, num_layers: int = 2):
    """A randomly initialised CausalLM of ``model_type`` on CUDA (fp32), and a [3, 17] batch of ids."""
    from transformers import AutoConfig

    from reinforge.models.transformer import CausalLM

    cfg = AutoConfig.for_model(
        model_type,
        vocab_size=256,
        hidden_size=128,
        intermediate_size=320,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = CausalLM(cfg).cuda()
    model.init_weights()
    model.init_rope()
    return model, torch.randint(0, 256, (3, 17), device="cuda")


@needs_liger
def test_fused_model_trains_like_eager():
    """A whole model, forward and backward in fp32, with and without the fused kernels (Liger's with
    gradients); without gradients under bf16 autocast the norms hand the next matmul bf16 directly."""
    model, ids = tiny_cuda_model("llama")

    def run(on):
        assert model.set_variant(Variant(fused_kernels=on)).fused_kernels == on
        model.zero_grad()
        loss = model(ids).log_softmax(-1)[..., 5].mean()
        loss.backward()
        return [loss.detach()] + [p.grad.clone() for p in model.parameters()]

    for ref, out in zip(run(False), run(True)):
        torch.testing.assert_close(out, ref, atol=1e-5 * ref.abs().max().item() + 1e-8, rtol=1e-4)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        assert model.model.norm(torch.randn(2, 128, device="cuda")).dtype == torch.bfloat16
    # under bf16 autocast with gradients (the trainer): the norms hand q/k/v and the packed gate/up matmul
    # one bf16 tensor; loss and gradients within bf16's rounding of the eager path
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert model.model.norm(torch.randn(2, 128, device="cuda", requires_grad=True)).dtype == torch.bfloat16
        for ref, out in zip(run(False), run(True)):
            torch.testing.assert_close(out.float(), ref.float(), atol=3e-2 * ref.abs().max().item(), rtol=3e-2)


@pytest.mark.parametrize(
    "x_dtype,res_dtype",
    [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32)],
)
def test_fused_add_rms_norm_matches_eager_add_then_norm(x_dtype, res_dtype):
    """residual += x, then the norm of it: the same arithmetic as eager ``residual + x`` followed by
    the (fused) norm, bit for bit; the last case is a bf16 sublayer output under autocast added to
    an fp32 stream."""
    torch.manual_seed(0)
    x = torch.randn(5, 3, 896, device="cuda").to(x_dtype)
    residual = torch.randn(5, 3, 896, device="cuda").to(res_dtype)
    w = torch.randn(896, device="cuda").to(res_dtype)
    want_sum = residual + x
    want = fused.rms_norm(want_sum, w, 1e-6)
    with torch.no_grad():
        got = fused.add_rms_norm(x, residual, w, 1e-6)
    assert torch.equal(residual, want_sum) and got.dtype == want.dtype
    # the norm: bit for bit when the load layouts agree; a bf16 x changes the reduction order (ulps)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    with pytest.raises(RuntimeError, match="inference-only"):
        fused.add_rms_norm(x, residual, w.requires_grad_(True), 1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_residual_add_model_forward_matches(dtype):
    """A whole model's no-grad forward with the residual adds fused into the norms (the engine's
    decoder) equals the forward without, bit for bit."""
    model, ids = tiny_cuda_model("qwen2", num_layers=3)
    model.to(dtype).requires_grad_(False).set_variant(Variant(fused_kernels=True))
    with torch.no_grad():
        want = model(ids)
        model.set_variant(Variant(fused_kernels=True, fused_residual=True))
        got = model(ids)
    assert torch.equal(got, want)


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
@torch.no_grad()
def test_fused_projections_match_and_follow_weight_copies(model_type):
    """The engine's fused q/k/v and gate/up matmuls (in-place RoPE on the q and k heads, SiLU-and-
    multiply on the packed output; qwen3's per-head norms on the split views) give the unfused
    model's logits in fp32, and an in-place copy into a parameter (weight sync) reaches the fused
    matrices."""
    from reinforge.models.loading import copy_weights_

    model, ids = tiny_cuda_model(model_type)
    model.set_variant(Variant(fused_kernels=True))
    model.requires_grad_(False)
    want = model(ids)
    model.set_variant(Variant(fused_kernels=True, fused_projections=True))
    got = model(ids)
    assert model.model.layers[0].self_attn.qkv is not None and model.model.layers[0].mlp.gate_up is not None
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    new = {n: torch.randn_like(p) * 0.05 for n, p in model.named_parameters() if "proj" in n}
    copy_weights_(model, new.items())
    got = model(ids)
    model.fuse_projections(False)
    for m in model.modules():  # back to separate matmuls over the same (copied) parameters
        assert getattr(m, "qkv", None) is None and getattr(m, "gate_up", None) is None
    torch.testing.assert_close(got, model(ids), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got, want, atol=1e-3)
