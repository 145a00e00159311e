"""GLM-4.5's mixture of experts (``glm4_moe``, reinforge/models/families/glm4_moe.py) against
transformers' ``Glm4MoeForCausalLM``: fp32 logits on the same weights, one training step, the
embedded engine, routing record / replay (engine routes = the trainer's router), the Hugging Face
export, and a short GRPO run with rollout routing replay.

The tiny model exercises every GLM option: sigmoid routing with a random (non-zero) score-correction
bias, group-limited top-k (4 groups of 2 experts, the best 2 kept), routed_scaling_factor 2.5,
normalised top-k weights, one shared expert, the first layer dense, partial RoPE (factor 0.5 of
head_dim 16), QK-norm and q/k/v biases."""

import json
import shutil

import pytest
import torch

from reinforge.models.families.glm4_moe import Glm4MoeBlock
from reinforge.models.loading import build_model, save_hf_folder
from reinforge.models.moe import Routing
from reinforge.models.transformer import CausalLM, Variant
from tests.conftest import TOKENIZER_FILES

E, K = 8, 2
GLM = dict(
    vocab_size=49152,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=1024,
    tie_word_embeddings=False,
    n_routed_experts=E,
    num_experts_per_tok=K,
    moe_intermediate_size=32,
    n_shared_experts=1,
    n_group=4,
    topk_group=2,
    first_k_dense_replace=1,
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
    use_qk_norm=True,
    attention_bias=True,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)


def make_tiny_glm(out, tokenizer_src, seed=0, **overrides):
    """A random tiny glm4_moe saved by transformers (the hub's per-expert layout; a random
    score-correction bias, which transformers keeps as a buffer) with SmolLM2's tokenizer."""
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    torch.manual_seed(seed)
    model = Glm4MoeForCausalLM(Glm4MoeConfig(**{**GLM, **overrides})).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.2)
            elif name.endswith("bias"):
                p.normal_(0, 0.1)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(0, 0.1)
    model.save_pretrained(out)
    for f in TOKENIZER_FILES:
        if (tokenizer_src / f).exists():
            shutil.copy2(tokenizer_src / f, out / f)
    return out


@pytest.fixture(scope="module")
def glm_path(tmp_path_factory, smollm2_path):
    return make_tiny_glm(tmp_path_factory.mktemp("glm4_moe"), smollm2_path)


def ids_batch(seed=0, B=2, T=11):
    return torch.randint(10, 40000, (B, T), generator=torch.Generator().manual_seed(seed))


def hf_model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def test_config_mapping_and_layout(glm_path):
    from safetensors import safe_open

    with safe_open(str(glm_path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "model.layers.1.mlp.experts.0.gate_proj.weight" in keys  # the hub layout goes in
    model = build_model(glm_path, torch.float32)
    a = model.args
    assert (a.model_type, a.moe_layers, a.num_experts, a.num_experts_per_tok) == ("glm4_moe", (1, 2), E, K)
    assert (a.rotary_dims, a.head_dim, a.qkv_bias, a.o_bias, a.qk_norm) == (8, 16, True, False, True)
    assert a.shared_expert_intermediate_size == 32
    assert not isinstance(model.model.layers[0].mlp, Glm4MoeBlock)
    block = model.model.layers[1].mlp
    assert isinstance(block, Glm4MoeBlock) and block.experts.gate_up_proj.shape == (E, 64, 64)
    bias = block.gate.e_score_correction_bias
    assert not bias.requires_grad and bias.abs().sum() > 0  # loaded from the checkpoint, frozen
    assert model.rope_cos.shape[-1] == 8  # partial RoPE: half of each head rotates


def test_logits_match_transformers_fp32(glm_path):
    ids = ids_batch()
    ours = build_model(glm_path, torch.float32).eval()
    with torch.no_grad():
        ref, got = hf_model(glm_path)(ids).logits, ours(ids)
    assert (ref - got).abs().max().item() < 1e-5
    ours.set_variant(Variant.for_inference())  # the engine's variant (fused shared-expert projections)
    with torch.no_grad():
        assert (ours(ids) - got).abs().max().item() < 1e-5


def test_router_bias_groups_and_weights(glm_path):
    model = build_model(glm_path, torch.float32).eval()
    block = model.model.layers[2].mlp
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        scores, _ = block.router_scores(x)
        ids = block.select(scores)
        groups = ids // (E // block.n_group)
        assert all(len(set(g.tolist())) <= block.topk_group for g in groups)  # at most topk_group groups
        w = block.gate_weights(scores, ids)
        assert torch.allclose(w.sum(-1), torch.full((64,), 2.5))  # normalised, times routed_scaling_factor
        bias = block.gate.e_score_correction_bias.clone()
        block.gate.e_score_correction_bias.zero_()
        unbiased = block.select(scores)
        block.gate.e_score_correction_bias.copy_(bias)
    assert not torch.equal(ids.sort(-1).values, unbiased.sort(-1).values)  # the bias moves the choice


@pytest.mark.parametrize("random_init", [False, True])
def test_a_bf16_copy_keeps_the_router_in_fp32(glm_path, random_init):
    """As transformers' ``_keep_in_fp32_modules``: the engine's bf16 copy holds the router's weight and
    score-correction bias in fp32, so its choice of experts is the fp32 model's (a bias rounded to
    bf16 steps of ~0.004 flips near-tied experts); everything else is bf16."""
    full = build_model(glm_path, torch.float32, random_init=random_init).eval()
    half = build_model(glm_path, torch.bfloat16, random_init=random_init).eval()
    router = {n for n, _ in half.named_parameters() if ".mlp.gate." in n}
    assert router and all(p.dtype == torch.float32 for n, p in half.named_parameters() if n in router)
    assert all(p.dtype == torch.bfloat16 for n, p in half.named_parameters() if n not in router)
    wanted = dict(full.named_parameters())
    assert all(torch.equal(p, wanted[n]) for n, p in half.named_parameters() if n in router)
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a, b = full.model.layers[2].mlp, half.model.layers[2].mlp
        assert torch.equal(a.select(a.router_scores(x)[0]), b.select(b.router_scores(x)[0]))


def test_trains_one_step(glm_path):
    model = build_model(glm_path, torch.float32).train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    ids = ids_batch(4, B=2, T=16)
    bias = model.model.layers[1].mlp.gate.e_score_correction_bias.detach().clone()
    losses = []
    for _ in range(3):
        logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
        assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
        assert grads["model.layers.1.mlp.gate.weight"].abs().sum() > 0  # the router trains through the weights
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert torch.equal(model.model.layers[1].mlp.gate.e_score_correction_bias, bias)  # not trained by gradients


def test_routing_record_and_replay(glm_path):
    model = build_model(glm_path, torch.float32).eval()
    ids = ids_batch(1)
    with torch.no_grad():
        rec = Routing(record=True)
        base = model(ids, routing=rec)
        assert sorted(rec.experts) == [1, 2] and rec.experts[1].shape == (ids.numel(), K)
        assert torch.equal(model(ids, routing=Routing(replay=dict(rec.experts))), base)
        other = {i: (e + 3) % E for i, e in rec.experts.items()}
        again = Routing(replay=other, record=True)
        assert (model(ids, routing=again) - base).abs().max().item() > 1e-3
        assert all(torch.equal(again.experts[i], other[i]) for i in other)
        stats = Routing(aux_loss=True)
        model(ids, routing=stats)
        assert 0 < stats.load_balancing_loss().item() <= E


def test_embedded_engine_matches_the_trainer_and_records_routes(glm_path):
    from reinforge.config import EngineConfig
    from reinforge.engine import EmbeddedEngine
    from reinforge.records import GenerateRequest, SamplingParams

    engine = EmbeddedEngine(
        build_model(glm_path, torch.float32),
        EngineConfig(max_num_seqs=4, kv_block_size=4),
        max_model_len=64,
        record_routes=True,
    )
    trainer = build_model(glm_path, torch.float32).eval()
    prompts = [ids_batch(s, B=1, T=5 + 3 * s)[0].tolist() for s in range(3)]
    results = engine.generate(
        [GenerateRequest(p, SamplingParams(max_new_tokens=10, temperature=0.8, ignore_eos=True), n=2) for p in prompts]
    )
    diffs = []
    for p, group in zip(prompts, results):
        for r in group:
            ids = torch.tensor([p + r.token_ids])
            rec = Routing(record=True)
            with torch.no_grad():
                logits = trainer(ids, routing=rec)[0, len(p) - 1 : -1] / 0.8
            ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r.token_ids)[:, None])[:, 0]
            diffs.append((ref - torch.tensor(r.log_probs)).abs())
            P, n = len(p), len(r.token_ids)
            want = torch.stack([rec.experts[i][P - 1 : P - 1 + n] for i in (1, 2)], 1)
            assert r.routed_experts.shape == (n, 2, K)
            assert torch.equal(r.routed_experts.long().sort(-1).values, want.sort(-1).values)
    assert torch.cat(diffs).max().item() < 1e-5


def test_export_loads_in_transformers(glm_path, tmp_path):
    from safetensors import safe_open

    model = build_model(glm_path, torch.float32).eval()
    with torch.no_grad():  # changed weights and bias: the export must carry them
        model.model.layers[2].mlp.experts.down_proj.mul_(1.5)
        model.model.layers[2].mlp.gate.e_score_correction_bias.add_(0.05)
    out = save_hf_folder(model, tmp_path / "export", glm_path)
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert {"model.layers.2.mlp.experts.7.down_proj.weight", "model.layers.2.mlp.gate.e_score_correction_bias"} <= keys
    ids = ids_batch(3)
    with torch.no_grad():
        assert (hf_model(out)(ids).logits - model(ids)).abs().max().item() < 1e-5


def test_shape_and_parallel_checks_read_the_family(glm_path):
    from reinforge.models.shape import config_shape, model_shape, num_experts

    cfg = json.loads((glm_path / "config.json").read_text())
    assert "n_routed_experts" in cfg and "num_experts" not in cfg
    assert num_experts(cfg) == E and config_shape(cfg).head_dim == 16
    with torch.device("meta"):
        from transformers import AutoConfig

        exact = sum(p.numel() for p in CausalLM(AutoConfig.from_pretrained(glm_path)).parameters())
    assert model_shape(glm_path).num_params == exact


def test_unsupported_options_are_refused():
    from transformers import Glm4MoeConfig

    with pytest.raises(ValueError, match="n_group"):
        CausalLM(Glm4MoeConfig(**{**GLM, "n_group": 3}))
    with pytest.raises(NotImplementedError, match="hidden_act"):
        CausalLM(Glm4MoeConfig(**{**GLM, "hidden_act": "gelu"}))


def test_grpo_runs_with_routing_replay_and_exports(tmp_path, glm_path):
    from reinforge.checkpoint import resolve_checkpoint
    from reinforge.config import load_config
    from reinforge.loop import run_training
    from tests.integration.test_integration import read_metrics, tiny_overrides

    out = tmp_path / "run"
    cfg = load_config(
        None,
        tiny_overrides(
            glm_path,
            out,
            **{
                "algo.use_rollout_routing_replay": "true",
                "reward.type": "custom",
                "reward.function_path": "tests.reward_fns:even_first_token",
                "data.n_eval_prompts": 0,
                "eval.eval_before_train": "false",
                "train.num_rollout": 1,
                "train.num_steps_per_rollout": 2,
                # fp32 engine and trainer on every device: the sharp random model (weights of std 0.2)
                # differs by ~0.1 nats per token between bf16 and fp32, which would hide a real gap
                "engine.dtype": "fp32",
                "model.train_dtype": "fp32",
            },
        ),
    )
    run_training(cfg)
    (m,) = [m for m in read_metrics(out) if "train/loss" in m]
    assert m["train/logprob_abs_diff"] < 1e-5 and m["train/grad_norm"] > 0
    ckpt = resolve_checkpoint(out) / "model"
    assert json.loads((ckpt / "config.json").read_text())["model_type"] == "glm4_moe"
    trained = build_model(ckpt, torch.float32).eval()
    gate = "model.layers.1.mlp.gate.weight"
    assert not torch.equal(build_model(glm_path, torch.float32).state_dict()[gate], trained.state_dict()[gate])
    ids = ids_batch(5)
    with torch.no_grad():
        assert (hf_model(ckpt)(ids).logits - trained(ids)).abs().max().item() < 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="decode CUDA graphs (CUDA)")
def test_decode_cuda_graphs_equal_eager_steps(glm_path):
    """bf16 on Hopper: the GLM decode step (sigmoid router, group mask, grouped experts, eager partial
    RoPE) is captured; tokens, log-probs and routes equal those of eager decode steps."""
    from reinforge.config import EngineConfig
    from reinforge.engine import EmbeddedEngine
    from reinforge.models.moe import grouped_mm_supported
    from reinforge.records import GenerateRequest, SamplingParams

    dev = torch.device("cuda")
    if not grouped_mm_supported(dev, torch.bfloat16):
        pytest.skip("no decode graphs for an MoE model before Hopper")
    greedy = SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True)
    prompts = [ids_batch(s, B=1, T=5 + 3 * s)[0].tolist() for s in range(4)]
    out = {}
    for graphs in (True, False):
        eng = EmbeddedEngine(
            build_model(glm_path, torch.bfloat16, dev),
            EngineConfig(max_num_seqs=6, cuda_graph=graphs),
            max_model_len=64,
            record_routes=True,
        )
        out[graphs] = eng.generate([GenerateRequest(p, greedy) for p in prompts])
        assert bool(eng.runner._graphs) == graphs
    for (g,), (e,) in zip(out[True], out[False]):
        assert g.token_ids == e.token_ids and torch.equal(g.routed_experts, e.routed_experts)
        assert max(abs(a - b) for a, b in zip(g.log_probs, e.log_probs)) < 1e-2
