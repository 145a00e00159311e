"""The hybrid family (issue 52): Gated DeltaNet and gated attention (``qwen3_next``) in trainer and engine,
against transformers and against the rule's plain recurrence, in fp32."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from reinforge.check_model import check_model, failed, format_table, write_tiny_model
from reinforge.models.linear_attention import (
    GatedDeltaNet,
    causal_conv1d,
    chunk_gated_delta_rule,
    recurrent_gated_delta_rule,
)
from tests.conftest import TOKENIZER_FILES


def hybrid_config(experts: int = 0, vocab: int = 1000) -> dict:
    from transformers import AutoConfig

    cfg = AutoConfig.for_model("qwen3_next").to_dict()
    cfg.update(vocab_size=vocab, num_experts=experts, max_position_embeddings=512)
    if experts:  # layer 0 dense, the others sparse
        cfg["mlp_only_layers"] = [0]
    return cfg


@pytest.fixture(scope="module")
def hybrid_path(tmp_path_factory, smollm2_path):
    """A tiny random qwen3_next MoE (3 linear layers, 1 full; layer 0 dense) with SmolLM2's tokenizer."""
    src = tmp_path_factory.mktemp("src")
    (src / "config.json").write_text(json.dumps(hybrid_config(experts=8, vocab=49152)))
    for name in TOKENIZER_FILES:
        if (smollm2_path / name).exists():
            shutil.copy(smollm2_path / name, src / name)
    return write_tiny_model(src, tmp_path_factory.mktemp("hybrid"), layers=4)


def test_chunked_rule_equals_the_recurrence():
    g = torch.Generator().manual_seed(0)
    B, T, H, Dk, Dv = 2, 150, 3, 8, 5  # two whole chunks and a partial one
    q, k = (torch.nn.functional.normalize(torch.randn(B, T, H, Dk, generator=g), dim=-1) for _ in range(2))
    v = torch.randn(B, T, H, Dv, generator=g)
    gate = -torch.rand(B, T, H, generator=g) * 0.5
    beta = torch.rand(B, T, H, generator=g)
    s0 = torch.randn(B, H, Dk, Dv, generator=g)
    o, s = chunk_gated_delta_rule(q, k, v, gate, beta, s0)
    state, ref = s0, []
    for t in range(T):
        ot, state = recurrent_gated_delta_rule(q[:, t], k[:, t], v[:, t], gate[:, t], beta[:, t], state)
        ref.append(ot)
    assert (o - torch.stack(ref, 1)).abs().max() < 1e-4
    assert (s - state).abs().max() < 1e-4


def test_packed_sequences_equal_separate_ones():
    """A packed row (cu_seqlens) restarts the convolution and the state at each sequence."""
    cfg = type("Cfg", (), hybrid_config())()
    for key, value in dict(
        linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8, hidden_size=32
    ).items():
        setattr(cfg, key, value)
    torch.manual_seed(0)
    layer = GatedDeltaNet(cfg, 0).eval()
    lens = [7, 70, 3]
    xs = [torch.randn(1, n, 32) for n in lens]
    cu = torch.tensor([0, 7, 77, 80], dtype=torch.int32)

    class Packed:
        def cu_seqlens(self):
            return cu, 70

    with torch.no_grad():
        packed = layer(torch.cat(xs, 1), ctx=Packed())
        alone = torch.cat([layer(x) for x in xs], 1)
    assert (packed - alone).abs().max() < 1e-5
    w = torch.randn(5, 4)
    x = torch.randn(1, 9, 5)
    two = causal_conv1d(x, w, torch.tensor([0, 4, 9]))
    assert torch.allclose(two, torch.cat([causal_conv1d(x[:, :4], w), causal_conv1d(x[:, 4:], w)], 1), atol=1e-6)


def test_tiny_hybrid_passes_every_check(tmp_path):
    """fp32 logits, engine log-probs, greedy tokens, weight sync and export against transformers (a dense layer
    and three sparse ones; linear, linear, linear, full attention)."""
    (tmp_path / "config.json").write_text(json.dumps(hybrid_config(8)))
    folder = write_tiny_model(tmp_path / "config.json", tmp_path / "tiny", layers=4)
    rows = check_model(folder, tokens=16, speed=False)
    assert not failed(rows), format_table(rows)
    assert rows[0].ok and "qwen3_next" in rows[0].value


def test_engine_chunked_prefill_and_shared_prompts_match_the_trainer(hybrid_path):
    """A prefill cut into chunks of 4 tokens and 3 samples per prompt: the states carried across chunks and
    copied to each sample give the trainer's log-probs."""
    from reinforge.config import EngineConfig
    from reinforge.engine import EmbeddedEngine
    from reinforge.models.loading import build_model
    from tests.integration.test_integration import engine_vs_trainer_worst

    engine = EmbeddedEngine(
        build_model(hybrid_path, torch.float32),
        EngineConfig(max_num_seqs=8, kv_block_size=4, max_prefill_tokens=8),
        max_model_len=64,
    )
    assert engine.runner.linear is not None and engine.runner.linear.nbytes() > 0
    # the engine's copy runs each layer's input projections as one matmul (fuse_projection)
    layers = engine.runner.model.model.layers
    assert all(layer.mixer.fused_in is not None for layer in layers[:3]) and layers[3].mixer.qkv is not None
    # keys and values for the one full-attention layer (layer 3) only
    assert engine.runner.k_pool.shape[0] == 1 and engine.runner.k_cache[:3] == [None] * 3
    trainer = build_model(hybrid_path, torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 40000, (5 + 6 * i,), generator=g).tolist() for i in range(3)]
    assert engine_vs_trainer_worst(engine, trainer, prompts) < 1e-4


def test_grpo_trains_the_hybrid_natively(tmp_path, hybrid_path, caplog):
    from tests.integration.test_integration import native_grpo_rollout

    m = native_grpo_rollout(hybrid_path, tmp_path / "run", caplog)
    assert m["train/logprob_abs_diff"] < 1e-4  # packed trainer == engine, linear layers included


def qwen3_5_folder(tmp_path, model_type: str):
    """A tiny random ``model_type`` folder (Qwen3.5's language model, or its multimodal checkpoint)."""
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(model_type).to_dict()
    (cfg.get("text_config") or cfg)["vocab_size"] = 1000
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return write_tiny_model(tmp_path / "config.json", tmp_path / "tiny", layers=4)


@pytest.mark.parametrize("model_type", ["qwen3_5_moe_text", "qwen3_5"])
def test_qwen3_5_passes_every_check(tmp_path, model_type):
    """Qwen3.5's separate linear-attention projections and always-renormalised router; a multimodal
    checkpoint (vision tower + text_config) trains and samples as its language model."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if model_type not in CONFIG_MAPPING_NAMES:
        pytest.skip(f"the installed transformers has no {model_type} to compare with")
    rows = check_model(qwen3_5_folder(tmp_path, model_type), tokens=8, speed=False)
    assert not failed(rows), format_table(rows)
    assert model_type in rows[0].value


def test_a_multimodal_export_keeps_the_vision_tower(tmp_path):
    from safetensors import safe_open
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    from reinforge.models.loading import build_model, save_hf_folder

    if "qwen3_5" not in CONFIG_MAPPING_NAMES:
        pytest.skip("the installed transformers has no qwen3_5 to write a checkpoint with")
    src = qwen3_5_folder(tmp_path, "qwen3_5")
    model = build_model(src, torch.float32)
    assert not any("visual" in n for n, _ in model.named_parameters())  # only the language model trains
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.add_(1.0)
    out = save_hf_folder(model, tmp_path / "export", src)

    def tensors(folder):
        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}

    before, after = tensors(src), tensors(out)
    assert set(before) == set(after)
    vision = [k for k in before if k.startswith("model.visual.")]
    assert vision and all(torch.equal(before[k], after[k]) for k in vision)
    name = "model.language_model.layers.0.mlp.down_proj.weight"
    assert torch.equal(after[name], before[name] + 1.0)


def test_the_planner_counts_attention_layers_and_per_sequence_states(tmp_path):
    """A hybrid's parameters, KV bytes per token and per-sequence state as the built model and engine have them
    (Qwen3-Next's pattern: 3 linear layers to 1 full)."""
    from reinforge.engine.linear_state import linear_layers, state_bytes_per_slot
    from reinforge.models.loading import build_model
    from reinforge.plan.arch import Arch

    cfg = hybrid_config(experts=0)
    cfg.update(num_hidden_layers=8, layer_types=None)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    folder = write_tiny_model(tmp_path / "config.json", tmp_path / "tiny", layers=8)
    cfg = json.loads((folder / "config.json").read_text())
    arch = Arch.from_config(cfg)
    model = build_model(folder, torch.float32)
    assert arch.num_kv_layers == 2 and arch.linear_layers == 6
    assert arch.num_params == sum(p.numel() for p in model.parameters())
    assert arch.kv_bytes_per_token(2) == 2 * 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * 2
    assert arch.state_bytes_per_seq(4) == state_bytes_per_slot(linear_layers(model), torch.float32)


def test_a_gpu_without_fla_is_told_the_install_command(monkeypatch):
    import sys

    from reinforge.models import linear_attention

    monkeypatch.setitem(sys.modules, "fla", None)  # (import fla fails)
    monkeypatch.setitem(sys.modules, "fla.ops.gated_delta_rule", None)
    for f in (linear_attention._fla, linear_attention.fla_recurrent):
        f.cache_clear()
        with pytest.raises(RuntimeError, match="pip install fla-core"):
            f()
        f.cache_clear()


def test_lora_by_default_also_adapts_the_linear_attention_projections(hybrid_path):
    from reinforge.config import ModelConfig
    from reinforge.models.loading import build_model
    from reinforge.models.lora import apply_lora

    m = ModelConfig()
    model = apply_lora(build_model(hybrid_path, torch.float32), 4, 8.0, 0.0, m.lora_target_modules, True)
    adapted = {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in model.named_parameters() if ".lora_A." in n}
    assert {"in_proj_qkvz", "out_proj", "q_proj", "o_proj", "gate_proj"} <= adapted
    own = apply_lora(build_model(hybrid_path, torch.float32), 4, 8.0, 0.0, ["q_proj"])  # a user's list: as written
    assert {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in own.named_parameters() if ".lora_A." in n} == {
        "q_proj"
    }
