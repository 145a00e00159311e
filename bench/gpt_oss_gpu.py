"""GPT-OSS on a GPU (issue 53 item 2): a gpt-oss-20b-shaped model (random bf16 weights, layers cut: ``--layers``)
in the embedded engine, decode tokens/s at 16-256 sequences x 4k-32k context against the bandwidth limit, and the
bf16 engine-vs-trainer log-prob difference.

    PYTHONPATH=. python bench/gpt_oss_gpu.py --quick          # one GPU, < 3 minutes
    PYTHONPATH=. python bench/gpt_oss_gpu.py                  # 16/64/256 sequences x 4k/8k/32k context
    PYTHONPATH=. python bench/gpt_oss_gpu.py --tiny --device cpu --quick   # smoke test of the script on a CPU

gpt-oss-20b's shape: 24 layers (alternating sliding-window 128 / full attention, sinks), hidden 2880, 64 query
heads and 8 key-value heads of 64, 32 experts of width 2880 (4 per token, biased, clamped SwiGLU), vocabulary
201088, YaRN RoPE. The published experts are MXFP4; here they are bf16 (as reinforge loads them: dequantized).

Decode speed: each (sequences, context) point prefills ``context - 1`` random prompt tokens per sequence, then
times about ``--new-tokens`` decode tokens per sequence in the steady state (bench/family_timing.py: every sequence
prefilled, graphs captured, engine steps timed alone). The limit beside it is the bytes one decode step must read
from HBM over the GPU's bandwidth
(reinforge.plan.hardware): the non-expert weights (LM head included, the embedding's rows not), the share of the
experts a step touches (``1 - (1 - k/E)^sequences`` of them), and each sequence's KV cache: the full layers'
whole context, the sliding layers' last ``sliding_window`` positions. Points whose KV cache does not fit are
printed as skipped. The issue's goal: decode at >= 50% of the limit.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from family_timing import steady_decode_rate

GPT_OSS_20B = dict(
    model_type="gpt_oss",
    architectures=["GptOssForCausalLM"],
    vocab_size=201088,
    hidden_size=2880,
    intermediate_size=2880,
    num_hidden_layers=24,
    num_attention_heads=64,
    num_key_value_heads=8,
    head_dim=64,
    num_local_experts=32,
    num_experts_per_tok=4,
    sliding_window=128,
    max_position_embeddings=131072,
    rms_norm_eps=1e-5,
    rope_theta=150000.0,
    rope_scaling={
        "rope_type": "yarn",
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 4096,
    },
    attention_bias=True,
    swiglu_limit=7.0,
    tie_word_embeddings=False,
    hidden_act="silu",
    pad_token_id=199999,
    eos_token_id=200002,
)
TINY = dict(
    hidden_size=64,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=1000,
    pad_token_id=2,
    eos_token_id=2,
)


def gpt_oss_folder(out: Path, layers: int, tiny: bool) -> Path:
    cfg = {**GPT_OSS_20B, **(TINY if tiny else {})}
    cfg["num_hidden_layers"] = layers
    cfg["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def step_bytes(model, seqs: int, context: float) -> float:
    """HBM bytes one decode step of ``seqs`` sequences at mean ``context`` reads (module docstring)."""
    a = model.args
    params = dict(model.named_parameters())
    expert = sum(p.numel() * p.element_size() for n, p in params.items() if ".experts." in n)
    embed = params["model.embed_tokens.weight"]
    other = sum(p.numel() * p.element_size() for p in params.values()) - expert
    if not a.tie_word_embeddings:
        other -= embed.numel() * embed.element_size()
    touched = 1 - (1 - a.num_experts_per_tok / a.num_experts) ** seqs
    per_token = 2 * a.num_kv_heads * a.head_dim * embed.element_size()  # K and V of one layer
    kv = sum(per_token * (min(context, w) if w else context) for w in (a.window(i) for i in range(a.num_layers)))
    return other + expert * touched + seqs * kv


def decode_point(model, seqs: int, context: int, new: int, dev: torch.device, profile: bool = False) -> dict:
    from reinforge.config import EngineConfig
    from reinforge.engine import EmbeddedEngine

    cfg = EngineConfig(max_num_seqs=seqs, kv_cache_memory_fraction=0.9)
    try:
        engine = EmbeddedEngine(model, cfg, max_model_len=context + new + 72)
    except (RuntimeError, ValueError) as e:  # the KV cache does not fit
        return {"skipped": str(e)[:160]}
    g = torch.Generator().manual_seed(seqs * 7 + context)
    prompts = [torch.randint(10, model.args.vocab_size, (context - 1,), generator=g).tolist() for _ in range(seqs)]
    try:
        tok_s = steady_decode_rate(engine, prompts, new + 64, max(1, new // 8), profile)
    except torch.OutOfMemoryError as e:
        return {"skipped": f"out of memory: {str(e)[:120]}"}
    finally:
        engine.shutdown()
        engine = None
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    from reinforge.plan.hardware import detect

    gpu = detect(dev) if dev.type == "cuda" else None
    bandwidth = gpu.bandwidth if gpu is not None and gpu.bandwidth else 3.35e12  # (unknown: an H100's)
    limit = seqs / (step_bytes(model, seqs, context + new / 2) / bandwidth)
    return {"decode_tok_s": tok_s, "limit_tok_s": limit, "of_limit": tok_s / limit}


def logprob_mismatch(model, dev: torch.device, prompt: int = 300, new: int = 64) -> dict:
    """bf16 engine log-probs vs the trainer's forward on the same text (past the sliding window), and the same with
    the engine's experts replayed in the trainer (what replay removes is routing near ties)."""
    from families_gpu_check import replay_of

    from reinforge.config import EngineConfig
    from reinforge.engine import EmbeddedEngine
    from reinforge.models.transformer import Variant
    from reinforge.records import GenerateRequest, SamplingParams

    engine = EmbeddedEngine(model, EngineConfig(max_num_seqs=4), max_model_len=prompt + new + 8, record_routes=True)
    p = torch.randint(10, model.args.vocab_size, (prompt,), generator=torch.Generator().manual_seed(0)).tolist()
    ((r,),) = engine.generate([GenerateRequest(p, SamplingParams(max_new_tokens=new, ignore_eos=True))])
    del engine
    model.set_variant(Variant())
    ids = torch.tensor([p + r.token_ids], device=dev)
    target = torch.tensor(r.token_ids, device=dev)[:, None]
    out = {}
    with torch.no_grad():
        for name, routing in (
            ("", None),
            ("replayed_", replay_of(r.routed_experts, len(p), ids.shape[1], list(model.args.moe_layers))),
        ):
            logits = model(ids, routing=routing)[0, len(p) - 1 : -1].float()
            ref = torch.log_softmax(logits, -1).gather(-1, target)[:, 0].cpu()
            diff = (ref - torch.tensor(r.log_probs)).abs()
            out.update({f"{name}logprob_diff_mean": diff.mean().item(), f"{name}logprob_diff_max": diff.max().item()})
    return out


def sdpa_backends(model, tokens: int = 1024) -> None:
    """Which SDPA backends accept the prefill's attention with sinks as models/sdpa.py passes it (the sinks as one
    more key and query dimension, a bool mask, :func:`~reinforge.models.sdpa.kernel_args`' shapes): torch's own
    checks with ``debug=True`` print why one is refused."""
    from torch.backends.cuda import SDPAParams, can_use_efficient_attention, can_use_flash_attention

    from reinforge.models.sdpa import SINK_DIMS, causal_mask, kernel_args

    a, dev = model.args, torch.device("cuda")
    D, H, KVH = a.head_dim, a.num_heads, a.num_kv_heads
    q = torch.randn(1, tokens, H, D + SINK_DIMS, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, tokens + 1, KVH, D + SINK_DIMS, device=dev, dtype=torch.bfloat16)
    v = torch.randn(1, tokens + 1, KVH, D, device=dev, dtype=torch.bfloat16)
    mask = causal_mask(tokens, tokens, dev)
    mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
    (q, k, v), gqa = kernel_args(q, k, v, mask)
    params = SDPAParams(q, k, v, mask, 0.0, False, gqa)
    print(
        "sdpa with sinks: flash",
        can_use_flash_attention(params, True),
        "efficient",
        can_use_efficient_attention(params, True),
        flush=True,
    )


def profile_decode(model, seqs: int, context: int, new: int) -> None:
    """The CUDA kernels and host calls of ``new`` decode steps (after a warm-up), top 20 by self CUDA time."""
    from torch.profiler import ProfilerActivity, profile

    from reinforge.config import EngineConfig
    from reinforge.engine import EmbeddedEngine
    from reinforge.records import GenerateRequest, SamplingParams

    engine = EmbeddedEngine(model, EngineConfig(max_num_seqs=seqs), max_model_len=context + 2 * new + 8)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(10, model.args.vocab_size, (context,), generator=g).tolist() for _ in range(seqs)]

    def gen(n: int) -> None:
        p = SamplingParams(max_new_tokens=n, temperature=1.0, ignore_eos=True)
        engine.generate([GenerateRequest(x, p) for x in prompts])
        torch.cuda.synchronize()

    gen(new)  # warm-up: graphs captured, kernels compiled
    t0 = time.perf_counter()
    gen(1)
    t1 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        gen(new)
    t2 = time.perf_counter()
    print(f"profile: {seqs} x {context}: prefill + 1 token {t1 - t0:.3f} s, prefill + {new} tokens {t2 - t1:.3f} s")
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=20, max_name_column_width=60))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=60))
    engine.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8, help="decoder layers kept of the 24 (half sliding, half full)")
    ap.add_argument("--seqs", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--context", type=int, nargs="+", default=[4096, 8192, 32768])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--quick", action="store_true", help="4 layers, 16/64 sequences x 4k, 32 new tokens")
    ap.add_argument("--tiny", action="store_true", help="a width-64 model (smoke test of the script)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--profile", action="store_true", help="then profile prefill + 32 decode steps of 16 x 1024 (CUDA)")
    ap.add_argument("--profile-at", default="", help="SEQSxCONTEXT: profile that sweep point's steady decode steps")
    args = ap.parse_args()
    if args.quick:
        args.layers, args.seqs, args.context, args.new_tokens = 4, [16, 64], [4096], 32
        if args.tiny:
            args.seqs, args.context, args.new_tokens = [4], [256], 8
    from reinforge.models.loading import build_model

    dev = torch.device(args.device)
    print(torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch", torch.__version__, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = gpt_oss_folder(Path(tmp) / "m", args.layers, args.tiny)
        model = build_model(folder, torch.bfloat16, dev, random_init=True)
        gib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30
        print(f"gpt-oss-20b shape, {args.layers} of 24 layers, {gib:.1f} GiB of bf16 weights", flush=True)
        print(f"{'seqs':>5} {'context':>8} {'decode tok/s':>13} {'limit tok/s':>12} {'of limit':>9}", flush=True)
        for context in args.context:
            for seqs in args.seqs:
                at = args.profile_at == f"{seqs}x{context}"
                r = decode_point(model, seqs, context, args.new_tokens, dev, profile=at)
                if "skipped" in r:
                    print(f"{seqs:>5} {context:>8}  skipped: {r['skipped']}", flush=True)
                else:
                    print(
                        f"{seqs:>5} {context:>8} {r['decode_tok_s']:>13,.0f} {r['limit_tok_s']:>12,.0f} "
                        f"{r['of_limit']:>8.0%}",
                        flush=True,
                    )
        print("bf16 engine vs trainer:", logprob_mismatch(model, dev), flush=True)
        if args.profile or args.profile_at:
            sdpa_backends(model)
        if args.profile:
            profile_decode(model, 16, 1024, 32)


if __name__ == "__main__":
    main()
