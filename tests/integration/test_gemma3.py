"""The ``gemma3_text`` family (issue 53): local sliding-window / global layers with their two RoPE tables,
QK-norm, GeGLU, scaled embeddings, sandwich norms, against transformers and between trainer and engine, in
fp32, with a window (4) shorter than the sequences so the window matters."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from reinforge.check_model import check_model, failed, format_table, write_tiny_model
from tests.conftest import TOKENIZER_FILES

WINDOW = 4


def gemma3_config(vocab: int = 1000, **changes) -> dict:
    from transformers import AutoConfig

    cfg = AutoConfig.for_model("gemma3_text").to_dict()
    cfg.update(
        vocab_size=vocab,
        sliding_window=WINDOW,
        max_position_embeddings=512,
        query_pre_attn_scalar=24,  # (not head_dim: the scale is the config's)
        num_hidden_layers=4,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
    )
    cfg.update(changes)
    return cfg


@pytest.fixture(scope="module")
def gemma3_path(tmp_path_factory, smollm2_path):
    """A tiny random gemma3_text (local, local, global, local; window 4) with SmolLM2's tokenizer."""
    src = tmp_path_factory.mktemp("src")
    (src / "config.json").write_text(json.dumps(gemma3_config(vocab=49152)))
    for name in TOKENIZER_FILES:
        if (smollm2_path / name).exists():
            shutil.copy(smollm2_path / name, src / name)
    return write_tiny_model(src, tmp_path_factory.mktemp("gemma3"), layers=4)


def test_tiny_gemma3_passes_every_check(tmp_path):
    """fp32 logits, engine log-probs, greedy tokens, weight sync and export against transformers; and the
    window, the local RoPE table and the scale each matter (the logits move without them)."""
    from reinforge.models.loading import build_model

    (tmp_path / "config.json").write_text(json.dumps(gemma3_config()))
    folder = write_tiny_model(tmp_path / "config.json", tmp_path / "tiny", layers=4)
    rows = check_model(folder, tokens=16, speed=False)
    assert not failed(rows), format_table(rows)
    assert rows[0].ok and "gemma3_text" in rows[0].value
    model = build_model(folder, torch.float32).eval()
    assert model.args.layer_windows == (WINDOW, WINDOW, 0, WINDOW)
    ids = torch.randint(10, 1000, (1, 13), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(ids)
        for layer in model.model.layers:
            layer.self_attn.window = 0
        assert (model(ids) - ref).abs().max() > 1e-2  # full attention everywhere is another model
        for layer, w in zip(model.model.layers, model.args.layer_windows):
            layer.self_attn.window = w
        model.rope_local_cos, model.rope_local_sin = model.rope_cos, model.rope_sin
        assert (model(ids) - ref).abs().max() > 1e-2  # the global table on local layers too


@pytest.mark.parametrize(
    "block_size,num_blocks",
    [(4, 0), (4, 16), (0, 0)],  # paged (rings for the local layers), paged and preempting, one block per slot
)
def test_engine_matches_the_trainer_past_the_window(gemma3_path, block_size, num_blocks):
    """Prompts of 5..29 tokens (past the window of 4) and 12 sampled tokens, prefill in chunks of 8 columns
    (longer than a ring of one block), 3 samples per prompt (ring copies), recompute after preemption: the
    engine's log-probs are the trainer's."""
    from reinforge.config import EngineConfig
    from reinforge.engine import EmbeddedEngine
    from reinforge.models.loading import build_model
    from tests.integration.test_integration import engine_vs_trainer_worst

    engine = EmbeddedEngine(
        build_model(gemma3_path, torch.float32),
        EngineConfig(max_num_seqs=8, kv_block_size=block_size, max_prefill_tokens=8, num_kv_blocks=num_blocks),
        max_model_len=64,
    )
    if block_size:  # the local layers' keys in rings of one block per slot; the pool holds the global layer's
        layout = engine.runner.layout
        assert layout.ring_layers == (0, 1, 3) and layout.ring_blocks == 1
        assert engine.runner.k_pool.shape[0] == 1 and engine.runner.k_ring.shape[:2] == (3, 8 + 1)
    trainer = build_model(gemma3_path, torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 40000, (5 + 12 * i,), generator=g).tolist() for i in range(3)]
    assert engine_vs_trainer_worst(engine, trainer, prompts) < 1e-4
    if num_blocks:
        assert engine.num_preemptions > 0


def test_windowed_layers_cost_window_sized_memory(gemma3_path):
    """The rings do not grow with max_model_len (the pool does, for the global layer): a KV cache of 8 slots x
    1024 tokens holds 4 layers' keys for the window only in 3 of them."""
    from reinforge.config import EngineConfig
    from reinforge.engine import EmbeddedEngine
    from reinforge.models.loading import build_model

    model = build_model(gemma3_path, torch.float32)
    sizes = {}
    for L in (64, 1024):
        engine = EmbeddedEngine(model, EngineConfig(max_num_seqs=8, kv_block_size=4), max_model_len=L)
        r = engine.runner
        sizes[L] = (r.k_ring.numel(), r.k_pool.numel(), r.kv_bytes())
        engine.shutdown() if hasattr(engine, "shutdown") else None
    assert sizes[64][0] == sizes[1024][0]  # the rings: window-sized
    assert sizes[1024][1] == 16 * sizes[64][1] - 15 * sizes[64][1] // (8 * 16 + 1)  # the pool: length-sized
    a = model.args
    full = 2 * a.num_layers * a.num_kv_heads * a.head_dim * 4 * (8 * 1024 + 1)
    assert sizes[1024][2] < 0.3 * full


@pytest.mark.parametrize(
    "changes,field",
    [({"final_logit_softcapping": 30.0}, "final_logit_softcapping"), ({"attn_logit_softcapping": 50.0}, "attn_logit")],
)
def test_unsupported_fields_are_refused_by_name(changes, field):
    from transformers import AutoConfig

    from reinforge.models.families import family_of

    fields = {**gemma3_config(), **changes}
    cfg = AutoConfig.for_model(fields.pop("model_type"), **fields)
    with pytest.raises(NotImplementedError, match=field):
        family_of(cfg).model_args(cfg)


def test_grpo_trains_gemma3_natively(tmp_path, gemma3_path, caplog):
    from tests.integration.test_integration import native_grpo_rollout

    m = native_grpo_rollout(gemma3_path, tmp_path / "run", caplog)
    assert m["train/logprob_abs_diff"] < 1e-4  # packed trainer (windowed band) == engine


def test_the_planner_counts_window_sized_caches():
    """Gemma-3-12B's shape: 40 of 48 layers local (window 1024); at 32k tokens the KV cache is about a sixth of
    a full-attention model's, at the window or below the same."""
    from reinforge.plan.arch import Arch

    cfg = dict(
        model_type="gemma3_text",
        vocab_size=262208,
        hidden_size=3840,
        num_hidden_layers=48,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=256,
        intermediate_size=15360,
        sliding_window=1024,
        layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(48)],
    )
    a = Arch.from_config(cfg)
    assert (a.windowed_layers, a.window) == (40, 1024)
    full = a.kv_bytes_per_token(2)
    assert full == 2 * 48 * 8 * 256 * 2
    assert a.kv_bytes_per_token(2, 1024) == full
    assert a.kv_bytes_per_token(2, 32768) == pytest.approx(full * (8 + 40 * 1024 / 32768) / 48)
    assert Arch.from_config({**cfg, "layer_types": None}).kv_bytes_per_token(2, 32768) == full


def test_the_engines_cache_plan_reads_the_windows_from_config_json():
    """The up-front estimate (a config.json dict, no model built) plans the same rings as the engine."""
    from reinforge.config import EngineConfig
    from reinforge.engine.kv_cache import plan_kv_layout
    from reinforge.models.families import family_of

    cfg = gemma3_config()
    shape = family_of(cfg).config_shape(cfg)
    assert shape.layer_windows == (WINDOW, WINDOW, 0, WINDOW)
    layout = plan_kv_layout(
        shape, torch.float32, torch.device("cpu"), EngineConfig(max_num_seqs=8, kv_block_size=4), 64, False
    )
    assert (layout.ring_layers, layout.ring_blocks, layout.num_blocks) == ((0, 1, 3), 1, 8 * 16)
    slot = plan_kv_layout(shape, torch.float32, torch.device("cpu"), EngineConfig(max_num_seqs=8), 64, False)
    assert slot.ring_layers == ()  # one block per slot: every layer in it


def gemma3_multimodal_folder(tmp_path):
    """A tiny random Gemma 3 multimodal checkpoint (``gemma3``): the tiny gemma3_text, a one-layer vision tower."""
    from transformers import AutoConfig

    cfg = AutoConfig.for_model("gemma3").to_dict()
    text = gemma3_config()
    text.pop("num_hidden_layers")
    cfg["text_config"].update(text)
    cfg["vision_config"].update(num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=16)
    cfg["mm_tokens_per_image"] = 4
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return write_tiny_model(tmp_path / "config.json", tmp_path / "tiny", layers=4)


def test_a_gemma3_multimodal_checkpoint_trains_as_its_language_model(tmp_path):
    """Every check-model row on the multimodal checkpoint (its language model native; transformers writes it in
    the published ``language_model.model.*`` layout), and the export keeps the vision tower bit for bit."""
    from safetensors import safe_open

    from reinforge.models.loading import build_model, save_hf_folder

    src = gemma3_multimodal_folder(tmp_path)
    rows = check_model(src, tokens=8, speed=False)
    assert not failed(rows), format_table(rows)
    assert rows[0].ok and "gemma3" in rows[0].value
    model = build_model(src, torch.float32)
    assert model.args.layer_windows == (WINDOW, WINDOW, 0, WINDOW)
    assert not any("vision" in n for n, _ in model.named_parameters())
    out = save_hf_folder(model, tmp_path / "export", src)

    def tensors(folder):
        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}

    before, after = tensors(src), tensors(out)  # (transformers writes the published layout; ours is transformers 5's)
    vision = [k for k in before if "vision_tower" in k]
    assert vision and all(torch.equal(before[k], after[k if k.startswith("model.") else "model." + k]) for k in vision)
    assert not any(k.startswith("language_model.") for k in after)  # the language model once, in the new layout


@pytest.mark.parametrize("block_size", [4, 0])
def test_the_preflight_kv_plan_is_what_the_engine_allocates(gemma3_path, block_size):
    """The up-front KV estimate counts the rings (paged) exactly as the engine allocates them."""
    from reinforge.config import load_config
    from reinforge.engine import EmbeddedEngine
    from reinforge.models.loading import build_model
    from reinforge.preflight import kv_cache_plan

    cfg = load_config(None, ["train.device=cpu", "engine.max_num_seqs=5", f"engine.kv_block_size={block_size}"])
    plan = kv_cache_plan(cfg, gemma3_path, 50, torch.device("cpu"))
    engine = EmbeddedEngine(build_model(gemma3_path, torch.float32), cfg.engine, max_model_len=50)
    assert plan.ring_layers == (3 if block_size else 0)
    assert plan.bytes == engine.runner.kv_bytes()
