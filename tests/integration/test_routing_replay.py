"""Rollout routing replay (``algo.use_rollout_routing_replay``): the embedded engine records the
experts behind every generated token, and the trainer's policy forward replays them.

A tiny random qwen3_moe model with 16 experts (top 2) whose last decoder layer is an MoE layer: the
exactness test perturbs only that layer's router, so the prompt positions' routing (left to the
router) cannot change what the response positions see."""

import pytest
import torch

from reinforge.config import ConfigError, EngineConfig, load_config
from reinforge.engine import EmbeddedEngine
from reinforge.models.loading import build_model
from reinforge.models.moe import Routing
from reinforge.records import GenerateRequest, Sample, SamplingParams
from tests.conftest import make_tiny_model

E, K = 16, 2


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory, smollm2_path):
    return make_tiny_model(
        tmp_path_factory.mktemp("qwen3_moe_16"),
        smollm2_path,
        "qwen3_moe",
        intermediate_size=96,
        moe_intermediate_size=32,
        num_experts=E,
        num_experts_per_tok=K,
        head_dim=16,
        num_hidden_layers=3,
        mlp_only_layers=[1],
        norm_topk_prob=True,
    )


def prompts(n=3):
    g = torch.Generator().manual_seed(5)
    return [torch.randint(10, 40000, (5 + 3 * i,), generator=g).tolist() for i in range(n)]


def engine(path, **cfg):
    return EmbeddedEngine(
        build_model(path, torch.float32),
        EngineConfig(**{"max_num_seqs": 6, "kv_block_size": 4, **cfg}),
        max_model_len=64,
        record_routes=True,
    )


def router_routes(model, prompt, tokens):
    """The trainer's own router: experts [len(tokens), layers, k] at the positions predicting ``tokens``."""
    routing = Routing(record=True)
    with torch.no_grad():
        model(torch.tensor([prompt + tokens]), routing=routing)
    P, n = len(prompt), len(tokens)
    return torch.stack([routing.experts[i][P - 1 : P - 1 + n] for i in model.args.moe_layers], 1)


def test_replay_rows_of_minus_one_are_left_to_the_router(moe_path):
    model = build_model(moe_path, torch.float32).eval()
    ids = torch.tensor([prompts(1)[0]])
    rec = Routing(record=True)
    with torch.no_grad():
        base = model(ids, routing=rec)
        N = ids.numel()
        forced = {i: (rec.experts[i] + 1) % E for i in model.args.moe_layers}
        # all -1: the router decides everywhere (same as no replay)
        none = {i: torch.full((N, K), -1) for i in model.args.moe_layers}
        assert torch.equal(model(ids, routing=Routing(replay=none)), base)
        # the last position forced to other experts, the rest -1
        mixed = {i: torch.cat([torch.full((N - 1, K), -1), forced[i][-1:]]) for i in model.args.moe_layers}
        again = Routing(replay=mixed, record=True)
        out = model(ids, routing=again)
    assert torch.allclose(out[0, :-1], base[0, :-1], atol=1e-5) and not torch.allclose(out[0, -1], base[0, -1])
    for i in model.args.moe_layers:
        assert torch.equal(again.experts[i][:-1], rec.experts[i][:-1])
        assert torch.equal(again.experts[i][-1], forced[i][-1])


# an ample pool; one small enough to preempt (recompute); prompts prefilled in chunks of columns
@pytest.mark.parametrize("pool,prefill", [(None, 8192), (20, 8192), (None, 4)], ids=["ample", "preempt", "chunked"])
def test_engine_routes_equal_the_trainers_router(moe_path, pool, prefill):
    eng = engine(moe_path, sync_interval=3, num_kv_blocks=pool, max_prefill_tokens=prefill)
    eng._overlap = pool is not None  # the overlap scheduler's bookkeeping too (exercised on CPU)
    trainer = build_model(moe_path, torch.float32).eval()
    ps = prompts()
    stop = SamplingParams(max_new_tokens=20, temperature=1.0, ignore_eos=True)
    results = eng.generate([GenerateRequest(p, stop, n=2) for p in ps])
    assert (eng.num_preemptions > 0) == (pool is not None)
    for p, group in zip(ps, results):
        for r in group:
            got = r.routed_experts
            assert got.dtype == torch.uint8 and tuple(got.shape) == (len(r.token_ids), 2, K)
            want = router_routes(trainer, p, r.token_ids)
            assert torch.equal(got.long().sort(-1).values, want.sort(-1).values)


def test_routes_off_by_default_and_aborts_keep_theirs(moe_path):
    plain = EmbeddedEngine(build_model(moe_path, torch.float32), EngineConfig(max_num_seqs=2), max_model_len=64)
    ((r,),) = plain.generate([GenerateRequest(prompts(1)[0], SamplingParams(max_new_tokens=4))])
    assert r.routed_experts is None and plain.runner.out_routes is None
    eng = engine(moe_path)
    group = eng.add_request(GenerateRequest(prompts(1)[0], SamplingParams(max_new_tokens=30, ignore_eos=True), n=2))
    waiting = eng.add_request(GenerateRequest(prompts(2)[1], SamplingParams(max_new_tokens=30), n=6))  # no slots
    eng.step()
    eng.step()
    eng.abort(group.request.request_id, waiting.request.request_id)
    for r in group.results + waiting.results:
        assert r.finish_reason.value == "abort"
        assert r.routed_experts.shape == (len(r.token_ids), 2, K)
    assert all(len(r.token_ids) > 0 for r in group.results) and all(not r.token_ids for r in waiting.results)


def rollout_samples(path, n_prompts=2):
    eng = engine(path)
    ps = prompts(n_prompts)
    results = eng.generate(
        [GenerateRequest(p, SamplingParams(max_new_tokens=10, temperature=1.0, ignore_eos=True), n=2) for p in ps]
    )
    return [
        Sample(
            prompt="",
            tokens=p + r.token_ids,
            response_length=len(r.token_ids),
            index=2 * g + j,
            group_index=g,
            loss_mask=[1] * len(r.token_ids),
            rollout_log_probs=r.log_probs,
            routed_experts=r.routed_experts,
        )
        for g, (p, group) in enumerate(zip(ps, results))
        for j, r in enumerate(group)
    ]


def actor(path, replay, packing="none"):
    from reinforge.train.actor import Actor

    cfg = load_config(
        None,
        [
            f"model.path={path}",
            "train.device=cpu",
            f"train.packing={packing}",
            f"algo.use_rollout_routing_replay={str(replay).lower()}",
        ],
    )
    return Actor(cfg, path, torch.device("cpu"))


@pytest.mark.parametrize("packing", ["none", "sequences", "shared_prompt"])
def test_replay_makes_the_trainer_compute_the_engines_log_probs(moe_path, packing):
    samples = rollout_samples(moe_path)
    routes = torch.cat([s.routed_experts for s in samples]).long()  # [N, layers, k]
    last = 1  # the last MoE layer (decoder layer 2, the model's last): nothing later reads its prompt positions
    used = set(routes[:, last].reshape(-1).tolist())
    c = next(e for e in range(E) if e not in used)  # an expert the engine never chose there
    busiest = routes[:, last].reshape(-1).mode().values.item()
    diffs = {}
    for replay in (True, False):
        a = actor(moe_path, replay, packing)
        gate = a.model.model.layers[2].mlp.gate.weight
        with torch.no_grad():  # the trainer's router now prefers c where the busiest expert scores high:
            gate[c] = 5 * gate[busiest]  # the replayed experts' probability ratios are unchanged
        lps = a.compute_log_probs(samples)
        diffs[replay] = torch.cat([(lp - torch.tensor(s.rollout_log_probs)).abs() for lp, s in zip(lps, samples)])
        if replay:  # the trainer's own router would pick other experts at response positions
            own = torch.cat([router_routes(a.model, s.tokens[: s.prompt_length], s.response_ids) for s in samples])
            assert (own[:, last] == c).any()
    assert diffs[True].max().item() < 1e-5
    assert diffs[False].max().item() > 1e-2


def test_replay_checks_its_inputs(moe_path, tiny_model_path):
    from reinforge.train.batching import build
    from reinforge.train.routing_replay import replay_experts

    with pytest.raises(ValueError, match="use_rollout_routing_replay.*dense"):
        actor(tiny_model_path, True)
    with pytest.raises(ValueError, match="use_rollout_routing_replay.*dense"):
        EmbeddedEngine(
            build_model(tiny_model_path, torch.float32),
            EngineConfig(max_num_seqs=2),
            max_model_len=32,
            record_routes=True,
        )
    s = Sample(prompt="", tokens=[5, 6, 7, 8], response_length=2, loss_mask=[1, 1], rollout_log_probs=[0.0, 0.0])
    mb = build([s.tokens], [2], [s.loss_mask], [[0]], 0)
    with pytest.raises(ValueError, match="no recorded expert routes"):
        replay_experts(mb, [s], (0, 2), K)
    s.routed_experts = torch.zeros(3, 2, K, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"shape \(3, 2, 2\)"):
        replay_experts(mb, [s], (0, 2), K)
    s.routed_experts = torch.tensor([[[1, 2], [3, 4]], [[5, 6], [7, 8]]], dtype=torch.uint8)
    ids = replay_experts(mb, [s], (0, 2), K)
    assert ids[2].tolist() == [[-1, -1], [3, 4], [7, 8], [-1, -1]]  # positions 1 and 2 predict tokens 7, 8
    for bad, match in (
        (["engine.backend=vllm"], "engine.backend=vllm"),
        (["rollout.custom_generate_function_path=reinforge.rollout.agent:generate"], "custom_generate_function_path"),
    ):
        with pytest.raises(ConfigError, match=match):
            load_config(None, ["algo.use_rollout_routing_replay=true", *bad])


def test_backends_that_cannot_record_are_refused(moe_path):
    from reinforge.rollout.backends import EngineSpec, build_engine

    spec = EngineSpec(
        engine=EngineConfig(backend="hf"),
        model_path=moe_path,
        tokenizer=None,
        device=torch.device("cpu"),
        dtype=torch.float32,
        max_model_len=32,
        seed=0,
        record_routes=True,
    )
    with pytest.raises(ValueError, match="use_rollout_routing_replay.*engine.backend=hf"):
        build_engine(spec)


def test_grpo_runs_with_routing_replay(tmp_path, moe_path):
    from reinforge.loop import run_training
    from tests.integration.test_integration import read_metrics, tiny_overrides

    out = tmp_path / "run"
    cfg = load_config(
        None,
        tiny_overrides(
            moe_path,
            out,
            **{
                "algo.use_rollout_routing_replay": "true",
                "reward.type": "custom",
                "reward.function_path": "tests.reward_fns:even_first_token",
                "data.n_eval_prompts": 0,
                "eval.eval_before_train": "false",
                "train.num_rollout": 1,
                "train.num_steps_per_rollout": 2,
                # fp32 on both sides on a GPU too (bf16 would differ by ~0.02 from rounding alone)
                "model.train_dtype": "fp32",
                "engine.dtype": "fp32",
            },
        ),
    )
    run_training(cfg)
    (m,) = [m for m in read_metrics(out) if "train/loss" in m]
    assert m["train/logprob_abs_diff"] < 1e-5  # the train-vs-rollout log-prob difference, logged


@pytest.mark.skipif(not torch.cuda.is_available(), reason="decode CUDA graphs (CUDA)")
def test_routes_recorded_inside_decode_cuda_graphs(moe_path):
    """bf16 on Hopper: the MoE decode step is captured; the routes written inside the graphs equal
    those of eager decode steps (the trainer's router is compared in fp32 on the CPU: bf16 rounding
    flips a random tiny router's near-ties, measured in bench/routing_replay.py)."""
    from reinforge.models.moe import grouped_mm_supported

    dev = torch.device("cuda")
    if not grouped_mm_supported(dev, torch.bfloat16):
        pytest.skip("no decode graphs for an MoE model before Hopper")
    greedy = SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True)
    out = {}
    for graphs in (True, False):
        eng = EmbeddedEngine(
            build_model(moe_path, torch.bfloat16, dev),
            EngineConfig(max_num_seqs=6, cuda_graph=graphs),
            max_model_len=64,
            record_routes=True,
        )
        out[graphs] = eng.generate([GenerateRequest(p, greedy) for p in prompts()])
        assert bool(eng.runner._graphs) == graphs
    for (g,), (e,) in zip(out[True], out[False]):
        assert g.token_ids == e.token_ids and torch.equal(g.routed_experts, e.routed_experts)


def test_partial_rollouts_stitch_their_routes():
    """A sample continued after a weight update (asynchronous partial rollouts, over-sampling's
    carry-over) keeps the routes of every piece, in order."""
    from reinforge.records import FinishReason, GenerateResult
    from reinforge.rollout.async_rollout import PartialSample

    part = PartialSample(GenerateRequest([1, 2, 3], SamplingParams(max_new_tokens=5)))
    a, b = torch.zeros(2, 2, K, dtype=torch.uint8), torch.ones(3, 2, K, dtype=torch.uint8)
    part.add(GenerateResult([4, 5], [-0.1, -0.2], FinishReason.ABORT, 0, routed_experts=a), interrupted=True)
    assert part.result is None and part.continuation().prompt_ids == [1, 2, 3, 4, 5]
    part.add(GenerateResult([6, 7, 8], [-0.3] * 3, FinishReason.LENGTH, 1, routed_experts=b), interrupted=False)
    assert part.result.token_ids == [4, 5, 6, 7, 8] and torch.equal(part.result.routed_experts, torch.cat([a, b]))
