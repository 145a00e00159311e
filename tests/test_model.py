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
