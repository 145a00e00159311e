"""The ``gpt_oss`` family (issue 53 item 2): the mixture-of-experts block and the MXFP4 dequantization against
transformers' code, the config mapping, a tiny random model through every ``check-model`` row (sliding
windows shorter than the text, non-zero sinks), an MXFP4 checkpoint loaded, one native GRPO rollout."""

from __future__ import annotations

import pytest
import torch

from reinforge.models.args import ModelArgs
from reinforge.models.families.gpt_oss import GptOssMoeBlock
from reinforge.models.moe import Routing, SparseMoeBlock

gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss", reason="transformers without gpt_oss")


def tiny_hf_config(**kw):
    from transformers import GptOssConfig

    base = dict(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=8,
        num_experts_per_tok=2,
        sliding_window=4,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        pad_token_id=2,
        eos_token_id=2,
        bos_token_id=1,
    )
    return GptOssConfig(**{**base, **kw})


def moe_args(cfg) -> ModelArgs:
    """The fields the MoE block reads (independent of the attention fields)."""
    return ModelArgs(
        model_type="gpt_oss",
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_layers=cfg.num_hidden_layers,
        num_heads=cfg.num_attention_heads,
        num_kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        rms_norm_eps=cfg.rms_norm_eps,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=False,
        qkv_bias=True,
        o_bias=True,
        qk_norm=False,
        num_experts=cfg.num_local_experts,
        num_experts_per_tok=cfg.num_experts_per_tok,
        moe_intermediate_size=cfg.intermediate_size,
        norm_topk_prob=True,
        moe_layers=tuple(range(cfg.num_hidden_layers)),
    )


def block_pair(seed: int = 0):
    """transformers' GptOssMLP with random weights (biases too, large enough that the clamps act) and our
    block holding the same tensors."""
    cfg = tiny_hf_config()
    ref = gpt_oss.GptOssMLP(cfg).float()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in ref.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (1.0 if p.dim() >= 2 else 0.5))
    ours = GptOssMoeBlock(moe_args(cfg), 0, cfg)
    ours.load_state_dict(ref.state_dict())
    return cfg, ref, ours


@pytest.mark.parametrize("grouped", [False, True])
def test_moe_block_matches_transformers(grouped, monkeypatch):
    """Biased router, softmax over the chosen logits, interleaved gate/up, clamped SwiGLU (the clamps hit:
    |gate| and |up| reach past 7 with these weights), biased down projection: fp32 outputs agree, through
    the expert loop and through torch._grouped_mm."""
    if grouped and not hasattr(torch, "_grouped_mm"):
        pytest.skip("torch without _grouped_mm")
    monkeypatch.setattr(SparseMoeBlock, "grouped", grouped)
    cfg, ref, ours = block_pair()
    x = torch.randn(2, 9, cfg.hidden_size, generator=torch.Generator().manual_seed(1))
    flat = x.reshape(-1, cfg.hidden_size)
    gate_up = flat @ ref.experts.gate_up_proj[0] + ref.experts.gate_up_proj_bias[0]
    assert gate_up.abs().max() > 2 * cfg.swiglu_limit  # the clamps matter
    expected, _ = ref(x)
    try:
        got = ours(x)
    except RuntimeError as e:  # (a torch whose CPU grouped matmul takes no fp32)
        if grouped:
            pytest.skip(f"torch._grouped_mm on CPU fp32: {e}")
        raise
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_routing_replay_and_statistics():
    """Replaying the recorded experts gives the same output; replaying others changes it, with the gate
    weights the softmax of those experts' logits; the load-balancing statistics read the softmax over all."""
    cfg, ref, ours = block_pair()
    x = torch.randn(1, 7, cfg.hidden_size, generator=torch.Generator().manual_seed(2))
    rec = Routing(record=True, aux_loss=True)
    y = ours(x, rec)
    ids = rec.experts[0]
    assert ids.shape == (7, cfg.num_experts_per_tok)
    torch.testing.assert_close(ours(x, Routing(replay={0: ids})), y)
    other = (ids + 1) % cfg.num_local_experts
    y_other = ours(x, Routing(replay={0: other}))
    assert (y_other - y).abs().max() > 1e-3
    logits = ours.router(x.reshape(-1, cfg.hidden_size))
    w = torch.softmax(logits.gather(1, other), -1)
    assert torch.allclose(ours.gate_weights(logits.float(), other), w, atol=1e-6)
    counts, probs, rows = rec.stats[0]
    assert counts.sum() == 7 * cfg.num_experts_per_tok and rows == 7
    torch.testing.assert_close(probs, torch.softmax(logits, -1).sum(0))


def test_mxfp4_dequantization_matches_transformers():
    """Our dequantization equals transformers' ``convert_moe_packed_tensors`` (layout included: stored
    [E, rows, G, 16] -> [E, G * 32, rows]), and inverts our encoding up to its rounding."""
    from reinforge.models.mxfp4 import dequantize_mxfp4, dequantize_mxfp4_state, quantize_mxfp4

    mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")
    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 10, 2, 16), dtype=torch.uint8, generator=g)
    scales = torch.randint(115, 135, (3, 10, 2), dtype=torch.uint8, generator=g)
    expected = mxfp4.convert_moe_packed_tensors(blocks, scales, dtype=torch.bfloat16)
    state = dequantize_mxfp4_state({"x.gate_up_proj_blocks": blocks, "x.gate_up_proj_scales": scales})
    assert list(state) == ["x.gate_up_proj"]
    assert torch.equal(state["x.gate_up_proj"], expected)
    w = torch.randn(2, 5, 64, generator=g)
    back = dequantize_mxfp4(*quantize_mxfp4(w), dtype=torch.float32)
    amax = w.reshape(2, 5, 2, 32).abs().amax(-1, keepdim=True)
    # half a step of E2M1 at most: a step is 2 (between 4 and 6) x the scale, and the scale < amax / 3
    assert ((back - w).reshape(2, 5, 2, 32).abs() <= amax / 3).all()
    with pytest.raises(KeyError, match="_scales must both be present"):
        dequantize_mxfp4_state({"x.down_proj_blocks": blocks})


# ------------------------------------------------------------------------------------------- whole models
def write_tiny_gpt_oss(out, tokenizer_src=None, seed: int = 0, **kw):
    """A tiny random GPT-OSS folder written by transformers: 4 layers (sliding window 4, full, sliding, full),
    weights N(0, 0.2), biases N(0, 0.1), sinks N(0, 1) (so that they matter), SmolLM2's tokenizer."""
    import shutil

    from transformers import GptOssForCausalLM

    from reinforge.check_model import TOKENIZER_FILES

    torch.manual_seed(seed)
    model = GptOssForCausalLM(tiny_hf_config(**kw)).float()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
            elif name.endswith("sinks"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    model.save_pretrained(out)
    for f in TOKENIZER_FILES if tokenizer_src is not None else ():
        if (tokenizer_src / f).exists():
            shutil.copy2(tokenizer_src / f, out / f)
    return out


@pytest.fixture(scope="module")
def gpt_oss_path(tmp_path_factory):
    return write_tiny_gpt_oss(tmp_path_factory.mktemp("tiny-gpt-oss"))


def test_config_mapping():
    """layer_types -> per-layer windows, sinks on, biased q/k/v/o, every layer sparse with the expert width
    ``intermediate_size``; the family's registration."""
    from reinforge.models.families import family_of, is_moe_type

    cfg = tiny_hf_config()
    args = family_of(cfg).model_args(cfg)
    assert args.layer_windows == (4, 0, 4, 0) and args.attention_sinks
    assert args.qkv_bias and args.o_bias and not args.qk_norm
    assert (args.num_experts, args.num_experts_per_tok, args.moe_intermediate_size) == (8, 2, 32)
    assert args.moe_layers == (0, 1, 2, 3) and is_moe_type("gpt_oss")
    shape = family_of(cfg).config_shape({"model_type": "gpt_oss", **cfg.to_dict()})
    assert (shape.num_experts, shape.mlp_width, shape.layer_windows) == (8, 8 * 32, (4, 0, 4, 0))
    bare = {k: v for k, v in cfg.to_dict().items() if k not in ("layer_types", "sliding_window")}
    assert family_of(cfg).config_shape(bare).layer_windows == (128, 0, 128, 0)  # (transformers' defaults)


def test_tiny_gpt_oss_passes_every_check(gpt_oss_path):
    """Every check-model row passes on a model whose window (4) is shorter than the texts and whose sinks are
    far from 0; both matter (transformers' own logits move when either is taken away)."""
    from transformers import AutoModelForCausalLM

    from reinforge.check_model import check_model, failed, format_table

    rows = check_model(gpt_oss_path, tokens=16, speed=False)
    assert not failed(rows), format_table(rows)
    assert all(r.ok for r in rows if r.name != "speed"), format_table(rows)
    ref = AutoModelForCausalLM.from_pretrained(gpt_oss_path, dtype=torch.float32).eval()
    ids = torch.randint(10, 1000, (1, 13), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        base = ref(input_ids=ids).logits
        for layer in ref.model.layers:
            layer.self_attn.sliding_window = None
        ref.config.sliding_window = 4096
        no_window = ref(input_ids=ids).logits
        for layer in ref.model.layers:
            layer.self_attn.sinks.zero_()
        no_sinks = ref(input_ids=ids).logits
    assert (no_window - base).abs().max() > 1e-2 and (no_sinks - no_window).abs().max() > 1e-2


def write_mxfp4_copy(src, dst):
    """``src`` with its expert matrices stored as OpenAI's checkpoints store them: MXFP4 ``*_blocks`` /
    ``*_scales`` of the [E, rows, cols] matrices (rows: output features), ``quant_method: mxfp4``."""
    import json

    from safetensors.torch import load_file, save_file

    from reinforge.models.mxfp4 import quantize_mxfp4

    out = {}
    for name, t in load_file(str(src / "model.safetensors")).items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            out[f"{name}_blocks"], out[f"{name}_scales"] = quantize_mxfp4(t.transpose(1, 2))
        else:
            out[name] = t
    dst.mkdir(parents=True)
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
    }
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_mxfp4_checkpoint_loads_dequantized(tmp_path, gpt_oss_path):
    """An MXFP4 checkpoint loads dequantized (the same logits as transformers' own dequantizing load; its
    experts differ from the unquantized source's, so the values come from the blocks), and exports as a
    plain folder transformers reads back (no quantization_config)."""
    import json

    from transformers import AutoModelForCausalLM

    from reinforge.models.loading import build_model, save_hf_folder

    path = write_mxfp4_copy(gpt_oss_path, tmp_path / "mxfp4")
    ours = build_model(path).eval()
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    plain = build_model(gpt_oss_path)
    experts = ours.model.layers[0].mlp.experts.gate_up_proj
    assert 1e-3 < (experts - plain.model.layers[0].mlp.experts.gate_up_proj).abs().max() < 0.2
    assert torch.equal(experts, experts.bfloat16().float())  # (bf16 values)
    ids = torch.randint(10, 1000, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), ref(input_ids=ids).logits, atol=1e-4, rtol=0)
    out = save_hf_folder(ours, tmp_path / "export", path)
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    back = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(back(input_ids=ids).logits, ref(input_ids=ids).logits, atol=1e-4, rtol=0)


def test_grpo_trains_gpt_oss_natively(tmp_path, smollm2_tokenizer_path, caplog):
    """One GRPO rollout of a tiny GPT-OSS on reinforge's own code (no fallback): the packed trainer's
    log-probs equal the engine's (sliding windows and sinks on both sides), routing replay on."""
    from tests.integration.test_integration import native_grpo_rollout

    path = write_tiny_gpt_oss(tmp_path / "model", smollm2_tokenizer_path, vocab_size=49152)
    extra = {
        "rollout.rollout_batch_size": 2,
        "rollout.n_samples_per_prompt": 2,
        "algo.use_rollout_routing_replay": "true",
    }
    m = native_grpo_rollout(path, tmp_path / "run", caplog, **extra)
    assert m["train/logprob_abs_diff"] < 1e-4


def test_ep2_matches_one_process(tmp_path, smollm2_tokenizer_path):
    """Expert parallelism over 2 gloo ranks (4 of the 8 experts each, their biases sharded with them, gradients
    scaled as the matrices') gives one process's loss, gradient norm and updated weights, biases included."""
    from tests.integration.test_distributed import assert_same, make_cfg, make_data, run_ranks, run_single

    path = write_tiny_gpt_oss(tmp_path / "model", smollm2_tokenizer_path, vocab_size=49152)
    data = make_data(6, seed=7)
    single = run_single(make_cfg(path), path, data)
    metrics, weights = run_ranks(2, make_cfg(path, **{"train.expert_model_parallel_size": 2}), path, data)
    assert_same(single[:2], (metrics, weights))
    bias = "model.layers.0.mlp.experts.gate_up_proj_bias"
    assert not torch.allclose(weights[bias], torch.from_numpy(_stored(path, bias)))  # (the biases were trained)


@pytest.mark.parametrize("split", ["train.tensor_model_parallel_size", "train.context_parallel_size"])
def test_sinks_split_with_the_heads_match_one_process(tmp_path, smollm2_tokenizer_path, split):
    """Tensor parallelism (the sinks a ``Shard(0)`` parameter beside the column-split query heads) and context
    parallelism (Ulysses: each rank's block of heads, and of sinks) over 2 gloo ranks give one process's loss,
    gradient norm and updated weights, the sinks included (they were refused with the heads split)."""
    from tests.integration.test_distributed import assert_same, make_cfg, make_data, run_ranks, run_single

    path = write_tiny_gpt_oss(tmp_path / "model", smollm2_tokenizer_path, vocab_size=49152)
    data = make_data(6, seed=7)
    single = run_single(make_cfg(path), path, data)
    metrics, weights = run_ranks(2, make_cfg(path, **{split: 2}), path, data)
    assert_same(single[:2], (metrics, weights))
    sinks = "model.layers.1.self_attn.sinks"
    assert not torch.allclose(weights[sinks], torch.from_numpy(_stored(path, sinks)))  # (the sinks were trained)


def _stored(path, name):
    from safetensors.numpy import load_file

    return load_file(str(path / "model.safetensors"))[name]
