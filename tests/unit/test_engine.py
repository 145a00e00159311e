"""The embedded engine: scheduling, greedy parity with transformers, log-prob parity, weight sync."""

import pytest
import torch

from reinforge.config import EngineConfig
from reinforge.engine import EmbeddedEngine
from reinforge.models.loading import build_model, load_tokenizer
from reinforge.records import FinishReason, GenerateRequest, SamplingParams


@pytest.fixture(scope="module")
def tok(smollm2_path):
    return load_tokenizer(smollm2_path)


@pytest.fixture(params=[(0, False), (4, False), (4, True)], ids=["one-block-per-seq", "paged", "paged-overlap"])
def engine(request, tiny_model_path, tok):
    """Every engine test runs on both KV layouts: one block of max_model_len per slot (the CPU
    default) and 4-token blocks through the block table (the GPU's layout, torch attention here);
    and with the GPU's overlap scheduler (finished sequences read back one run of decode steps late)."""
    block, overlap = request.param
    model = build_model(tiny_model_path, torch.float32)
    cfg = EngineConfig(max_num_seqs=8, sync_interval=3, kv_block_size=block)
    eng = EmbeddedEngine(model, cfg, max_model_len=96, tokenizer=tok)
    eng._overlap = overlap
    return eng


def prompts(tok, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(10, 40000, (int(torch.randint(3, 20, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n)
    ]


def trainer_log_probs(model, prompt, completion, temperature=1.0):
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids)[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


def test_greedy_matches_transformers_generate(engine, tiny_model_path, tok):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    ps = prompts(tok, 5)
    sp = SamplingParams(max_new_tokens=12, temperature=0.0)
    results = engine.generate([GenerateRequest(p, sp) for p in ps])
    for p, (r,) in zip(ps, results):
        ref = hf.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)[
            0, len(p) :
        ].tolist()
        assert r.token_ids == ref
        assert r.finish_reason == FinishReason.LENGTH


def test_log_probs_match_trainer_fp32(engine, tiny_model_path, tok):
    trainer = build_model(tiny_model_path, torch.float32)
    ps = prompts(tok, 4, seed=1)
    sp = SamplingParams(max_new_tokens=20, temperature=0.7)
    diffs = []
    for p, group in zip(ps, engine.generate([GenerateRequest(p, sp, n=3) for p in ps])):
        for r in group:
            ref = trainer_log_probs(trainer, p, r.token_ids, temperature=0.7)
            diffs.append((ref - torch.tensor(r.log_probs)).abs())
    assert torch.cat(diffs).mean().item() < 1e-5


def test_more_requests_than_slots_and_varied_lengths(engine, tok):
    ps = prompts(tok, 6, seed=2)
    reqs = [
        GenerateRequest(p, SamplingParams(max_new_tokens=3 + 4 * i, temperature=1.0), n=2) for i, p in enumerate(ps)
    ]  # 12 sequences, 8 slots
    results = engine.generate(reqs)
    for i, group in enumerate(results):
        assert len(group) == 2
        for r in group:
            assert len(r.token_ids) == 3 + 4 * i == len(r.log_probs)
            assert r.finish_reason == FinishReason.LENGTH
    sched = engine.scheduler
    assert not engine.has_unfinished() and len(sched.free) == engine.num_slots
    if sched.layout.paged:
        assert sched.allocator.num_free == sched.allocator.num_blocks  # every block returned


def test_stop_token_ends_and_is_kept(engine, tok):
    p = prompts(tok, 1, seed=3)[0]
    (free,) = engine.generate([GenerateRequest(p, SamplingParams(max_new_tokens=10, temperature=0.0))])[0]
    stop_at = free.token_ids[4]
    first = free.token_ids.index(stop_at)
    (r,) = engine.generate(
        [GenerateRequest(p, SamplingParams(max_new_tokens=10, temperature=0.0, stop_token_ids=[stop_at]))]
    )[0]
    assert r.token_ids == free.token_ids[: first + 1] and r.finish_reason == FinishReason.STOP
    (r2,) = engine.generate(
        [
            GenerateRequest(
                p, SamplingParams(max_new_tokens=10, temperature=0.0, stop_token_ids=[stop_at], ignore_eos=True)
            )
        ]
    )[0]
    assert r2.token_ids == free.token_ids


def test_stop_string(engine, tok):
    p = prompts(tok, 1, seed=4)[0]
    (free,) = engine.generate([GenerateRequest(p, SamplingParams(max_new_tokens=12, temperature=0.0))])[0]
    text = tok.decode(free.token_ids[:6])
    stop = text[-3:] if len(text.strip()) >= 3 else text
    (r,) = engine.generate([GenerateRequest(p, SamplingParams(max_new_tokens=12, temperature=0.0, stop=[stop]))])[0]
    assert stop in tok.decode(r.token_ids) and stop not in tok.decode(r.token_ids[:-1])
    assert r.finish_reason == FinishReason.STOP and r.token_ids == free.token_ids[: len(r.token_ids)]


def test_abort(engine, tok):
    ps = prompts(tok, 3, seed=5)
    sp = SamplingParams(max_new_tokens=60, temperature=1.0)
    groups = [engine.add_request(GenerateRequest(p, sp, n=4, request_id=i)) for i, p in enumerate(ps)]
    engine.step()  # requests 0 and 1 hold all 8 slots, request 2 waits
    engine.abort(0)
    engine.abort(2)
    while engine.has_unfinished():
        engine.step()
    assert all(r.finish_reason == FinishReason.ABORT for r in groups[0].results)
    assert all(r.finish_reason == FinishReason.ABORT and r.token_ids == [] for r in groups[2].results)
    assert all(len(r.token_ids) == 60 for r in groups[1].results)


def test_request_validation(engine, tok):
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request(GenerateRequest([1] * 90, SamplingParams(max_new_tokens=10)))
    with pytest.raises(ValueError, match="slots"):
        engine.add_request(GenerateRequest([1, 2], SamplingParams(max_new_tokens=4), n=9))
    with pytest.raises(ValueError, match="empty prompt"):
        engine.add_request(GenerateRequest([], SamplingParams()))


def test_prefix_sharing_samples_differ_but_share_prompt(engine, tok):
    p = prompts(tok, 1, seed=6)[0]
    (group,) = engine.generate([GenerateRequest(p, SamplingParams(max_new_tokens=16, temperature=1.0), n=6)])
    assert len({tuple(r.token_ids) for r in group}) > 1
    (greedy,) = engine.generate([GenerateRequest(p, SamplingParams(max_new_tokens=16, temperature=0.0), n=3)])
    assert greedy[0].token_ids == greedy[1].token_ids == greedy[2].token_ids


def test_seeded_sampling_is_reproducible(tiny_model_path, tok):
    outs = []
    for _ in range(2):
        eng = EmbeddedEngine(
            build_model(tiny_model_path, torch.float32), EngineConfig(max_num_seqs=8), max_model_len=64, seed=7
        )
        outs.append(eng.generate([GenerateRequest(p, SamplingParams(max_new_tokens=8), n=2) for p in prompts(tok, 3)]))
    assert [[r.token_ids for r in g] for g in outs[0]] == [[r.token_ids for r in g] for g in outs[1]]


def test_top_k_one_is_greedy(engine, tok):
    p = prompts(tok, 1, seed=8)[0]
    (g,) = engine.generate([GenerateRequest(p, SamplingParams(max_new_tokens=10, temperature=0.0))])[0]
    (k,) = engine.generate([GenerateRequest(p, SamplingParams(max_new_tokens=10, temperature=1.0, top_k=1))])[0]
    (tp,) = engine.generate([GenerateRequest(p, SamplingParams(max_new_tokens=10, temperature=1.0, top_p=1e-6))])[0]
    assert g.token_ids == k.token_ids == tp.token_ids


def test_weight_update_changes_outputs(engine, tiny_model_path, tok):
    p = prompts(tok, 1, seed=9)[0]
    sp = SamplingParams(max_new_tokens=10, temperature=0.0)
    (before,) = engine.generate([GenerateRequest(p, sp)])[0]
    other = build_model(tiny_model_path, torch.float32, random_init=True, seed=123)
    engine.update_weights(((n, t) for n, t in other.named_parameters()), version=5)
    (after,) = engine.generate([GenerateRequest(p, sp)])[0]
    assert after.token_ids != before.token_ids and after.weight_version == 5
    with pytest.raises(KeyError, match="no parameter 'bogus'"):
        engine.update_weights([("bogus", torch.zeros(1))], version=6)


def test_sleep_and_wake_up(engine, tok):
    p = prompts(tok, 1, seed=10)[0]
    sp = SamplingParams(max_new_tokens=6, temperature=0.0)
    (a,) = engine.generate([GenerateRequest(p, sp)])[0]
    engine.sleep()
    assert engine.runner.k_cache is None
    with pytest.raises(RuntimeError, match="asleep"):
        engine.generate([GenerateRequest(p, sp)])
    engine.wake_up()
    (b,) = engine.generate([GenerateRequest(p, sp)])[0]
    assert a.token_ids == b.token_ids


def test_sleep_discards_a_policy_engines_weights_until_a_sync_writes_them_all(tiny_model_path, tok):
    """``discard_weights`` (a policy engine, cluster.offload_engine_weights): sleep frees the weights'
    memory outright, no copy kept; generating before weight syncs have rewritten every parameter
    raises; after them the engine generates as before. A frozen model's engine keeps its weights."""
    from reinforge.models.loading import named_weights

    policy = build_model(tiny_model_path, torch.float32, random_init=True)  # (not file-mapped: freeable)
    weights = [(n, t.clone()) for n, t in named_weights(policy)]
    eng = EmbeddedEngine(policy, EngineConfig(max_num_seqs=4), max_model_len=64, tokenizer=tok, discard_weights=True)
    p, sp = prompts(tok, 1, seed=3)[0], SamplingParams(max_new_tokens=6, temperature=0.0)
    (before,) = eng.generate([GenerateRequest(p, sp)])[0]
    eng.sleep(offload_weights=True)
    assert all(q.untyped_storage().nbytes() == 0 for q in eng.model.parameters())
    eng.sleep(offload_weights=True)  # (asleep already: nothing more to free)
    with pytest.raises(RuntimeError, match="wake_up"):  # (no storage to write into)
        eng.update_weights(weights, version=1)
    eng.wake_up()
    eng.update_weights(weights[:3], version=1)  # (the Ray path syncs in buckets: one call per bucket)
    with pytest.raises(RuntimeError, match=r"freed by sleep\(offload_weights=True\) and \d+ parameters"):
        eng.generate([GenerateRequest(p, sp)])
    eng.update_weights(weights[3:], version=1)
    (after,) = eng.generate([GenerateRequest(p, sp)])[0]
    assert after.token_ids == before.token_ids and after.log_probs == before.log_probs

    frozen = build_model(tiny_model_path, torch.float32, random_init=True)
    frozen = EmbeddedEngine(frozen, EngineConfig(max_num_seqs=4), max_model_len=64)
    frozen.sleep(offload_weights=True)
    frozen.wake_up()
    (kept,) = frozen.generate([GenerateRequest(p, sp)])[0]
    assert kept.token_ids == before.token_ids


def test_missing_end_of_turn_stop_token_is_warned(tmp_path, smollm2_path, caplog):
    import json
    import shutil

    from reinforge.rollout.generate import end_of_turn_token_id, model_stop_token_ids

    folder = tmp_path / "m"
    shutil.copytree(smollm2_path, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    tok = load_tokenizer(folder)
    assert end_of_turn_token_id(tok) == 2  # SmolLM2 ends a turn with <|im_end|>
    assert model_stop_token_ids(tok, str(folder), []) == [2] and "rollout_stop_token_ids" not in caplog.text
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 0}))
    with caplog.at_level("WARNING"):
        assert model_stop_token_ids(tok, str(folder), []) == [0]
    assert "'<|im_end|>' (id 2)" in caplog.text and "rollout.rollout_stop_token_ids=[2]" in caplog.text
    assert model_stop_token_ids(tok, str(folder), [2]) == [0, 2]


@pytest.mark.parametrize("draw", ["exponential_race", "inverse_cdf"])
def test_sampling_draws_follow_the_distribution(draw):
    from reinforge.engine import sampling

    p = torch.tensor([0.5, 0.0, 0.2, 0.25, 0.05])
    n = 40000
    idx = getattr(sampling, draw)(p.repeat(n, 1) * 3.0, torch.Generator().manual_seed(0))  # unnormalised rows
    freq = torch.bincount(idx, minlength=5).float() / n
    assert freq[1] == 0
    assert ((freq - p).abs() <= 4 * (p * (1 - p) / n).sqrt() + 1e-9).all(), freq


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the fused sampler is a Triton kernel (CUDA)")
def test_fused_sampler_draws_follow_the_distribution_and_report_exact_log_probs():
    from reinforge.engine.sampling import sample_tokens_fused

    p = torch.tensor([0.5, 0.0, 0.2, 0.25, 0.05] + [0.0] * 5000, device="cuda")
    n = 40000
    logits = p.log().repeat(n, 1).to(torch.bfloat16)
    seed = torch.tensor([7], device="cuda")
    tok, lp = sample_tokens_fused(logits, torch.ones(n, device="cuda"), seed)
    freq = torch.bincount(tok, minlength=5)[:5].float().cpu() / n
    q = p[:5].cpu()
    assert freq[1] == 0 and ((freq - q).abs() <= 4 * (q * (1 - q) / n).sqrt() + 1e-9).all(), freq
    ref = torch.log_softmax(logits.float(), -1).gather(-1, tok[:, None])[:, 0]
    assert (lp - ref).abs().max() < 1e-5
    g = torch.randn(64, 49152, device="cuda")
    temp = torch.where(torch.arange(64, device="cuda") % 2 == 0, 0.0, 0.7)
    tok, lp = sample_tokens_fused(g, temp, seed)
    assert (tok[::2] == g[::2].argmax(-1)).all()  # temperature 0: greedy
    t = torch.where(temp > 0, temp, 1.0)
    ref = torch.log_softmax(g / t[:, None], -1).gather(-1, tok[:, None])[:, 0]
    assert (lp - ref).abs().max() < 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the paged-attention kernel runs on CUDA")
@pytest.mark.parametrize("splits", [None, 3], ids=["auto-splits", "split-K"])
def test_cuda_paged_engine_log_probs_match_trainer_fp32(tiny_model_path, tok, monkeypatch, splits):
    """On the GPU's default path (16-token blocks, Triton attention, fused sampler, CUDA graphs)
    fp32 engine log-probs equal the trainer's, under preemption too, and greedy tokens equal
    those of the one-block-per-sequence layout; also with every sequence's keys split over 3
    programs (split-K: at these short contexts the automatic count is 1, and some splits are empty)."""
    if splits is not None:
        from reinforge.engine import paged_attention

        monkeypatch.setattr(paged_attention, "decode_splits", lambda *a, **k: splits)
    model = build_model(tiny_model_path, torch.float32, "cuda")
    trainer = build_model(tiny_model_path, torch.float32, "cuda")
    ps = prompts(tok, 6, seed=1)
    for blocks in (0, 30):  # ample pool; a pool that forces preemption
        eng = EmbeddedEngine(
            model, EngineConfig(max_num_seqs=12, sync_interval=3, num_kv_blocks=blocks), max_model_len=96
        )
        assert eng.runner.Decode.__name__ == "KernelDecode" and eng.scheduler.layout.block_size == 16
        # RoPE runs inside the attention kernel (no in-place RoPE kernel in the decode step)
        assert all(layer.self_attn.rotates_in_place for layer in model.model.layers)
        diffs = []
        sp = SamplingParams(max_new_tokens=60, temperature=0.7, ignore_eos=True)
        for p, group in zip(ps, eng.generate([GenerateRequest(p, sp, n=2) for p in ps])):
            for r in group:
                ids = torch.tensor([p + r.token_ids], device="cuda")
                with torch.no_grad():
                    logits = trainer(ids)[0, len(p) - 1 : -1].float() / 0.7
                ref = torch.log_softmax(logits, -1).gather(-1, ids[0, len(p) :, None])[:, 0].cpu()
                diffs.append((ref - torch.tensor(r.log_probs)).abs())
        assert torch.cat(diffs).mean().item() < 1e-5
        assert (eng.num_preemptions > 0) == (blocks > 0)
    one = EmbeddedEngine(model, EngineConfig(max_num_seqs=12, kv_block_size=96), max_model_len=96)
    greedy = SamplingParams(max_new_tokens=30, temperature=0.0)
    a = eng.generate([GenerateRequest(p, greedy) for p in ps])
    b = one.generate([GenerateRequest(p, greedy) for p in ps])
    assert [g[0].token_ids for g in a] == [g[0].token_ids for g in b]


def test_preemption_under_a_small_block_pool_keeps_greedy_outputs(tiny_model_path, tok):
    """A pool too small for all sequences at once: the newest are preempted and re-prefilled with
    their tokens so far; greedy outputs and log-probs equal those of an ample pool."""
    model = build_model(tiny_model_path, torch.float32)
    ps = prompts(tok, 4, seed=9)
    reqs = lambda: [
        GenerateRequest(p, SamplingParams(max_new_tokens=40, temperature=0.0), n=2)  # noqa: E731
        for p in ps
    ]
    ample = EmbeddedEngine(model, EngineConfig(max_num_seqs=8, sync_interval=4, kv_block_size=4), max_model_len=64)
    small = EmbeddedEngine(
        model, EngineConfig(max_num_seqs=8, sync_interval=4, kv_block_size=4, num_kv_blocks=40), max_model_len=64
    )
    overlapped = EmbeddedEngine(
        model, EngineConfig(max_num_seqs=8, sync_interval=4, kv_block_size=4, num_kv_blocks=40), max_model_len=64
    )
    overlapped._overlap = True
    want, got, got_overlapped = ample.generate(reqs()), small.generate(reqs()), overlapped.generate(reqs())
    assert ample.num_preemptions == 0 and small.num_preemptions > 0 and overlapped.num_preemptions > 0
    for wg, gg, og in zip(want, got, got_overlapped):
        for w, g, o in zip(wg, gg, og):
            for r in (g, o):
                assert r.token_ids == w.token_ids and r.finish_reason == w.finish_reason == FinishReason.LENGTH
                assert torch.allclose(torch.tensor(r.log_probs), torch.tensor(w.log_probs), atol=1e-4)
    assert small.scheduler.allocator.num_free == overlapped.scheduler.allocator.num_free == 40


def test_paged_prompts_share_full_blocks(tiny_model_path, tok):
    """n samples of a prompt hold its full blocks once and one own copy of its partial block."""
    model = build_model(tiny_model_path, torch.float32)
    eng = EmbeddedEngine(model, EngineConfig(max_num_seqs=8, sync_interval=2, kv_block_size=4), max_model_len=64)
    prompt = list(range(100, 110))  # 2 full blocks + 2 tokens
    eng.add_request(GenerateRequest(prompt, SamplingParams(max_new_tokens=8, temperature=1.0), n=4))
    eng._admit()
    held = [eng.scheduler.blocks[s] for s in range(4)]
    assert all(b[:2] == held[0][:2] for b in held) and len({b[2] for b in held}) == 4
    assert eng.scheduler.allocator.num_blocks - eng.scheduler.allocator.num_free == 2 + 4
    while eng.has_unfinished():
        eng.step()
    assert eng.scheduler.allocator.num_free == eng.scheduler.allocator.num_blocks


def test_num_kv_blocks_below_one_sequence_is_refused(tiny_model_path):
    model = build_model(tiny_model_path, torch.float32)
    with pytest.raises(ValueError, match="num_kv_blocks"):
        EmbeddedEngine(model, EngineConfig(kv_block_size=4, num_kv_blocks=15), max_model_len=64)


@pytest.mark.parametrize("block", [0, 4], ids=["one-block-per-seq", "paged"])
def test_chunked_prefill_matches_one_pass(tiny_model_path, tok, block):
    """Prompts longer than ``max_prefill_tokens`` are prefilled in chunks that attend to the cached
    keys of the earlier chunks: the same greedy tokens and log-probs (fp32) as one pass."""
    model = build_model(tiny_model_path, torch.float32)
    g = torch.Generator().manual_seed(3)
    reqs = [torch.randint(5, 400, (n,), generator=g).tolist() for n in (45, 7, 30)]
    sp = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)
    out = {}
    for budget in (4096, 16):
        cfg = EngineConfig(max_num_seqs=4, kv_block_size=block, max_prefill_tokens=budget)
        eng = EmbeddedEngine(model, cfg, max_model_len=64, tokenizer=tok)
        out[budget] = [r[0] for r in eng.generate([GenerateRequest(p, sp) for p in reqs])]
    for one, chunked in zip(out[4096], out[16]):
        assert one.token_ids == chunked.token_ids
        assert max(abs(a - b) for a, b in zip(one.log_probs, chunked.log_probs)) < 1e-5


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(
                not torch.cuda.is_available(), reason="CUDA: pinned copies, side-stream reads, graphs"
            ),
        ),
    ],
)
def test_overlap_schedule_keeps_outputs_when_slots_turn_over(tiny_model_path, tok, device):
    """More sequences than slots, some ending early on a stop token or a stop string, one request
    aborted mid-way: with the overlap scheduler a finished sequence is read back one run of decode
    steps late (its slot idles meanwhile) and its slot then serves the next request; greedy outputs
    and finish reasons equal the plain schedule's. On CUDA with the GPU's defaults (paged Triton
    attention, CUDA graphs, fused sampler)."""
    model = build_model(tiny_model_path, torch.float32, device)
    ps = prompts(tok, 10, seed=11)

    def engine(overlap):
        block = 4 if device == "cpu" else 0
        eng = EmbeddedEngine(
            model,
            EngineConfig(max_num_seqs=4, sync_interval=3, kv_block_size=block, overlap_schedule=overlap),
            max_model_len=64,
            tokenizer=tok,
        )
        eng._overlap = overlap
        return eng

    plain, overlapped = engine(False), engine(True)
    free = plain.generate([GenerateRequest(p, SamplingParams(max_new_tokens=24, temperature=0.0)) for p in ps])
    stops = sorted({g[0].token_ids[k] for g in free for k in (2, 7)})[:8]  # tokens several outputs hit early
    text = tok.decode(free[1][0].token_ids[:5])
    stop_string = text[-2:] if len(text.strip()) >= 2 else text

    def run(eng):
        groups = [
            eng.add_request(
                GenerateRequest(
                    p,
                    SamplingParams(
                        max_new_tokens=24,
                        temperature=0.0,
                        stop_token_ids=stops if i != 1 else [],
                        stop=[stop_string] if i == 1 else [],
                    ),
                    request_id=i,
                )
            )
            for i, p in enumerate(ps)
        ]
        eng.step()
        eng.step()
        eng.abort(9)  # still waiting: ends with no tokens
        eng.abort(0)  # running (or finished): keeps what it has
        while eng.has_unfinished():
            eng.step()
        return [(g.results[0].token_ids, g.results[0].finish_reason) for g in groups]

    want, got = run(plain), run(overlapped)
    assert sum(reason == FinishReason.STOP for _, reason in want) >= 3
    assert want[1][1] == FinishReason.STOP and stop_string in tok.decode(want[1][0])
    assert want[9] == ([], FinishReason.ABORT)
    assert got == want
    for eng in (plain, overlapped):
        assert eng.scheduler.allocator.num_free == eng.scheduler.allocator.num_blocks and not eng.has_unfinished()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the fused projections serve the CUDA engine")
def test_cuda_engine_weights_survive_offload_and_sync(tiny_model_path, tok):
    """The CUDA engine's fused q/k/v and gate/up matrices (parameters are views into them): a weight
    sync lands in them, and sleeping with the weights offloaded to the CPU and waking keeps outputs."""
    model = build_model(tiny_model_path, torch.float32, "cuda")
    other = build_model(tiny_model_path, torch.float32, "cuda", random_init=True, seed=123)
    ps = prompts(tok, 4, seed=12)
    greedy = SamplingParams(max_new_tokens=20, temperature=0.0)
    eng = EmbeddedEngine(model, EngineConfig(max_num_seqs=8), max_model_len=64)
    assert eng.model.model.layers[0].self_attn.qkv is not None
    before = eng.generate([GenerateRequest(p, greedy) for p in ps])
    eng.update_weights(other.named_parameters(), version=1)
    synced = eng.generate([GenerateRequest(p, greedy) for p in ps])
    fresh = EmbeddedEngine(other, EngineConfig(max_num_seqs=8), max_model_len=64)
    want = fresh.generate([GenerateRequest(p, greedy) for p in ps])
    assert [g[0].token_ids for g in synced] == [g[0].token_ids for g in want] != [g[0].token_ids for g in before]
    eng.sleep(offload_weights=True)
    assert next(eng.model.parameters()).device.type == "cpu"
    eng.wake_up()
    again = eng.generate([GenerateRequest(p, greedy) for p in ps])
    assert [g[0].token_ids for g in again] == [g[0].token_ids for g in want]
