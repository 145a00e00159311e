"""Mixture-of-experts models (qwen3_moe, qwen2_moe): parity with transformers, the grouped and loop
expert paths, routing record / replay, the load-balancing loss, hub-layout loading and export, the
embedded engine, LoRA and a short GRPO run."""

import json
import shutil

import pytest
import torch

from reinforge.models.loading import build_model, save_hf_folder
from reinforge.models.moe import Routing, SparseMoeBlock, hub_named_tensors, stack_expert_weights
from reinforge.models.transformer import CausalLM, Variant
from reinforge.utils.triton import triton_available
from tests.conftest import make_tiny_model

CONFIGS = {
    # layer 1 dense through mlp_only_layers; norm_topk_prob as Qwen3-30B-A3B
    "qwen3_moe": dict(num_hidden_layers=3, mlp_only_layers=[1], norm_topk_prob=True, head_dim=16),
    # layers 0 and 2 dense through decoder_sparse_step=2; a shared expert; norm_topk_prob off as Qwen2-MoE
    "qwen2_moe": dict(
        num_hidden_layers=4, decoder_sparse_step=2, shared_expert_intermediate_size=48, norm_topk_prob=False
    ),
}


def make_tiny_moe(out, tokenizer_src, model_type, seed=0):
    """A random tiny MoE model saved by transformers (the hub's per-expert layout) with SmolLM2's tokenizer."""
    return make_tiny_model(
        out,
        tokenizer_src,
        model_type,
        seed,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=2,
        **CONFIGS[model_type],
    )


@pytest.fixture(scope="module")
def qwen3_moe_path(tmp_path_factory, smollm2_path):
    return make_tiny_moe(tmp_path_factory.mktemp("qwen3_moe"), smollm2_path, "qwen3_moe")


@pytest.fixture(scope="module", params=list(CONFIGS))
def moe_path(request, tmp_path_factory, smollm2_path):
    if request.param == "qwen3_moe":
        return request.getfixturevalue("qwen3_moe_path")
    return make_tiny_moe(tmp_path_factory.mktemp(request.param), smollm2_path, request.param)


def ids_batch(seed=0, B=2, T=11):
    return torch.randint(10, 40000, (B, T), generator=torch.Generator().manual_seed(seed))


def hf_model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def test_hub_checkpoint_is_per_expert_and_loads_stacked(moe_path):
    from safetensors import safe_open

    with safe_open(str(moe_path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert any(".mlp.experts.0.gate_proj.weight" in k for k in keys)  # what the test feeds in: the hub layout
    model = build_model(moe_path, torch.float32)
    args = model.args
    assert args.moe_layers == ((0, 2) if args.model_type == "qwen3_moe" else (1, 3))
    for i, layer in enumerate(model.model.layers):
        assert isinstance(layer.mlp, SparseMoeBlock) == (i in args.moe_layers)
    gu = model.model.layers[args.moe_layers[0]].mlp.experts.gate_up_proj
    assert gu.shape == (8, 64, 64)  # [E, 2I, H]


def test_logits_match_transformers_fp32(moe_path):
    ids = ids_batch()
    ours = build_model(moe_path, torch.float32).eval()
    with torch.no_grad():
        ref, got = hf_model(moe_path)(ids).logits, ours(ids)
    assert (ref - got).abs().max().item() < 1e-4
    # the engine's inference variant (fused shared-expert projections) computes the same
    ours.set_variant(Variant.for_inference())
    with torch.no_grad():
        assert (ours(ids) - got).abs().max().item() < 1e-5


@pytest.mark.parametrize("experts", [8, 256, 300, 40000])  # uint8, uint8, int16, int64 sort keys
def test_sort_by_expert_is_the_stable_argsort(experts):
    from reinforge.models.moe_dispatch import sort_by_expert

    flat = torch.randint(0, experts, (4099,), generator=torch.Generator().manual_seed(experts))
    assert torch.equal(sort_by_expert(flat, experts), torch.argsort(flat, stable=True))
    if torch.cuda.is_available():
        assert torch.equal(sort_by_expert(flat.cuda(), experts).cpu(), torch.argsort(flat, stable=True))


@pytest.mark.skipif(not triton_available("cuda"), reason="the permutation kernels run on CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k, hidden", [(2, 32), (6, 1100)])  # k not a power of two; several 1024-wide blocks
def test_permutation_kernels_match_pytorch_indexing(monkeypatch, dtype, k, hidden):
    """models/moe_dispatch.py: the dispatch and combine kernels give the PyTorch indexing's outputs
    and gradients (in x and in the gate weights), with an empty batch too."""
    from reinforge.models import moe_dispatch as D

    torch.manual_seed(0)
    N, E = 37, 8
    ids = torch.stack([torch.randperm(E)[:k] for _ in range(N)]).cuda()
    order = torch.argsort(ids.reshape(-1), stable=True)
    A = torch.randn(hidden, hidden, device="cuda").to(dtype) / hidden**0.5
    results = []
    for fused in (False, True):
        monkeypatch.setattr(D, "_fused", lambda t, fused=fused: fused)
        torch.manual_seed(1)
        x = torch.randn(N, hidden, device="cuda").to(dtype).requires_grad_()
        w = torch.rand(N, k, device="cuda").requires_grad_()
        xs, pos = D.dispatch(x, order, k)
        y = D.combine(torch.tanh(xs @ A), pos, w)
        (y.float() * torch.linspace(-1, 1, hidden, device="cuda")).sum().backward()
        results.append((y.detach().float(), x.grad.float(), w.grad))
        empty_x = torch.randn(0, hidden, device="cuda", dtype=dtype)
        xs0, pos0 = D.dispatch(empty_x, order[:0], k)
        assert xs0.shape == (0, hidden) and D.combine(xs0, pos0, w[:0]).shape == (0, hidden)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for a, b in zip(*results):
        assert (a - b).abs().max() <= tol * b.abs().max()


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="torch._grouped_mm is missing")
def test_grouped_and_loop_paths_agree_with_gradients(monkeypatch):
    torch.manual_seed(0)
    block = SparseMoeBlock(32, num_experts=6, top_k=2, intermediate_size=16, norm_topk_prob=True, layer=0)
    for p in block.parameters():
        torch.nn.init.normal_(p, 0, 0.3)
    x = torch.randn(3, 7, 32)
    results = []
    for grouped in (False, True):
        monkeypatch.setattr(SparseMoeBlock, "grouped", grouped)
        block.zero_grad()
        xg = x.clone().requires_grad_(True)
        try:
            y = block(xg)
        except (RuntimeError, NotImplementedError) as e:  # torch._grouped_mm without a CPU kernel (torch < 2.13)
            pytest.skip(f"torch._grouped_mm does not run on CPU here: {e}")
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        results.append((y.detach(), xg.grad, {n: p.grad.clone() for n, p in block.named_parameters()}))
    (y0, gx0, g0), (y1, gx1, g1) = results
    assert torch.allclose(y0, y1, atol=1e-5) and torch.allclose(gx0, gx1, atol=1e-5)
    for n in g0:
        assert torch.allclose(g0[n], g1[n], atol=1e-5), n


def test_routing_record_and_replay(qwen3_moe_path):
    model = build_model(qwen3_moe_path, torch.float32).eval()
    ids = ids_batch(1)
    with torch.no_grad():
        rec = Routing(record=True)
        base = model(ids, routing=rec)
        assert sorted(rec.experts) == [0, 2] and rec.experts[0].shape == (ids.numel(), 2)
        assert rec.experts[0].dtype == torch.int64
        # replaying the router's own choice computes the same thing (a dict or an [L, N, k] tensor)
        assert torch.equal(model(ids, routing=Routing(replay=dict(rec.experts))), base)
        stacked = torch.stack([rec.experts.get(i, rec.experts[0]) for i in range(3)])
        assert torch.equal(model(ids, routing=Routing(replay=stacked)), base)
        # other experts: other outputs, and the replayed experts are the ones used
        other = {i: (e + 3) % 8 for i, e in rec.experts.items()}
        again = Routing(replay=other, record=True)
        changed = model(ids, routing=again)
        assert (changed - base).abs().max().item() > 1e-3
        assert all(torch.equal(again.experts[i], other[i]) for i in other)
        with pytest.raises(ValueError, match=r"Routing.replay\[0\]"):
            model(ids, routing=Routing(replay={0: rec.experts[0][:3], 2: rec.experts[2]}))


def test_replay_weights_are_renormalised_router_probabilities():
    torch.manual_seed(0)
    for norm in (True, False):
        block = SparseMoeBlock(16, num_experts=4, top_k=2, intermediate_size=8, norm_topk_prob=norm, layer=0)
        for p in block.parameters():
            torch.nn.init.normal_(p, 0, 0.5)
        x = torch.randn(1, 5, 16)
        chosen = torch.tensor([[3, 1]] * 5)
        with torch.no_grad():
            got = block(x, Routing(replay={0: chosen}))
            p = torch.softmax(block.gate(x[0]), -1)[:, [3, 1]]
            w = p / p.sum(-1, keepdim=True) if norm else p
            gu, down = block.experts.gate_up_proj, block.experts.down_proj

            def expert(e, h):
                g, u = (h @ gu[e].T).chunk(2, -1)
                return (torch.nn.functional.silu(g) * u) @ down[e].T

            want = w[:, :1] * expert(3, x[0]) + w[:, 1:] * expert(1, x[0])
        assert torch.allclose(got[0], want, atol=1e-5)


def test_load_balancing_loss_matches_transformers(moe_path):
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    ids = ids_batch(2, B=3, T=9)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 4:] = 0
    hf = hf_model(moe_path)
    with torch.no_grad():
        out = hf(ids, attention_mask=mask, output_router_logits=True)
    assert len(out.router_logits) == 2  # the MoE layers only
    model = build_model(moe_path, torch.float32)
    for token_mask in (None, mask):
        routing = Routing(aux_loss=True, token_mask=token_mask)
        with torch.no_grad():
            model(ids, routing=routing)
        with torch.no_grad():
            logits = out.router_logits if token_mask is not None else hf(ids, output_router_logits=True).router_logits
        ref = load_balancing_loss_func(tuple(logits), 8, 2, token_mask)
        assert abs(routing.load_balancing_loss().item() - float(ref)) < 1e-5
    # with gradients in the routers' weights
    routing = Routing(aux_loss=True)
    model(ids, routing=routing)
    routing.load_balancing_loss().backward()
    gate = model.model.layers[model.args.moe_layers[0]].mlp.gate.weight
    assert gate.grad is not None and gate.grad.abs().sum() > 0
    with pytest.raises(RuntimeError, match="aux_loss=True"):
        Routing().load_balancing_loss()


def test_export_writes_the_hub_layout_and_loads_in_transformers(moe_path, tmp_path):
    from safetensors import safe_open

    model = build_model(moe_path, torch.float32).eval()
    out = save_hf_folder(model, tmp_path / "export", moe_path)
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert not any(k.endswith(("gate_up_proj", "experts.down_proj")) for k in keys)
    assert any(k.endswith("mlp.experts.7.down_proj.weight") for k in keys)
    ids = ids_batch(3)
    with torch.no_grad():
        assert (hf_model(out)(ids).logits - model(ids)).abs().max().item() < 1e-4
    # an already stacked checkpoint (our state dict as is) loads too
    from safetensors.torch import save_file

    stacked = tmp_path / "stacked"
    stacked.mkdir()
    shutil.copy2(moe_path / "config.json", stacked / "config.json")
    save_file(
        {n: t.contiguous() for n, t in model.state_dict().items() if n != "lm_head.weight"},
        str(stacked / "model.safetensors"),
    )
    with torch.no_grad():
        assert (build_model(stacked, torch.float32)(ids) - model(ids)).abs().max().item() < 1e-5


def test_hub_and_stacked_layouts_convert_both_ways():
    g = torch.Generator().manual_seed(0)
    state = {
        "model.layers.0.mlp.experts.gate_up_proj": torch.randn(3, 8, 5, generator=g),
        "model.layers.0.mlp.experts.down_proj": torch.randn(3, 5, 4, generator=g),
        "model.layers.0.mlp.gate.weight": torch.randn(3, 5, generator=g),
    }
    hub = dict(hub_named_tensors(state.items()))
    assert hub["model.layers.0.mlp.experts.2.up_proj.weight"].shape == (4, 5)
    assert torch.equal(
        hub["model.layers.0.mlp.experts.1.gate_proj.weight"], state["model.layers.0.mlp.experts.gate_up_proj"][1, :4]
    )
    back = stack_expert_weights(dict(hub))
    assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in state)
    del hub["model.layers.0.mlp.experts.1.up_proj.weight"]
    with pytest.raises(KeyError, match=r"experts\.1\.up_proj\.weight is missing"):
        stack_expert_weights(hub, "some/folder")


def test_unsupported_moe_options_are_refused():
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(
        "qwen3_moe",
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=8,
        use_sliding_window=True,
        sliding_window=16,
    )
    with pytest.raises(NotImplementedError, match="sliding"):
        CausalLM(cfg)


def test_embedded_engine_log_probs_match_trainer(qwen3_moe_path):
    from reinforge.config import EngineConfig
    from reinforge.engine import EmbeddedEngine
    from reinforge.models.loading import load_tokenizer
    from reinforge.records import GenerateRequest, SamplingParams

    tok = load_tokenizer(qwen3_moe_path)
    engine = EmbeddedEngine(
        build_model(qwen3_moe_path, torch.float32),
        EngineConfig(max_num_seqs=4, kv_block_size=4),
        max_model_len=64,
        tokenizer=tok,
    )
    trainer = build_model(qwen3_moe_path, torch.float32).eval()
    prompts = [ids_batch(s, B=1, T=5 + 3 * s)[0].tolist() for s in range(3)]
    results = engine.generate(
        [GenerateRequest(p, SamplingParams(max_new_tokens=10, temperature=0.8), n=2) for p in prompts]
    )
    diffs = []
    for p, group in zip(prompts, results):
        for r in group:
            ids = torch.tensor([p + r.token_ids])
            with torch.no_grad():
                logits = trainer(ids)[0, len(p) - 1 : -1] / 0.8
            ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r.token_ids)[:, None])[:, 0]
            diffs.append((ref - torch.tensor(r.log_probs)).abs())
    assert torch.cat(diffs).max().item() < 1e-4


def test_lora_targets_attention_and_refuses_experts(qwen3_moe_path):
    pytest.importorskip("peft")
    from reinforge.models.lora import apply_lora, merged_named_weights

    model = apply_lora(build_model(qwen3_moe_path, torch.float32), 4, 8.0, 0.0, ["q_proj", "v_proj"])
    names = dict(merged_named_weights(model))
    assert "model.layers.0.mlp.experts.gate_up_proj" in names and "model.layers.0.self_attn.q_proj.weight" in names
    assert not any("lora_" in n for n in names)
    model(ids_batch()).sum().backward()  # the adapted MoE model trains
    for bad in (["q_proj", "experts"], ["gate_up_proj"]):
        with pytest.raises(ValueError, match="not LoRA targets"):
            apply_lora(build_model(qwen3_moe_path, torch.float32), 4, 8.0, 0.0, bad)


def test_aux_loss_coeff_needs_a_moe_model(tiny_model_path):
    from reinforge.config import load_config
    from reinforge.train.actor import Actor

    cfg = load_config(None, [f"model.path={tiny_model_path}", "train.moe_aux_loss_coeff=0.01", "train.device=cpu"])
    with pytest.raises(ValueError, match="moe_aux_loss_coeff"):
        Actor(cfg, tiny_model_path, torch.device("cpu"))


def test_grpo_runs_on_a_tiny_moe_model_with_the_aux_loss(tmp_path, qwen3_moe_path):
    from reinforge.checkpoint import resolve_checkpoint
    from reinforge.config import load_config
    from reinforge.loop import run_training
    from tests.integration.test_integration import read_metrics, tiny_overrides

    out = tmp_path / "run"
    cfg = load_config(
        None,
        tiny_overrides(
            qwen3_moe_path,
            out,
            **{
                "train.moe_aux_loss_coeff": 0.01,
                "model.train_dtype": "fp32",  # (both sides in fp32 on a GPU too: the log-prob bound below)
                "engine.dtype": "fp32",
                "reward.type": "custom",
                "reward.function_path": "tests.reward_fns:even_first_token",
                "data.n_eval_prompts": 0,
                "eval.eval_before_train": "false",
                "train.num_rollout": 1,
            },
        ),
    )
    run_training(cfg)
    (m,) = [m for m in read_metrics(out) if "train/loss" in m]
    assert 0 < m["train/moe_aux_loss"] < 8  # about k = 2 at a balanced load, E = 8 at most
    assert m["train/logprob_abs_diff"] < 1e-4  # the engine and the trainer compute the same MoE model
    ckpt = resolve_checkpoint(out)
    assert json.loads((ckpt / "model" / "config.json").read_text())["model_type"] == "qwen3_moe"
    before, after = build_model(qwen3_moe_path, torch.float32), build_model(ckpt / "model", torch.float32)
    gate = "model.layers.0.mlp.gate.weight"
    assert not torch.equal(before.state_dict()[gate], after.state_dict()[gate])


def test_model_shape_counts_the_experts_of_a_folder_without_weights(tmp_path):
    """The resource checks' parameter count of a config-only (random_init) MoE folder includes every
    expert (within the estimate's attention approximation)."""
    import json

    from transformers import AutoConfig

    from reinforge.models.shape import model_shape
    from reinforge.models.transformer import CausalLM

    cfg = AutoConfig.for_model(
        "qwen3_moe",
        vocab_size=1000,
        hidden_size=64,
        moe_intermediate_size=128,
        num_experts=32,
        num_experts_per_tok=4,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=16,
    )
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    with torch.device("meta"):
        exact = sum(p.numel() for p in CausalLM(cfg).parameters())
    assert abs(model_shape(tmp_path).num_params - exact) / exact < 0.1


def test_aux_loss_counts_every_sample_when_some_advantages_are_zero(qwen3_moe_path):
    """Issue 51 B1: the samples of zero advantage are skipped only when no other term needs them; the
    load-balancing loss covers every token of the step, so its weight must not shrink with the fraction of
    tokens whose advantage is non-zero (group 1 of ``group_rollout`` has equal rewards: all-zero advantages;
    rewards 0 and 1e-30 there instead give it advantages of +-5e-31, without GRPO's std normalization)."""
    from reinforge.config import load_config
    from reinforge.train.worker import TrainWorker
    from tests.unit.test_packing import group_rollout, train_rollout

    def step_metrics(groups) -> dict[str, float]:
        overrides = {
            "model.path": qwen3_moe_path,
            "model.train_dtype": "fp32",
            "train.device": "cpu",
            "train.moe_aux_loss_coeff": 0.5,
            "algo.entropy_coef": 0.0,
            "algo.grpo_std_normalization": "false",
        }
        cfg = load_config(None, [f"{k}={v}" for k, v in overrides.items()])
        return train_rollout(TrainWorker(cfg, qwen3_moe_path), groups)

    def rewards(tiny: bool):
        return lambda p, k: (1e-30 * (k % 2) if tiny else 0.0) if p == 1 else float(p + k % 3)

    skipped = step_metrics(group_rollout(rewards=rewards(False)))
    kept = step_metrics(group_rollout(rewards=rewards(True)))
    assert skipped["train/loss"] == pytest.approx(kept["train/loss"], rel=1e-5, abs=1e-7)
    assert skipped["train/moe_aux_loss"] == pytest.approx(kept["train/moe_aux_loss"], rel=1e-5)
    assert skipped["train/trained_token_fraction"] == 1.0
