"""Rollout throughput: transformers `generate`, transformers `generate_batch`, reinforge's engine.

Random weights of real architectures (SmolLM2-135M, Qwen2.5-0.5B), fixed-length sampling
(EOS ignored), temperature 1. The reinforge engine serves ``--num-prompts`` prompts x ``--n``
samples (prefix sharing); the baselines serve ``--baseline-seqs`` sequences in one batch
(their tokens/s hardly depends on how many batches are run). Also prints the memory-bandwidth
ceiling (weights + KV cache bytes per decode step over the measured copy bandwidth) and the
engine's log-prob agreement with the trainer's forward pass in the engine's dtype.

    python bench/rollout.py                       # on a GPU: the full table
    python bench/rollout.py --device cpu --models smollm2 --num-prompts 4 --n 2 \
        --max-new-tokens 16 --baseline-seqs 4     # a smoke run on CPU
"""

from __future__ import annotations

import argparse
import json
import time
import traceback

import torch
from archs import hf_config


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device) -> float:
    """Bytes/s of a large device-to-device copy (read + write counted)."""
    if device.type != "cuda":
        return float("nan")
    x = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    sync(device)
    t = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    sync(device)
    return 2 * x.numel() * 10 / (time.perf_counter() - t)


def make_models(name, device, dtype):
    from transformers import AutoModelForCausalLM

    from reinforge.models.transformer import CausalLM

    cfg = hf_config(name)
    torch.manual_seed(0)
    with torch.device(device):
        hf = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    hf.eval()
    with torch.device("meta"):
        ours = CausalLM(cfg, max_positions=4096)
    ours.load_state_dict(
        {k: v for k, v in hf.state_dict().items() if k in ours.state_dict()}, assign=True, strict=False
    )
    if ours.args.tie_word_embeddings:
        ours.lm_head.weight = ours.model.embed_tokens.weight
    ours.init_rope(device)
    return cfg, hf, ours


def prompts(num, vocab, lo=64, hi=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (num,), generator=g)
    return [torch.randint(100, vocab - 100, (int(n),), generator=g).tolist() for n in lens]


def bench_hf_generate(hf, ps, max_new, device):
    width = max(map(len, ps))
    ids = torch.zeros(len(ps), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(ps):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    kw = dict(max_new_tokens=max_new, min_new_tokens=max_new, do_sample=True, temperature=1.0, top_k=0, pad_token_id=0)
    hf.generate(input_ids=ids[:2], attention_mask=mask[:2], **{**kw, "max_new_tokens": 4, "min_new_tokens": 4})
    sync(device)
    t = time.perf_counter()
    out = hf.generate(input_ids=ids, attention_mask=mask, **kw)
    sync(device)
    return (out.shape[1] - width) * len(ps) / (time.perf_counter() - t)


def bench_generate_batch(hf, ps, max_new, device):
    from transformers import GenerationConfig

    gc = GenerationConfig(
        max_new_tokens=max_new, do_sample=True, temperature=1.0, top_k=0, eos_token_id=None, pad_token_id=0
    )
    hf.generate_batch(inputs=ps[:4], generation_config=gc)
    sync(device)
    t = time.perf_counter()
    out = hf.generate_batch(inputs=ps, generation_config=gc)
    sync(device)
    tokens = sum(len(o.generated_tokens) for o in out.values())
    return tokens / (time.perf_counter() - t)


def bench_engine(
    model,
    ps,
    n,
    max_new,
    device,
    cuda_graph=True,
    max_num_seqs=1024,
    kv_block_size=0,
    overlap_schedule=True,
    fused_residual_add=True,
    fused_projections=True,
):
    from reinforge.config import EngineConfig
    from reinforge.engine import EmbeddedEngine
    from reinforge.models.transformer import Variant
    from reinforge.records import GenerateRequest, SamplingParams

    L = max(map(len, ps)) + max_new
    eng = EmbeddedEngine(
        model,
        EngineConfig(
            max_num_seqs=max_num_seqs,
            cuda_graph=cuda_graph,
            kv_cache_memory_fraction=0.5,
            kv_block_size=kv_block_size,
            overlap_schedule=overlap_schedule,
        ),
        max_model_len=L,
    )
    v = model.variant
    model.set_variant(
        Variant(v.fused_kernels, v.fused_residual and fused_residual_add, v.fused_projections and fused_projections)
    )
    sp = SamplingParams(max_new_tokens=max_new, temperature=1.0, ignore_eos=True)
    eng.generate([GenerateRequest(p, sp, n=n) for p in ps])  # warm-up: captures the CUDA graphs
    sync(device)
    t = time.perf_counter()
    results = eng.generate([GenerateRequest(p, sp, n=n) for p in ps])
    sync(device)
    dt = time.perf_counter() - t
    tokens = sum(len(r.token_ids) for g in results for r in g)
    info = dict(
        slots=eng.num_slots,
        graphs=len(eng.runner._graphs),
        distinct=len({tuple(r.token_ids) for g in results for r in g}),
        block=eng.scheduler.layout.block_size,
        preempted=eng.num_preemptions,
    )
    eng.shutdown()
    return tokens / dt, results, info


def logprob_parity(model_fp32, ps, results, device, autocast_dtype):
    """Mean |trainer - engine| log-prob and mean exp(trainer - engine) over the sampled tokens."""
    diffs, weights = [], []
    for p, group in list(zip(ps, results))[:16]:
        r = group[0]
        ids = torch.tensor([p + r.token_ids], device=device)
        with torch.no_grad(), torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            logits = model_fp32(ids)[0, len(p) - 1 : -1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, ids[0, len(p) :, None])[:, 0].cpu()
        d = lp - torch.tensor(r.log_probs)
        diffs.append(d.abs())
        weights.append(d.exp())
    return float(torch.cat(diffs).mean()), float(torch.cat(weights).mean())


# (flag, column, bench_engine arguments): optional runs with one engine feature turned off
VARIANTS = [
    ("no_graph_run", "reinforge_eager", dict(cuda_graph=False)),
    ("no_overlap_run", "reinforge_no_overlap", dict(overlap_schedule=False)),
    ("no_fused_residual_run", "reinforge_no_fused_residual", dict(fused_residual_add=False)),
    ("no_fused_projections_run", "reinforge_no_fused_projections", dict(fused_projections=False)),
    ("one_block_run", "reinforge_one_block", dict(kv_block_size=1 << 30)),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="smollm2,qwen2.5-0.5b")
    ap.add_argument("--num-prompts", type=int, default=128)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--baseline-seqs", type=int, default=256)
    ap.add_argument("--skip-baselines", action="store_true")
    ap.add_argument("--no-graph-run", action="store_true", help="also time the engine without CUDA graphs")
    ap.add_argument(
        "--no-overlap-run",
        action="store_true",
        help="also time the engine without the overlap scheduler (engine.overlap_schedule=false)",
    )
    ap.add_argument(
        "--no-fused-residual-run",
        action="store_true",
        help="also time the engine without the residual adds fused into the norms",
    )
    ap.add_argument(
        "--no-fused-projections-run",
        action="store_true",
        help="also time the engine with separate q/k/v and gate/up matmuls",
    )
    ap.add_argument(
        "--one-block-run",
        action="store_true",
        help="also time the engine with one KV block per sequence (the layout before paging)",
    )
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    bw = copy_bandwidth(device)
    rows = []
    for name in args.models.split(","):
        cfg, hf, ours = make_models(name, device, dtype)
        ps = prompts(args.num_prompts, cfg.vocab_size)
        base_ps = [p for p in ps for _ in range(args.n)][: args.baseline_seqs]
        row = {"model": name, "seqs": args.num_prompts * args.n, "new_tokens": args.max_new_tokens}
        if not args.skip_baselines:
            for key, fn in (("hf_generate", bench_hf_generate), ("hf_generate_batch", bench_generate_batch)):
                try:
                    row[key] = fn(hf, base_ps, args.max_new_tokens, device)
                except Exception as e:  # a baseline that does not run is reported, not fatal
                    row[key] = f"failed: {type(e).__name__}: {str(e)[:80]}"
                    traceback.print_exc()
        del hf
        if device.type == "cuda":
            torch.cuda.empty_cache()
        for flag, key, kwargs in VARIANTS:  # the engine with one feature off, for its share
            if getattr(args, flag):
                row[key], _, _ = bench_engine(ours, ps, args.n, args.max_new_tokens, device, **kwargs)
        tps, results, info = bench_engine(ours, ps, args.n, args.max_new_tokens, device)
        row["reinforge"] = tps
        row.update(info)
        # ceiling: every decode step reads all weights once and the KV cache of every sequence
        a = ours.args
        weight_bytes = sum(p.numel() * p.element_size() for p in ours.parameters())
        kv_per_token = 2 * a.num_layers * a.num_kv_heads * a.head_dim * torch.finfo(dtype).bits // 8
        B = min(row["seqs"], info["slots"])
        avg_ctx = sum(map(len, ps)) / len(ps) + args.max_new_tokens / 2
        step_bytes = weight_bytes + B * avg_ctx * kv_per_token
        row["ceiling"] = B * bw / step_bytes if bw == bw else float("nan")
        row["of_ceiling"] = tps / row["ceiling"] if bw == bw else float("nan")
        ref = ours.float()
        row["logprob_abs_diff"], row["importance_weight"] = logprob_parity(
            ref, ps, results, device, torch.bfloat16 if dtype == torch.bfloat16 else None
        )
        rows.append(row)
        del ours, ref
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(
        f"\ndevice: {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}; "
        f"copy bandwidth {bw / 1e12:.2f} TB/s; dtype {dtype}"
    )
    cols = [
        "model",
        "seqs",
        "new_tokens",
        "hf_generate",
        "hf_generate_batch",
        "reinforge_eager",
        "reinforge_one_block",
        "reinforge_no_overlap",
        "reinforge_no_fused_residual",
        "reinforge_no_fused_projections",
        "reinforge",
        "ceiling",
        "of_ceiling",
        "logprob_abs_diff",
        "importance_weight",
        "slots",
        "block",
        "preempted",
        "graphs",
        "distinct",
    ]
    cols = [c for c in cols if any(c in r for r in rows)]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(_fmt(r.get(c, "-")) for c in cols))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 10 else f"{v:,.0f}"
    return str(v)


if __name__ == "__main__":
    main()
