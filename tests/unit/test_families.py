"""The model-family registry (reinforge/models/families): every registered family builds and plans
tensor parallelism over real nn.Linear submodules, an unknown family is refused or falls back with
the registered ones named, a family registered from outside the package builds, and partial RoPE
equals transformers'."""

import logging

import pytest
import torch
from torch import nn

from reinforge.models.families import (
    FAMILIES,
    describe,
    family_of,
    is_moe_type,
    is_native_type,
    moe_models,
    native_models,
)
from reinforge.models.families.base import Family
from reinforge.models.families.llama import Llama
from reinforge.models.transformer import CausalLM, apply_rope

TINY = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=64,
)
MOE = {
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16),
    "qwen2_moe": dict(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24
    ),
    "glm4_moe": dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, first_k_dense_replace=1),
    "qwen3_5_text": dict(
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        layer_types=["linear_attention", "full_attention"],
    ),
    "deepseek_v3": dict(
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
        kv_lora_rank=16,
        q_lora_rank=8,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
    ),
    "qwen3_next": dict(
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=24,
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        layer_types=["linear_attention", "full_attention"],
    ),
}


MULTIMODAL = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text", "gemma3": "gemma3_text"}  # -> its LM


def tiny_config(model_type):
    from transformers import AutoConfig

    if model_type in MULTIMODAL:  # the language model's sizes go in text_config
        text = MULTIMODAL[model_type]
        hybrid = MOE["qwen3_next"] if text.startswith("qwen") else {}
        return AutoConfig.for_model(model_type, text_config={**TINY, **MOE.get(text, hybrid)})
    if model_type == "deepseek_v3":  # (multi-head latent attention: a key per query head)
        return AutoConfig.for_model(model_type, **{**TINY, "num_key_value_heads": 4}, **MOE[model_type])
    return AutoConfig.for_model(model_type, **TINY, **MOE.get(model_type, {}))


@pytest.mark.parametrize("model_type", FAMILIES.names())
def test_every_family_builds_and_plans_tensor_parallelism(model_type):
    cfg = tiny_config(model_type)
    with torch.device("meta"):
        model = CausalLM(cfg, max_positions=64)
    assert model.family is family_of(cfg) and model.args.model_type == MULTIMODAL.get(model_type, model_type)
    assert bool(model.args.moe_layers) == is_moe_type(model_type)
    for layer in model.model.layers:
        # (a sparse linear-attention layer of a hybrid has nothing to shard: its mixer and experts stay whole;
        # nor has a sparse multi-head latent attention layer, whose attention is not split)
        assert layer.tp_plan or (layer.sparse and (layer.mixer_name != "self_attn" or model.args.kv_lora_rank))
        assert set(layer.tp_plan.values()) <= {"colwise", "rowwise"}
        for name in layer.tp_plan:  # the plan names plain Linear submodules of this family's layers
            assert type(layer.get_submodule(name)) is nn.Linear, (model_type, name)


def test_registry_answers_without_importing_families():
    assert is_native_type("llama") and not is_native_type("gpt2") and not is_native_type(None)
    assert is_moe_type("qwen3_moe") and not is_moe_type("qwen3")
    assert all(n in native_models() for n in FAMILIES.names())
    moe = [n for n in FAMILIES.names() if FAMILIES.info(n)["moe"]]
    assert {"qwen3_moe", "qwen2_moe"} <= set(moe) and moe_models() == f"a mixture-of-experts model ({' / '.join(moe)})"
    assert [n for n, _, _ in describe()] == FAMILIES.names()


def test_unknown_family_lists_the_registered_ones(tmp_path, caplog):
    from transformers import GPT2Config, GPT2LMHeadModel

    from reinforge.models.loading import build_model

    with pytest.raises(NotImplementedError, match=r"'gpt2' is not a registered model family \(registered: llama, "):
        family_of({"model_type": "gpt2"})
    GPT2LMHeadModel(GPT2Config(vocab_size=100, n_embd=32, n_layer=1, n_head=2, n_positions=64)).save_pretrained(
        tmp_path / "gpt2"
    )
    with caplog.at_level(logging.WARNING, logger="reinforge.models.loading"):
        model = build_model(tmp_path / "gpt2", torch.float32)
    assert not isinstance(model, CausalLM)
    assert f"registered: {', '.join(FAMILIES.names())})" in caplog.text


def test_a_family_registered_outside_the_package_builds():
    """The worked example of docs/design.md ("Adding a model family"), in miniature: a family object
    registered under a new model_type (here Llama with biased attention) is what CausalLM builds."""
    from transformers import LlamaConfig

    class BiasedLlama(Llama):
        model_type = "toy_biased_llama"

        def model_args(self, cfg):
            return super().model_args(cfg).with_(model_type=self.model_type, qkv_bias=True)

    FAMILIES.register("toy_biased_llama", BiasedLlama(), moe=False, title="a test family")
    try:
        cfg = LlamaConfig(**TINY)
        cfg.model_type = "toy_biased_llama"
        model = CausalLM(cfg)
        assert isinstance(model.family, BiasedLlama) and model.model.layers[0].self_attn.q_proj.bias is not None
        assert "toy_biased_llama" in native_models()
    finally:
        FAMILIES._entries.pop("toy_biased_llama")


def test_family_defaults():
    f = Family()
    with pytest.raises(NotImplementedError, match="model_args"):
        f.model_args(None)
    assert f.tp_plan(sparse=True) == {
        "self_attn.q_proj": "colwise",
        "self_attn.k_proj": "colwise",
        "self_attn.v_proj": "colwise",
        "self_attn.o_proj": "rowwise",
    }
    assert "mlp.down_proj" in f.tp_plan(sparse=False)


def test_partial_rope_equals_transformers():
    from transformers.models.glm4_moe.modeling_glm4_moe import apply_rotary_pos_emb

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 5, 4, 16, generator=g), torch.randn(2, 5, 2, 16, generator=g)
    cos, sin = torch.randn(2, 5, 8, generator=g), torch.randn(2, 5, 8, generator=g)
    ref_q, ref_k = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
    assert torch.allclose(apply_rope(q, cos, sin), ref_q.transpose(1, 2), atol=1e-6)
    assert torch.allclose(apply_rope(k, cos, sin), ref_k.transpose(1, 2), atol=1e-6)
