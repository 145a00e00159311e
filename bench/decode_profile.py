"""What one decode step of the embedded engine is made of: kernels per step and GPU time per kernel
group, against the step's wall time with CUDA graphs (issue 24's small-batch decode).

A random-weight model of ``--arch``, ``--seqs`` sequences at ``--context`` tokens. Two engines:
with CUDA graphs (the default; its step time is timed like bench/long_responses.py) and without
(each kernel launched eagerly, so that torch.profiler sees and times every kernel of a step). The
table groups kernels by name: launches per step, GPU microseconds per step and share. "GPU busy"
is the sum of kernel times per step; the graph step time minus it is time the GPU spends between
kernels (launch gaps, dependencies) or in the host's read-backs.

    PYTHONPATH=.:bench python bench/decode_profile.py --seqs 16 --context 4096      # on a GPU
    PYTHONPATH=.:bench python bench/decode_profile.py --device cpu --arch smollm2 --seqs 2 --context 64 --steps 4
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
from archs import write_random_model

GROUPS = [  # (group, pattern of kernel names), first match wins
    ("attention (paged decode)", r"_paged_decode|_combine_splits"),
    ("GEMM", r"gemm|sm90_xmma|cutlass|Kernel2|nvjet|splitKreduce|matmul"),
    ("sampling", r"_sample|argmax|sampl"),
    ("norm / rope / SiLU (Triton)", r"rms|rope|silu|_fused|triton"),
]


def group_of(name: str) -> str:
    for g, pat in GROUPS:
        if re.search(pat, name, re.IGNORECASE):
            return g
    return "other elementwise / copies"


def make_engine(folder: Path, args, device: torch.device, cuda_graph: bool):
    from reinforge.config import EngineConfig
    from reinforge.engine import EmbeddedEngine
    from reinforge.models.loading import build_model
    from reinforge.records import GenerateRequest, SamplingParams

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_model(folder, dtype, device).eval()
    eng = EmbeddedEngine(
        model,
        EngineConfig(
            max_num_seqs=args.seqs,
            kv_cache_memory_fraction=0.5,
            cuda_graph=cuda_graph,
            kv_cache_dtype=args.kv_cache_dtype,
        ),
        max_model_len=args.context + 4 * args.steps + 64,
    )
    g = torch.Generator().manual_seed(0)
    vocab = model.args.vocab_size
    sp = SamplingParams(max_new_tokens=4 * args.steps + 32, temperature=1.0, ignore_eos=True)
    for _ in range(args.seqs):
        eng.add_request(GenerateRequest(torch.randint(100, vocab - 100, (args.context,), generator=g).tolist(), sp))
    while eng.scheduler.waiting and eng.scheduler.free:
        eng._admit()
    eng.step()  # captures the graph of this shape (or warms the kernels)
    eng.step()
    return eng


def tokens(eng) -> int:
    return int(eng.runner.gen_lens[: eng.num_slots].sum())


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="qwen2.5-1.5b")
    ap.add_argument("--seqs", type=int, default=16)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=32, help="decode steps profiled / timed")
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / args.arch
        write_random_model(args.arch, folder, max_position_embeddings=max(32768, 2 * args.context))
        # wall time per step with CUDA graphs (the engine's default path)
        eng = make_engine(folder, args, device, cuda_graph=device.type == "cuda")
        sync(device)
        n0, t0 = tokens(eng), time.perf_counter()
        while tokens(eng) - n0 < args.steps * args.seqs:
            eng.step()
        sync(device)
        graph_ms = 1e3 * (time.perf_counter() - t0) / ((tokens(eng) - n0) / args.seqs)
        eng.shutdown()
        del eng
        # every kernel of eager steps
        eng = make_engine(folder, args, device, cuda_graph=False)
        acts = [torch.profiler.ProfilerActivity.CPU] + (
            [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else []
        )
        sync(device)
        n0 = tokens(eng)
        with torch.profiler.profile(activities=acts) as prof:
            while tokens(eng) - n0 < args.steps * args.seqs:
                eng.step()
            sync(device)
        steps = (tokens(eng) - n0) / args.seqs
        eng.shutdown()
    per_group: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in prof.key_averages():
        if device.type == "cuda" and e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if device.type != "cuda" and not e.key.startswith("aten::"):
            continue
        t = e.device_time_total if device.type == "cuda" else e.self_cpu_time_total
        if t <= 0:
            continue
        grp = per_group[group_of(e.key)]
        grp[0] += e.count
        grp[1] += t
    busy = sum(v[1] for v in per_group.values()) / steps
    launches = sum(v[0] for v in per_group.values()) / steps
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"\n{name}, torch {torch.__version__}; {args.arch}, {args.seqs} seqs x {args.context} context, "
        f"kv_cache_dtype {args.kv_cache_dtype}, {steps:.0f} steps"
    )
    print(
        f"step with CUDA graphs: {graph_ms:.3f} ms; kernels per step: {launches:.0f}; GPU busy per step "
        f"(eager kernels): {busy / 1e3:.3f} ms; the rest: {graph_ms - busy / 1e3:.3f} ms"
    )
    print("| kernel group | launches / step | us / step | share of busy |")
    print("| --- | ---: | ---: | ---: |")
    for g, (count, t) in sorted(per_group.items(), key=lambda kv: -kv[1][1]):
        print(f"| {g} | {count / steps:.1f} | {t / steps:.1f} | {t / steps / busy:.0%} |")


if __name__ == "__main__":
    main()
