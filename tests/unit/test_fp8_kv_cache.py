"""An 8-bit KV cache (``engine.kv_cache_dtype: fp8``): storage, the engine's paths over it, the checks.

The GPU kernel's own test against the gathered reference is in test_paged_attention.py.
"""

import pytest
import torch

from reinforge.config import ConfigError, EngineConfig, load_config
from reinforge.engine import EmbeddedEngine
from reinforge.engine.kv_cache import cache_read, cache_write, kv_cache_dtype, to_cache
from reinforge.models.loading import build_model, load_tokenizer
from reinforge.records import GenerateRequest, SamplingParams
from reinforge.rollout.backends.sglang import kv_cache_flag

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def test_to_cache_saturates_and_rounds():
    x = torch.tensor([1000.0, -1e5, 0.3, float("inf")])
    assert to_cache(x, E4M3).float().tolist() == [448.0, -448.0, 0.3125, 448.0]
    assert to_cache(x, E5M2).float().tolist() == [1024.0, -57344.0, 0.3125, 57344.0]
    assert to_cache(x, torch.float32) is x


@pytest.mark.parametrize("dtype", [E4M3, E5M2, torch.bfloat16])
def test_cache_write_and_read_by_index(dtype):
    """Writes and reads go through uint8 views for 8-bit floats: the same values as plain indexing
    of the rounded tensor."""
    g = torch.Generator().manual_seed(0)
    cache = torch.zeros(6, 2, 4, 8, dtype=dtype)
    blk, off = torch.tensor([4, 1, 4]), torch.tensor([0, 3, 2])
    vals = torch.randn(3, 2, 8, generator=g)
    cache_write(cache, (blk, slice(None), off), vals)
    want = vals.to(dtype).float()
    torch.testing.assert_close(cache_read(cache, (blk, slice(None), off), torch.float32), want, atol=0, rtol=0)
    assert cache.float()[0].abs().sum() == 0  # nothing else written


def test_kv_cache_dtype_names(monkeypatch):
    cpu = torch.device("cpu")
    assert kv_cache_dtype("auto", torch.bfloat16, cpu) == torch.bfloat16
    assert kv_cache_dtype("fp8", torch.float32, cpu) == kv_cache_dtype("fp8_e4m3", torch.float32, cpu) == E4M3
    assert kv_cache_dtype("fp8_e5m2", torch.float32, cpu) == E5M2
    with pytest.raises(ValueError, match="engine.kv_cache_dtype='int8'"):
        kv_cache_dtype("int8", torch.float32, cpu)
    # an A100 (8.0): Triton converts e5m2 there but not e4m3
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(ValueError, match="compute capability 8.9 .* 8.0: use fp8_e5m2"):
        kv_cache_dtype("fp8", torch.bfloat16, torch.device("cuda"))
    assert kv_cache_dtype("fp8_e5m2", torch.bfloat16, torch.device("cuda")) == E5M2


def test_config_and_backends():
    with pytest.raises(ConfigError, match="engine.kv_cache_dtype=fp8: the hf backend"):
        load_config(None, ["engine.backend=hf", "engine.kv_cache_dtype=fp8"])
    with pytest.raises(ConfigError, match="kv_cache_dtype"):
        load_config(None, ["engine.kv_cache_dtype=int4"])
    assert kv_cache_flag("auto") == {}
    assert kv_cache_flag("fp8") == {"kv_cache_dtype": "fp8_e4m3"}  # SGLang's spelling
    assert kv_cache_flag("fp8_e5m2") == {"kv_cache_dtype": "fp8_e5m2"}


def _greedy(engine, prompts, n_new=16):
    sp = SamplingParams(max_new_tokens=n_new, temperature=0.0, ignore_eos=True)
    return [g[0] for g in engine.generate([GenerateRequest(p, sp) for p in prompts])]


def _trainer_diff(trainer, prompts, results, device="cpu"):
    diffs = []
    for p, r in zip(prompts, results):
        ids = torch.tensor([p + r.token_ids], device=device)
        with torch.no_grad():
            ref = torch.log_softmax(trainer(ids)[0, len(p) - 1 : -1].float(), -1)
        ref = ref.gather(-1, ids[0, len(p) :, None])[:, 0].cpu()
        diffs.append((ref - torch.tensor(r.log_probs)).abs())
    return torch.cat(diffs).mean().item()


def _prompts(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(10, 40000, (int(torch.randint(3, 20, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n)
    ]


def test_fp8_engine_layouts_agree_and_stay_near_the_trainer(tiny_model_path, smollm2_path):
    """The CPU engine with an fp8 cache, on the one-block layout and the paged one (gathered
    blocks), and under preemption: every path rounds the same keys the same way, so greedy tokens
    and log-probs agree (preemption's recompute included: prefill attends to rounded keys too);
    against the trainer's fp32 log-probs the fp8 cache makes a difference (it is really used),
    smaller with e4m3 than with e5m2; the cache takes a quarter of the fp32 bytes."""
    tok = load_tokenizer(smollm2_path)
    model = build_model(tiny_model_path, torch.float32)
    ps = _prompts(5)
    out = {}
    for name, cfg in {
        "fp32": EngineConfig(max_num_seqs=8),
        "slot": EngineConfig(max_num_seqs=8, kv_cache_dtype="fp8"),
        "paged": EngineConfig(max_num_seqs=8, kv_block_size=4, kv_cache_dtype="fp8"),
        "preempted": EngineConfig(max_num_seqs=8, kv_block_size=4, num_kv_blocks=20, kv_cache_dtype="fp8"),
    }.items():
        eng = EmbeddedEngine(model, cfg, max_model_len=48, tokenizer=tok)
        if name != "fp32":
            assert eng.runner.k_pool.dtype == E4M3
        out[name] = (_greedy(eng, ps), eng)
    assert out["preempted"][1].num_preemptions > 0
    assert out["fp32"][1].runner.k_pool.element_size() == 4 * out["slot"][1].runner.k_pool.element_size()
    for name in ("paged", "preempted"):
        for a, b in zip(out["slot"][0], out[name][0]):
            assert a.token_ids == b.token_ids
            assert max(abs(x - y) for x, y in zip(a.log_probs, b.log_probs)) < 1e-5
    trainer = build_model(tiny_model_path, torch.float32)
    assert _trainer_diff(trainer, ps, out["fp32"][0]) < 1e-5
    e5m2 = EmbeddedEngine(model, EngineConfig(max_num_seqs=8, kv_cache_dtype="fp8_e5m2"), max_model_len=48)
    # (this 64-wide random model: about 0.11 with e4m3, 0.22 with e5m2's one mantissa bit fewer)
    e4m3_diff, e5m2_diff = _trainer_diff(trainer, ps, out["slot"][0]), _trainer_diff(trainer, ps, _greedy(e5m2, ps))
    assert 1e-5 < e4m3_diff < e5m2_diff < 0.5, (e4m3_diff, e5m2_diff)


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
    reason="the Triton kernel over an e4m3 cache (CUDA, compute capability 8.9+)",
)
def test_cuda_kernel_engine_over_fp8_equals_the_one_block_layout(tiny_model_path):
    """The GPU's default path (16-token blocks, Triton split-K kernel, CUDA graphs) over an fp8
    cache gives the greedy tokens and fp32 log-probs of the one-block layout (torch attention over
    the same rounded keys), under preemption too; and stays near the trainer."""
    model = build_model(tiny_model_path, torch.float32, "cuda")
    ps = _prompts(6, seed=1)
    one = EmbeddedEngine(model, EngineConfig(max_num_seqs=12, kv_block_size=96, kv_cache_dtype="fp8"), max_model_len=96)
    want = _greedy(one, ps, 60)
    for blocks in (0, 16):  # ample pool; a pool that forces preemption
        eng = EmbeddedEngine(
            model,
            EngineConfig(max_num_seqs=12, sync_interval=3, num_kv_blocks=blocks, kv_cache_dtype="fp8"),
            max_model_len=96,
        )
        assert eng.runner.Decode.__name__ == "KernelDecode" and eng.runner.k_pool.dtype == E4M3
        got = _greedy(eng, ps, 60)
        assert (eng.num_preemptions > 0) == (blocks > 0)
        for a, b in zip(want, got):
            assert a.token_ids == b.token_ids
            assert max(abs(x - y) for x, y in zip(a.log_probs, b.log_probs)) < 1e-5
    trainer = build_model(tiny_model_path, torch.float32, "cuda")
    assert 1e-5 < _trainer_diff(trainer, ps, got, "cuda") < 0.5
