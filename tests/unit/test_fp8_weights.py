"""FP8 rollout weights (``engine.quantization: fp8``): the block quantizer against a per-block reference,
the activation quantizer and the block-scaled matmul's emulation, the fp8 layer against a dequantized
matmul, the engine generating with fp8 weights (= the model holding the dequantized weights), weight sync
re-quantizing, the refusals, the vLLM / SGLang pass-through and the bench script on a tiny shape."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from reinforge.config import ConfigError, EngineConfig, load_config
from reinforge.engine import EmbeddedEngine
from reinforge.engine.fp8 import (
    EPS,
    FP8,
    FP8_MAX,
    Fp8Linear,
    check_quantization,
    dequantize_blocks,
    quantize_act,
    quantize_blocks,
    quantize_model,
    same_quantization,
    scaled_mm_reference,
    select_kernel,
)
from reinforge.models.loading import build_model, copy_weights_, named_weights
from reinforge.records import GenerateRequest, SamplingParams
from tests.conftest import make_tiny_model

CPU = torch.device("cpu")


def reference_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Block by block, as DeepSeek-V3's ``weight_quant`` reads: s = amax / 448, q = e4m3(w / s)."""
    n, K = w.shape
    rows, cols = -(-n // 128), -(-K // 128)
    q = torch.zeros(rows * 128, cols * 128, dtype=FP8)
    s = torch.zeros(rows, cols)
    for i in range(rows):
        for j in range(cols):
            blk = w[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128].float()
            s[i, j] = max(blk.abs().max().item(), EPS) / 448.0
            q[i * 128 : i * 128 + blk.shape[0], j * 128 : j * 128 + blk.shape[1]] = (blk / s[i, j]).to(FP8)
    return q, s


def test_block_quantizer_against_reference_and_e4m3_error_bound():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(300, 200, generator=g) * torch.logspace(-3, 1, 200)  # columns of very different sizes
    w[:128, 128:] = 0.0  # an all-zero block
    q, s = quantize_blocks(w)
    assert q.dtype == FP8 and q.shape == (384, 256) and s.shape == (3, 2) and s.dtype == torch.float32
    rq, rs = reference_blocks(w)
    assert torch.equal(s, rs)
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8))
    assert not q[300:].float().any() and not q[:, 200:].float().any()  # zero padding
    # each nonzero block's largest element lands on +-448 exactly; the zero block gets a tiny scale, not 0/0
    assert s[0, 1] == EPS / FP8_MAX and not q[:128, 128:].float().any()
    blocks = q.float().view(3, 128, 2, 128).abs().amax(dim=(1, 3))
    assert torch.equal(blocks[s > EPS], torch.full_like(blocks[s > EPS], FP8_MAX))
    # round trip: e4m3 keeps 3 mantissa bits, so |error| <= |w| / 16 for normal numbers and half the
    # smallest subnormal step (2^-9 / 2 of the scale) below 2^-6 of the scale
    d = dequantize_blocks(q, s)[:300, :200]
    scale = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:300, :200]
    bound = torch.maximum(w.abs() / 16, scale * 2.0**-10)
    assert ((d - w).abs() <= bound * (1 + 1e-6)).all()
    assert (d - w).abs().max() > 0  # (it is really quantized)
    # K padded to 512 (the probe's other layout): same blocks, more zero columns
    q5, s5 = quantize_blocks(w, 512)
    assert (
        q5.shape == (384, 512) and torch.equal(s5[:, :2], s) and torch.equal(s5[:, 2:], torch.full((3, 2), EPS / 448))
    )


def test_activation_quantizer_and_scaled_mm_emulation():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 200, generator=g)
    xq, xs = quantize_act(x, 16, 256)
    assert xq.shape == (16, 256) and xs.shape == (16, 2) and xs.stride() == (1, 16)  # outer-dim-major
    assert not xq[5:].float().any() and not xq[:, 200:].float().any()
    assert same_quantization((xq, xs), quantize_act(x, 16, 256, False)) and not same_quantization(
        (xq, xs * 2), (xq, xs)
    )
    amax = F.pad(x, (0, 56)).view(5, 2, 128).abs().amax(-1)
    assert torch.equal(xs[:5], amax / 448.0)
    deq = (xq.float().view(16, 2, 128) * xs[..., None]).view(16, 256)[:5, :200]
    assert ((deq - x).abs() <= x.abs() / 16 + xs[:5].repeat_interleave(128, 1)[:, :200] * 2.0**-10).all()
    # the emulated block-scaled product against the full-precision one: within the two roundings
    w = torch.randn(96, 200, generator=g) * 0.05
    wq, ws = quantize_blocks(w)
    y = scaled_mm_reference(xq, xs, wq, ws, torch.float32)[:5, :96]
    rel = ((y - x @ w.t()).norm() / (x @ w.t()).norm()).item()
    assert 1e-3 < rel < 0.05, rel


def test_fp8_linear_fused_members_match_the_dequantized_matmul():
    """Three members of unaligned row counts (q/k/v of a 72-wide model), each padded on its own: loading
    one leaves the others' blocks as they were; the output is the dequantized weight's product + bias."""
    g = torch.Generator().manual_seed(2)
    lin = Fp8Linear([72, 24, 24], 200, CPU, torch.float32, bias=True)
    assert lin.qweight.shape == (384, 256) and lin.columns is not None
    ws = [torch.randn(r, 200, generator=g) for r in lin.rows]
    for i, w in enumerate(ws):
        lin.load_weight(i, w)
        lin.load_bias(i, torch.randn(lin.rows[i], generator=g))
    full = lin.dequantize()
    assert full.shape == (120, 200)
    for i, w in enumerate(ws):  # each member is its own blocks: its dequantized rows are its weight's
        q, s = quantize_blocks(w)
        o = lin.out_offsets[i]
        assert torch.equal(full[o : o + lin.rows[i]], dequantize_blocks(q, s)[: lin.rows[i], :200])
    x = torch.randn(2, 3, 200, generator=g)
    y = F.linear(x, lin)  # dispatches to Fp8Linear.linear (__torch_function__)
    assert y.shape == (2, 3, 120) and y.is_contiguous()
    assert torch.allclose(y, x @ full.t() + lin.bias, rtol=1e-5, atol=1e-5)
    before = lin.dequantize()[:72].clone()
    lin.load_weight(1, torch.randn(24, 200, generator=g))
    assert torch.equal(lin.dequantize()[:72], before)
    with pytest.raises(ValueError, match=r"k_proj.weight has shape \(24, 100\).*expects \(24, 200\)"):
        lin.load_weight(1, torch.randn(24, 100), "k_proj.weight")
    aligned = Fp8Linear([256, 128], 512, CPU, torch.bfloat16, bias=False)  # a byte per weight + a scale per block
    assert aligned.columns is None and aligned.nbytes == 384 * 512 + 3 * 4 * 4


def _dequantized_copy(model, reg):
    """``model``'s copy holding the engine's dequantized fp8 weights (and its biases)."""
    ref = copy.deepcopy(model)
    sd = {}
    for name, (lin, i, kind) in reg.targets.items():
        o, n = lin.out_offsets[i], lin.rows[i]
        sd[name] = lin.dequantize(torch.float32)[o : o + n] if kind == "weight" else lin.bias[o : o + n]
    copy_weights_(ref, sd.items())
    return ref


def _prompts(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(10, 40000, (int(torch.randint(3, 20, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n)
    ]


def _diffs(trainer, prompts, results):
    out = []
    for p, r in zip(prompts, results):
        ids = torch.tensor([p + r.token_ids])
        with torch.no_grad():
            lp = torch.log_softmax(trainer(ids)[0, len(p) - 1 : -1].float(), -1)
        out.append((lp.gather(-1, ids[0, len(p) :, None])[:, 0] - torch.tensor(r.log_probs)).abs())
    return torch.cat(out)


def _sample(engine, prompts, n_new=12):
    engine.reseed(0)
    sp = SamplingParams(max_new_tokens=n_new, temperature=1.0, ignore_eos=True)
    return [g[0] for g in engine.generate([GenerateRequest(p, sp) for p in prompts])]


@pytest.fixture(scope="module")
def qwen2_path(tmp_path_factory, smollm2_path):
    """q/k/v biases, head_dim 16 x 4 heads: 64-row q, 32-row k and v (unaligned members)."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"), smollm2_path, "qwen2")


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_engine_with_fp8_weights_is_the_dequantized_model(arch, tiny_model_path, qwen2_path):
    """The engine's fp8 layers compute exactly what the model holding their dequantized weights computes
    (log-probs to 1e-5, fp32 CPU); against the original fp32 weights the quantization shows (this 64-wide
    random model with weights of std 0.2: mean |diff| about 0.1-0.2 per token); the bf16/fp32 parameters of
    the quantized layers are gone."""
    path = tiny_model_path if arch == "llama" else qwen2_path
    original = build_model(path, torch.float32)
    engine = EmbeddedEngine(
        build_model(path, torch.float32), EngineConfig(max_num_seqs=8, quantization="fp8"), max_model_len=48
    )
    reg = engine.fp8
    assert reg is not None and reg.kernel == "dequant" and len(reg.layers) == 2 * 4  # 2 layers x qkv, o, gate_up, down
    names = {n for n, _ in engine.model.named_parameters()}
    assert not any("_proj." in n for n in names), names
    assert ("model.layers.0.self_attn.q_proj.bias" in reg.targets) == (arch == "qwen2")
    assert all(lin.qweight.dtype == FP8 for lin in reg.layers)
    ps = _prompts(5)
    res = _sample(engine, ps)
    assert _diffs(_dequantized_copy(original, reg), ps, res).max() < 1e-5
    d = _diffs(original, ps, res).mean().item()
    assert 1e-3 < d < 0.5, d


def test_weight_sync_requantizes_in_place(tiny_model_path, smollm2_path, tmp_path):
    """After a sync of other weights (in two buckets, the second a generator, split inside layer 0's q/k/v)
    the engine equals a fresh fp8 engine built from those weights, bit for bit, in the same fp8 buffers
    (CUDA graphs read them); tensors of another dtype are quantized from their values."""
    other = build_model(make_tiny_model(tmp_path / "other", smollm2_path, seed=7), torch.float32)
    cfg = EngineConfig(max_num_seqs=8, quantization="fp8")
    engine = EmbeddedEngine(build_model(tiny_model_path, torch.float32), cfg, max_model_len=48)
    buffers = [(lin.qweight, lin.scale_inv) for lin in engine.fp8.layers]
    ps = _prompts(3, seed=3)
    before = _sample(engine, ps, 8)
    for version, source in ((2, other), (3, copy.deepcopy(other).to(torch.bfloat16))):
        named = list(named_weights(source))
        half = next(i for i, (n, _) in enumerate(named) if n.endswith("k_proj.weight"))
        engine.update_weights(named[:half], version - 1)
        engine.update_weights((item for item in named[half:]), version)
        model = copy.deepcopy(source).float()
        model.init_rope()  # (the bf16 copy's RoPE tables were rounded with it)
        fresh = EmbeddedEngine(model, cfg, max_model_len=48)
        for (q, s), lin, new in zip(buffers, engine.fp8.layers, fresh.fp8.layers):
            assert lin.qweight is q and lin.scale_inv is s
            assert torch.equal(q.view(torch.uint8), new.qweight.view(torch.uint8)) and torch.equal(s, new.scale_inv)
        got, want = _sample(engine, ps, 8), _sample(fresh, ps, 8)
        assert [r.token_ids for r in got] == [r.token_ids for r in want]
        assert [r.log_probs for r in got] == [r.log_probs for r in want]
        assert engine.weight_version == version
    assert [r.token_ids for r in got] != [r.token_ids for r in before]
    with pytest.raises(KeyError, match="no parameter 'nope'"):
        engine.update_weights([("nope", torch.zeros(1))], 4)
    with pytest.raises(ValueError, match="model.layers.0.mlp.down_proj.weight has shape"):
        engine.update_weights([("model.layers.0.mlp.down_proj.weight", torch.zeros(3, 3))], 4)


def test_moe_experts_stay_shared_expert_is_fp8(smollm2_path, tmp_path):
    """Qwen2-MoE: the routed experts and the router keep the engine's dtype (no block-scaled grouped GEMM),
    the shared expert's MLP and the attention are fp8; generation = the dequantized model."""
    from tests.integration.test_moe import make_tiny_moe

    path = make_tiny_moe(tmp_path / "moe", smollm2_path, "qwen2_moe")
    original = build_model(path, torch.float32)
    engine = EmbeddedEngine(
        build_model(path, torch.float32), EngineConfig(max_num_seqs=4, quantization="fp8"), max_model_len=40
    )
    names = {n for n, _ in engine.model.named_parameters()}
    assert "model.layers.1.mlp.experts.gate_up_proj" in names and "model.layers.1.mlp.gate.weight" in names
    assert "model.layers.1.mlp.shared_expert.gate_proj.weight" in engine.fp8.targets
    ps = _prompts(3, seed=5)
    assert _diffs(_dequantized_copy(original, engine.fp8), ps, _sample(engine, ps, 8)).max() < 1e-5


def test_refusals(monkeypatch, tiny_model_path):
    check_quantization(None, CPU)
    check_quantization("fp8", CPU)
    with pytest.raises(ValueError, match="engine.quantization='int8': choose null or fp8"):
        check_quantization("int8", CPU)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA A100")
    with pytest.raises(ValueError) as e:
        check_quantization("fp8", torch.device("cuda"))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("engine.quantization=fp8 needs a GPU of compute capability 8.9")
    assert "NVIDIA A100 is 8.0: set engine.quantization=null" in msg
    with pytest.raises(ConfigError, match="engine.quantization=fp8: the hf backend"):
        load_config(None, ["engine.backend=hf", "engine.quantization=fp8"])
    with pytest.raises(ConfigError, match="quantization"):
        load_config(None, ["engine.quantization=int4"])
    model = build_model(tiny_model_path, torch.float32)
    EmbeddedEngine(model, EngineConfig(max_num_seqs=2, quantization="fp8"), max_model_len=16)
    assert quantize_model(model, "fp8") is model.fp8_weights  # a second fp8 engine on it: the same layers
    with pytest.raises(ValueError, match="engine.quantization=null, but this model's linear layers are fp8"):
        EmbeddedEngine(model, EngineConfig(max_num_seqs=2), max_model_len=16)


def test_preflight_refuses_fp8_on_an_old_gpu(monkeypatch, tiny_model_path):
    from reinforge import preflight

    cfg = load_config(None, [f"model.path={tiny_model_path}", "engine.quantization=fp8", "train.device=cpu"])
    preflight.kv_cache_plan(cfg, tiny_model_path, 64, CPU)  # fine on a CPU
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 6))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA A10")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (40 << 30, 80 << 30))
    with pytest.raises(preflight.PreflightError, match=r"this run cannot start: engine.quantization=fp8 needs .* 8.6"):
        preflight.kv_cache_plan(cfg, tiny_model_path, 64, torch.device("cuda"))


def test_select_kernel_on_cpu_dequantizes():
    assert select_kernel(CPU, torch.float32) == ("dequant", 128, False)


def test_vllm_and_sglang_get_the_key(monkeypatch, tmp_path):
    from reinforge.rollout.backends import EngineSpec
    from reinforge.rollout.backends import sglang as sglang_engine
    from reinforge.rollout.backends import vllm as vllm_engine

    seen = {}
    monkeypatch.setattr(vllm_engine, "VLLMEngine", lambda *a, **k: seen.setdefault("vllm", k))
    spec = EngineSpec(EngineConfig(backend="vllm", quantization="fp8"), tmp_path, None, CPU, torch.bfloat16, 64, 0)
    vllm_engine.from_spec(spec)
    assert seen["vllm"]["quantization"] == "fp8"
    monkeypatch.setattr(sglang_engine, "start_server", lambda cmd, url, log_dir: seen.setdefault("cmd", cmd))
    monkeypatch.setattr(sglang_engine, "wait_ready", lambda *a: None)
    monkeypatch.setattr(sglang_engine, "SGLangEngine", lambda *a, **k: None)
    spec.engine = EngineConfig(backend="sglang", quantization="fp8")
    sglang_engine.from_spec(spec)
    cmd = seen["cmd"]
    assert cmd[cmd.index("--quantization") + 1] == "fp8"


def test_bench_runs_on_a_tiny_shape(capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import fp8_weights

    fp8_weights.main(
        ["--device", "cpu", "--tiny", "--archs", "smollm2", "--seqs", "2", "--prompt-len", "6"]
        + ["--new-tokens", "3", "--mismatch-prompts", "2", "--samples", "1"]
    )
    out = capsys.readouterr().out
    assert out.count("| smollm2 (tiny) | 2 | ") == 2 and "| fp8 (dequant) |" in out
    assert "| smollm2 (tiny), random weights | fp8 |" in out and "| smollm2 (tiny), random weights | float32 |" in out


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
    reason="fp8 on CUDA needs compute capability 8.9+",
)
def test_cuda_kernels_graphs_and_offload(tiny_model_path):
    """On the GPU: which matmul the probe chose (block-scaled ``torch._scaled_mm`` on Hopper), the Triton
    activation quantizer = the eager one, the layer = the emulated block-scaled product; the engine's
    CUDA graphs replay what the eager steps compute, and a sleep with weight offload keeps the outputs."""
    dev = torch.device("cuda")
    kernel, k_align, triton_act = select_kernel(dev, torch.bfloat16)
    print(f"select_kernel on {torch.cuda.get_device_name()}: {kernel}, K padded to {k_align}, Triton {triton_act}")
    if torch.cuda.get_device_capability() >= (9, 0):
        assert kernel == "scaled_mm"
    x = torch.randn(37, 200, device=dev, dtype=torch.bfloat16)
    if triton_act:
        a, b = quantize_act(x, 48, 256, True), quantize_act(x, 48, 256, False)
        assert same_quantization(a, b) and a[1].stride() == (1, 48) and not a[0][37:].float().any()
        print(
            "Triton vs eager activation bytes differing:",
            (a[0].view(torch.uint8) != b[0].view(torch.uint8)).sum().item(),
        )
    lin = Fp8Linear([72, 24, 24], 200, dev, torch.bfloat16, True, kernel, k_align, triton_act)
    for i, r in enumerate(lin.rows):
        lin.load_weight(i, torch.randn(r, 200, device=dev) * 0.05)
    y = F.linear(x, lin).float()
    if kernel == "scaled_mm":
        xq, xs = quantize_act(x, 48, lin.qweight.shape[1])
        want = scaled_mm_reference(xq, xs, lin.qweight, lin.scale_inv, torch.float32)[:37, lin.columns] + lin.bias
    else:
        want = x.float() @ lin.dequantize(torch.float32).t() + lin.bias
    assert ((y - want).norm() / want.norm()).item() < 1e-2
    ps = _prompts(6, seed=4)
    sp = SamplingParams(max_new_tokens=40, temperature=0.0, ignore_eos=True)
    out = {}
    for graphs in (False, True):
        model = build_model(tiny_model_path, torch.bfloat16, dev)
        eng = EmbeddedEngine(
            model, EngineConfig(max_num_seqs=8, cuda_graph=graphs, quantization="fp8"), max_model_len=64
        )
        out[graphs] = [g[0] for g in eng.generate([GenerateRequest(p, sp) for p in ps])]
    assert [r.token_ids for r in out[True]] == [r.token_ids for r in out[False]]
    eng.sleep(offload_weights=True)
    assert eng.fp8.layers[0].qweight.device.type == "cpu"
    eng.wake_up()
    again = [g[0] for g in eng.generate([GenerateRequest(p, sp) for p in ps])]
    assert [r.token_ids for r in again] == [r.token_ids for r in out[True]]
