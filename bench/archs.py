"""Real architectures with random weights, for benchmarks that need no download.

from archs import ARCHS, hf_config, write_random_model   # (bench/ is on sys.path for bench scripts)
"""

from __future__ import annotations

from pathlib import Path

import torch

ARCHS = {
    "smollm2": dict(
        model_type="llama",
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        rms_norm_eps=1e-5,
    ),
    "qwen2.5-0.5b": dict(
        model_type="qwen2",
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
    ),
    "qwen2.5-1.5b": dict(
        model_type="qwen2",
        vocab_size=151936,
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
    ),
    # Issue 25's one-GPU MoE: Qwen3-MoE's layout scaled to 2.6B total / 0.52B active parameters (64 experts,
    # 8 per token, the 151,936-entry vocabulary), and a dense Qwen3 of the same active size (MLP width 8 x 512)
    "qwen3-moe-2.6b-a0.5b": dict(
        model_type="qwen3_moe",
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=4096,
        moe_intermediate_size=512,
        num_experts=64,
        num_experts_per_tok=8,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        num_hidden_layers=24,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=128,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
    ),
    "qwen3-dense-0.5b": dict(
        model_type="qwen3",
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=24,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=128,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
    ),
    # Issue 36's one-GPU large dense model: Qwen3-8B's shape (8.19B parameters, untied embeddings)
    "qwen3-8b": dict(
        model_type="qwen3",
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
    ),
    # Issue 26's multi-GPU runs: Qwen2.5-7B's layers (untied embeddings); Qwen3-30B-A3B's layout (128 experts,
    # 8 per token; 30.5B total / 3.3B active) and the same with half the layers (15.5B / 1.8B active)
    "qwen2.5-7b": dict(
        model_type="qwen2",
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
    ),
    "qwen3-moe-30b-a3b": dict(
        model_type="qwen3_moe",
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_experts=128,
        num_experts_per_tok=8,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
    ),
    # Issue 52's hybrid for end-to-end steps: Qwen3-Next's layer kinds (3 Gated DeltaNet : 1 gated attention) at
    # about Qwen3.5-2B's width, dense (transformers 5.17 has qwen3_next, not always qwen3_5)
    "qwen3-next-hybrid-2b": dict(
        model_type="qwen3_next",
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        num_experts=0,
        num_hidden_layers=16,
        full_attention_interval=4,
        num_attention_heads=16,
        num_key_value_heads=2,
        head_dim=256,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        partial_rotary_factor=0.25,
        max_position_embeddings=32768,
        rope_theta=10000000.0,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
    ),
}
ARCHS["qwen3-moe-15b-a1.8b"] = {**ARCHS["qwen3-moe-30b-a3b"], "num_hidden_layers": 24}

# Issue 53's families for end-to-end steps: each published model's layer shape, layers cut so that full-parameter
# training fits one GPU (about 1.5-2B parameters with SmolLM2's vocabulary): gpt-oss-20b's (2 layers: one sliding,
# one full), Moonlight-16B-A3B's (4: the dense first layer and 3 MoE layers of 64 experts), Gemma-3-12B's (6: five
# local, one global)
from gemma3_gpu import GEMMA3_12B  # noqa: E402  (bench/ modules: the configs live beside their decode benches)
from gpt_oss_gpu import GPT_OSS_20B  # noqa: E402
from mla_gpu import MOONLIGHT  # noqa: E402

for _name, _cfg, _layers in (
    ("gpt-oss-20b-2l", GPT_OSS_20B, 2),
    ("moonlight-16b-a3b-4l", MOONLIGHT, 4),
    ("gemma3-12b-6l", GEMMA3_12B, 6),
):
    ARCHS[_name] = {
        **{k: v for k, v in _cfg.items() if k not in ("architectures", "pad_token_id", "eos_token_id")},
        "num_hidden_layers": _layers,
        "max_position_embeddings": 32768,
    }

# Dry runs on CPU: each family's shape shrunk to 2 layers of width 64 (head counts divisible by 4, so tensor
# parallelism up to 4 applies), keeping the model type (and the MoE routing)
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    head_dim=16,
)
TINY_MOE = dict(TINY, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2)


def tiny_overrides(name: str) -> dict:
    """Overrides that shrink architecture ``name`` to a CPU-sized model of the same family."""
    return dict(TINY_MOE if "num_experts" in ARCHS[name] else TINY)


def active_params(model) -> int:
    """Parameters a token passes through: all of a dense model's; of an MoE model's experts only
    ``num_experts_per_tok / num_experts`` (the stacked ``experts.*`` parameters)."""
    cfg = model.config
    E, k = getattr(cfg, "num_experts", 0) or 0, getattr(cfg, "num_experts_per_tok", 0) or 0
    total = 0
    for name, p in model.named_parameters():
        total += p.numel() * k // E if E and ".experts." in name else p.numel()
    return total


def hf_config(name: str, **overrides):
    """The transformers config of architecture ``name`` (``overrides``: e.g. max_position_embeddings)."""
    from transformers import AutoConfig

    spec = {**ARCHS[name], **overrides}
    return AutoConfig.for_model(spec.pop("model_type"), **spec)


def write_random_model(name: str, folder: Path, **overrides) -> None:
    """A Hugging Face folder (bf16 safetensors, seed 0) of architecture ``name``; the tokenizer is not needed.
    The weights are drawn on the GPU when there is one (an 8B model's initialisation takes minutes on a CPU)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(hf_config(name, **overrides), dtype=torch.bfloat16)
    model.save_pretrained(folder)
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
