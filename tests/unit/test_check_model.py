"""``reinforge check-model`` (issue 52): transformers beside the native family and the engine, in one table."""

from __future__ import annotations

import json

import pytest
import torch

from reinforge.check_model import check_model, failed, format_table, tiny_config, write_tiny_model


def _config(tmp_path, model_type: str, **extra) -> object:
    cfg = {
        "model_type": model_type,
        "vocab_size": 1000,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 12,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
        **extra,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def test_tiny_config_keeps_the_pattern_and_the_head_ratio():
    cfg = {
        "model_type": "qwen3_next",
        "hidden_size": 2048,
        "num_hidden_layers": 48,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "linear_key_head_dim": 128,
        "num_experts": 512,
        "num_experts_per_tok": 10,
        "full_attention_interval": 4,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 44,
        "mlp_only_layers": [0, 30],
        "quantization_config": {"quant_method": "fp8"},
    }
    tiny = tiny_config(cfg, layers=2)
    assert tiny["num_hidden_layers"] == 4  # at least one full-attention layer of the 3:1 pattern
    assert tiny["layer_types"] == cfg["layer_types"][:4]
    assert tiny["mlp_only_layers"] == [0]
    assert (tiny["hidden_size"], tiny["num_attention_heads"], tiny["num_key_value_heads"]) == (64, 4, 1)
    assert tiny["head_dim"] == tiny["linear_key_head_dim"] == 16
    assert (tiny["num_experts"], tiny["num_experts_per_tok"]) == (8, 2)
    assert "quantization_config" not in tiny
    wrapped = tiny_config({"model_type": "qwen3_5", "text_config": cfg}, layers=2)
    assert wrapped["text_config"] == tiny


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_a_native_family_passes_every_row(tmp_path, model_type):
    folder = write_tiny_model(_config(tmp_path, model_type), tmp_path / "tiny", layers=2)
    rows = check_model(folder, tokens=16, speed=False)
    table = format_table(rows)
    assert not failed(rows), table
    names = [r.name for r in rows]
    assert names == [
        "family",
        "logits (fp32)",
        "engine log-probs (fp32)",
        "greedy continuation",
        "weight sync",
        "HF export",
        "LoRA targets",
    ]
    assert all(r.ok for r in rows), table


def test_a_wrong_family_fails_and_names_the_first_differing_layer(tmp_path, monkeypatch):
    """A family that computes one layer wrong (0.5 added to layer 1's output) is caught at that layer."""
    from reinforge.models import transformer

    folder = write_tiny_model(_config(tmp_path, "llama"), tmp_path / "tiny", layers=2)
    forward = transformer.DecoderLayer.forward

    def wrong(self, x, *a, **k):
        out = forward(self, x, *a, **k)
        return out + 0.5 if self is wrong.target else out

    monkeypatch.setattr(transformer.DecoderLayer, "forward", wrong)
    from reinforge.models.loading import build_model

    real_build = build_model

    def build(*a, **k):
        model = real_build(*a, **k)
        wrong.target = model.model.layers[1]
        return model

    monkeypatch.setattr("reinforge.models.loading.build_model", build)
    rows = {r.name: r for r in check_model(folder, tokens=8, speed=False)}
    assert rows["logits (fp32)"].ok is False
    assert "first differing layer: 1" in rows["logits (fp32)"].value


def test_an_unregistered_family_gets_the_fallback_rows(tmp_path):
    """phi3 has no family: what is missing, said in words, and the fallback's rows (its engine, transformers'
    batched generate, checked against transformers' forward pass)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if "phi3" not in CONFIG_MAPPING_NAMES:
        pytest.skip("the installed transformers has no phi3")
    folder = write_tiny_model(_config(tmp_path, "phi3", pad_token_id=0), tmp_path / "tiny", layers=2)
    rows = {r.name: r for r in check_model(folder, tokens=8, speed=True)}
    assert rows["family"].ok is None and "no registered family for model_type 'phi3'" in rows["family"].value
    assert rows["weight sync"].ok and "fallback engine" in rows["engine log-probs (fp32)"].value
    assert rows["HF export"].ok and rows["LoRA targets"].ok
    assert "fallback (transformers)" in rows["speed"].value
    assert not failed(list(rows.values()))


def test_cli_prints_the_table_and_fails_on_a_missing_config(tmp_path, capsys):
    from reinforge.cli import main

    assert main(["check-model", str(_config(tmp_path, "llama")), "--random-tiny", "--tokens", "8", "--no-speed"]) == 0
    out = capsys.readouterr().out
    assert "greedy continuation" in out and "8 of 8 tokens equal" in out
    assert main(["check-model", str(tmp_path / "nowhere")]) == 2
    assert "has no config.json" in capsys.readouterr().err
    torch.manual_seed(0)
