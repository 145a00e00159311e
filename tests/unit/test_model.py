"""The native model matches transformers' implementation, and exported folders reload."""

import pytest
import torch

from reinforge.models.loading import build_model, save_hf_folder
from reinforge.models.transformer import CausalLM
from tests.conftest import make_tiny_model


@pytest.mark.parametrize(
    "model_type,extra",
    [
        ("llama", {}),
        (
            "llama",
            {
                "tie_word_embeddings": False,
                "rope_parameters": {
                    "rope_type": "llama3",
                    "rope_theta": 10000.0,
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 256,
                },
            },
        ),
        ("qwen2", {}),
        ("qwen3", {}),
    ],
)
def test_native_logits_match_transformers(tmp_path, smollm2_path, model_type, extra):
    from transformers import AutoModelForCausalLM

    path = make_tiny_model(tmp_path / model_type, smollm2_path, model_type, **extra)
    native = build_model(path, torch.float32)
    assert isinstance(native, CausalLM)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.randint(0, 49152, (2, 33))
    with torch.no_grad():
        diff = (native(ids) - hf(ids).logits).abs().max().item()
    assert diff < 1e-4


def test_unsupported_architecture_falls_back(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=100, n_embd=32, n_layer=1, n_head=2, n_positions=64)
    GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "gpt2")
    model = build_model(tmp_path / "gpt2", torch.float32)
    assert not isinstance(model, CausalLM)


def test_save_hf_folder_round_trip(tmp_path, tiny_model_path):
    from transformers import AutoModelForCausalLM

    model = build_model(tiny_model_path, torch.float32)
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight.add_(0.5)
    out = save_hf_folder(model, tmp_path / "export", tiny_model_path, dtype=torch.float32)
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.randint(0, 49152, (1, 17))
    with torch.no_grad():
        assert torch.allclose(model(ids), hf(ids).logits, atol=1e-5)
    assert (out / "tokenizer.json").exists() and (out / "config.json").exists()


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])  # qwen2: q/k/v biases
def test_concatenated_projections_compute_the_separate_ones(model_type):
    """The trainer's one matmul over the side-by-side q/k/v (and gate/up) weights gives the three (two)
    matmuls' outputs and the same gradients (the kernels that take it run on CUDA; the arithmetic is
    checked here on the CPU's)."""
    from transformers import AutoConfig

    from reinforge.models.transformer import plain_linears

    cfg = AutoConfig.for_model(
        model_type, vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=32,
    )  # fmt: skip
    torch.manual_seed(0)
    model = CausalLM(cfg)
    model.init_weights()
    attn = model.model.layers[0].self_attn
    if model_type == "qwen2":
        torch.nn.init.normal_(attn.q_proj.bias)
    assert plain_linears(attn.q_proj, attn.k_proj, attn.v_proj)
    x = torch.randn(2, 5, 64)
    cos = sin = torch.ones(2, 5, 16)  # (RoPE is the same function on both paths)
    outs = []
    for path in (attn._separate_qkv, attn._fused_qkv):  # (no fused matrix: the weights concatenated)
        model.zero_grad()
        xi = x.clone().requires_grad_(True)
        q, k, v = path(xi, cos, sin)
        assert (q.shape, k.shape, v.shape) == ((2, 5, 4, 16), (2, 5, 2, 16), (2, 5, 2, 16))
        (q.sum() + 2 * k.sum() + 3 * (v * v).sum()).backward()
        outs.append([q, k, v, xi.grad] + [p.grad.clone() for p in (attn.q_proj.weight, attn.v_proj.weight)])
    for ref, got in zip(*outs):
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    assert not plain_linears(torch.nn.Linear(2, 2), torch.nn.Identity())
