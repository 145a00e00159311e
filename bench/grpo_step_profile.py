"""Where the time of one small GRPO step goes: the GRPO-vs-TRL work (bench/grpo_vs_trl.py) in reinforge alone.

Prints, for ``--steps`` rollout steps (the first two are warm-up): the median of every ``time/*`` phase
metric; then one more step under ``cProfile`` (host functions by own time and by cumulative time);
then one more under ``torch.profiler``: the kernels by GPU time, then how long the GPU idled in each phase
of the step and its longest gaps, with the host's work during them (:mod:`gpu_gaps`); then (CUDA) one more
under ``torch.cuda.set_sync_debug_mode("warn")``: where the host waited for the GPU, by source line.

``--model`` is a model name or folder; ``random:ARCH`` writes random weights of a bench/archs.py
architecture with SmolLM2's tokenizer (``--tokenizer``), which needs no model download (random
weights rarely emit EOS, so every response runs to ``--max-new-tokens``).

    PYTHONPATH=.:bench python bench/grpo_step_profile.py --model random:smollm2 --tokenizer DIR   # GPU
    PYTHONPATH=.:bench python bench/grpo_step_profile.py --model random:smollm2 --tokenizer DIR \\
        --prompts 2 --n 2 --max-new-tokens 8 --steps 3                                       # CPU smoke run
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import json
import pstats
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_gaps  # noqa: E402
from grpo_vs_trl import add_work_args, reinforge_overrides  # noqa: E402

# the loop's trace spans reported by the GPU-idle table (reinforge/loop.py, rollout/source.py, train/)
PHASES = ["generate", "reward", "score", "advantages", "train", "forward", "backward", "optimizer_step", "weight_sync"]


def _model(spec: str, tokenizer: Path | None, folder: Path) -> Path:
    if not spec.startswith("random:"):
        from reinforge.models.hub import resolve_model_path

        return resolve_model_path(spec)
    if tokenizer is None:
        raise SystemExit("--model random:ARCH needs --tokenizer DIR (SmolLM2's tokenizer files)")
    from async_long import build_model

    build_model(folder, spec.split(":", 1)[1], tokenizer, 4096, tiny=False)
    return folder


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def sync_sites(run, rows: int) -> str:
    """Run ``run()`` with PyTorch's CUDA sync debug mode and tabulate where the host waited for the GPU:
    each synchronizing call counted by the innermost reinforge source line that made it (with its caller)."""
    sites: collections.Counter[str] = collections.Counter()

    def record(message, category, filename, lineno, file=None, line=None):
        frames = [f for f in traceback.extract_stack()[:-1] if "/reinforge/" in f.filename]
        where = " <- ".join(f"{f.filename.split('/reinforge/')[-1]}:{f.lineno}" for f in frames[-1:-3:-1])
        sites[where or f"{filename}:{lineno}"] += 1

    saved = warnings.showwarning
    warnings.showwarning = record
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            run()
    finally:
        torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = saved
    lines = ["| syncs | where (innermost reinforge line <- its caller) |", "| ---: | --- |"]
    lines += [f"| {n} | {w} |" for w, n in sites.most_common(rows)]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_work_args(ap, steps=5)
    ap.add_argument("--tokenizer", type=Path)
    ap.add_argument("--packing", default="sequences")
    ap.add_argument("--max-tokens-per-gpu", type=int, default=65536)
    ap.add_argument("--rows", type=int, default=25, help="rows of each profile table")
    ap.add_argument("overrides", nargs="*", help="more key=value config overrides")
    args = ap.parse_args()
    args.torch_compile, args.fused_kernels = False, "true"

    from reinforge.config import load_config
    from reinforge.loop import RLLoop

    with tempfile.TemporaryDirectory() as d:
        model = _model(args.model, args.tokenizer, Path(d) / "model")
        cfg = load_config(None, reinforge_overrides(args, model, Path(d) / "run", args.packing) + args.overrides)
        loop = RLLoop(cfg)
        walls, metrics = [], []
        for step in range(args.steps):
            t = time.perf_counter()
            metrics.append(loop.rollout_step(step)[0])
            _sync()
            walls.append(time.perf_counter() - t)
        kept = metrics[2:] or metrics
        med = statistics.median(walls[2:] or walls)
        print(f"\nsteps: {' '.join(f'{w:.3f}' for w in walls)} s; median of steps 3+: {med:.3f} s")
        phases = sorted({k for m in kept for k in m if k.startswith("time/")})
        for k in phases:
            print(f"  {k:24s} {statistics.median(m.get(k, 0.0) for m in kept):8.4f} s")
        tokens = statistics.median(m.get("rollout/response_len_mean", float("nan")) for m in kept)
        print(f"  mean response length {tokens:.1f} tokens")

        prof = cProfile.Profile()
        step = args.steps
        prof.enable()
        loop.rollout_step(step)
        _sync()
        prof.disable()
        for key in ("tottime", "cumulative"):
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats(key).print_stats(args.rows)
            print(f"\n== host profile of one step, by {key}\n" + "\n".join(s.getvalue().splitlines()[6:]))

        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        t = time.perf_counter()
        with profile(activities=acts) as tp:
            m = loop.rollout_step(step + 1)[0]
            _sync()
        wall = time.perf_counter() - t
        ka = tp.key_averages()
        if torch.cuda.is_available():
            busy = sum(e.self_device_time_total for e in ka) / 1e6
            print(f"\n== GPU: kernel time {busy:.3f} s of a {wall:.3f} s step (profiled; the profiler slows the host)")
            print({k: round(v, 4) for k, v in m.items() if k.startswith("time/")})
            print(ka.table(sort_by="self_device_time_total", row_limit=args.rows, max_name_column_width=60))
            path = Path(d) / "trace.json"
            tp.export_chrome_trace(str(path))
            events = json.loads(path.read_text())["traceEvents"]
            print("\n== where the GPU idles (bench/gpu_gaps.py; the step's phases)")
            print(gpu_gaps.report(gpu_gaps.analyse(events, PHASES, gaps=args.rows)))
            print("\n== where the host waits for the GPU in one step (torch.cuda.set_sync_debug_mode)")
            print(sync_sites(lambda: (loop.rollout_step(step + 2), _sync()), args.rows))
        loop.close()


if __name__ == "__main__":
    main()
