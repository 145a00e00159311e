"""GRPO end to end in Ray mode on several GPUs, one placement per call (issue 26's multi-GPU runs).

A random-weight model of ``--arch`` (bench/archs.py; SmolLM2's 49k vocabulary and tokenizer, as
bench/grpo_long.py), "write a very long story" prompts, random 0/1 rewards (every sample trains),
responses up to ``--length`` new tokens, ``reinforge train`` in a fresh process with
``cluster.mode=ray``: ``--trainers`` trainer ranks (FSDP2; ``--tp`` / ``--cp`` for tensor / context
parallelism) and ``--engines`` engines, colocated (engines sleep on the trainers' GPUs) or
disaggregated (their own GPUs). Trailing ``key=value`` arguments go to the run (e.g.
``train.expert_model_parallel_size=4``, ``cluster.ray_address=auto``).

Reported per run (medians over the rollout steps after the first, which compiles and captures CUDA
graphs; the only step when there is one):

* generated tok/s per GPU: the trained samples' response tokens / rollout-step seconds / GPUs used
  (colocated: max(trainers, engines); disaggregated: trainers + engines),
* generation, log-prob + training, weight-sync (``time/sync``) and whole-step seconds,
* ``train/logprob_abs_diff``: mean |engine log-prob - trainer log-prob| of the response tokens.

Peak GPU memory is sampled outside (scripts/multi_common.sh, nvidia-smi). One JSON line per run is
appended to ``--output-dir``/results.jsonl and a Markdown row printed.

    PYTHONPATH=.:bench python bench/grpo_ray.py --arch qwen2.5-7b --trainers 8 --engines 8 --colocate \\
        --cp 2 --length 16384 --seqs 128 --tokenizer DIR --output-dir out/7b --name co-16k    # 8 GPUs
    PYTHONPATH=.:bench python bench/grpo_ray.py --arch qwen2.5-7b --tiny --trainers 2 --engines 1 \\
        --length 16 --seqs 4 --n 2 --tokenizer DIR --output-dir /tmp/g --name dry train.device=cpu  # CPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from async_long import build_model  # noqa: E402
from grpo_long import workload_overrides, write_prompts  # noqa: E402


def summarize(rows: list[dict], gpus: int) -> dict:
    """Medians of the per-step numbers over ``rows`` (metrics.jsonl training rows) after the first."""
    steps = rows[1:] or rows

    def med(f):
        return statistics.median(f(r) for r in steps)

    tokens = lambda r: r["rollout/response_len_mean"] * r["rollout/num_samples"]  # noqa: E731
    return {
        "steps": len(rows),
        "gpus": gpus,
        "seqs": med(lambda r: r["rollout/num_samples"]),
        "mean_len": med(lambda r: r["rollout/response_len_mean"]),
        "gen_s": med(lambda r: r["time/generate"]),
        "train_s": med(lambda r: r.get("time/logprob", 0.0) + r.get("time/train", 0.0)),
        "sync_s": med(lambda r: r.get("time/sync", 0.0)),
        "step_s": med(lambda r: r["time/rollout_step"]),
        "tok_s_gpu": med(lambda r: tokens(r) / r["time/rollout_step"] / gpus),
        "logprob_abs_diff": med(lambda r: r.get("train/logprob_abs_diff", float("nan"))),
    }


HEAD = (
    "| run | GPUs | seqs | mean length | generation s | log-prob + train s | weight sync s | step s "
    "| generated tok/s per GPU | mean abs log-prob diff |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
    "| ---: | ---: |"
)


def row(name: str, r: dict) -> str:
    return (
        f"| {name} | {r['gpus']} | {r['seqs']:.0f} | {r['mean_len']:,.0f} | {r['gen_s']:.2f} | {r['train_s']:.2f} "
        f"| {r['sync_s']:.3f} | {r['step_s']:.2f} | {r['tok_s_gpu']:,.1f} | {r['logprob_abs_diff']:.4f} |"
    )


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="qwen2.5-7b", help="bench/archs.py name")
    ap.add_argument("--tiny", action="store_true", help="shrink the architecture to 2 layers of width 64 (CPU)")
    ap.add_argument("--name", required=True, help="the run's name (row label, run folder)")
    ap.add_argument("--trainers", type=int, required=True, help="trainer ranks (one GPU each)")
    ap.add_argument("--engines", type=int, required=True, help="rollout engines (one GPU each)")
    ap.add_argument("--colocate", action="store_true", help="engines on the trainers' GPUs")
    ap.add_argument("--nodes", type=int, default=1, help="cluster.actor_num_nodes (trainers = nodes x per node)")
    ap.add_argument("--tp", type=int, default=1, help="train.tensor_model_parallel_size")
    ap.add_argument("--cp", type=int, default=1, help="train.context_parallel_size")
    ap.add_argument("--length", type=int, default=4096, help="rollout.rollout_max_response_len")
    ap.add_argument("--seqs", type=int, default=128, help="sequences per rollout (prompts x --n)")
    ap.add_argument("--n", type=int, default=8, help="samples per prompt")
    ap.add_argument("--steps", type=int, default=3, help="rollout steps (the first is not counted)")
    ap.add_argument(
        "--kv-fraction",
        type=float,
        default=0.0,
        help="engine.kv_cache_memory_fraction (0: 0.3 colocated, 0.85 disaggregated)",
    )
    ap.add_argument("--tokenizer", type=Path, required=True, help="a folder with SmolLM2's tokenizer files")
    ap.add_argument("--output-dir", type=Path, required=True)
    ap.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help="where the random model is written once and reused (default: --output-dir)",
    )
    ap.add_argument("--timeout", type=float, default=3000, help="seconds before the run is stopped")
    ap.add_argument(
        "--random-init",
        action="store_true",
        help="no weights on disk: every trainer rank draws them (model.random_init, one seed) and the first "
        "weight sync gives them to the engines (a 15B model's 30 GB take minutes to write)",
    )
    ap.add_argument("overrides", nargs="*", help="key=value overrides for the run")
    args = ap.parse_intermixed_args(argv)  # key=value overrides may come between the options
    if args.trainers % args.nodes:
        raise SystemExit(f"--trainers {args.trainers} is not a multiple of --nodes {args.nodes}")
    args.output_dir.mkdir(parents=True, exist_ok=True)
    tag = f"{args.arch}{'-tiny' if args.tiny else ''}"
    folder = f"model-{tag}{'-config' if args.random_init else ''}"
    model, prompts = (args.model_dir or args.output_dir) / folder, args.output_dir / "prompts.jsonl"
    if not (model / "config.json").exists():
        build_model(model, args.arch, args.tokenizer, max(32768, args.length + 1024), args.tiny, not args.random_init)
    if not prompts.exists():
        write_prompts(prompts, 4096)
    out = args.output_dir / args.name
    kv = args.kv_fraction or (0.3 if args.colocate else 0.85)
    overrides = workload_overrides(
        model,
        prompts,
        out,
        length=args.length,
        seqs=args.seqs,
        n=args.n,
        max_num_seqs=max(1, -(-args.seqs // args.engines)),
        kv_fraction=kv,
        max_tokens=0,
        steps=args.steps,
    )
    overrides += [
        "train.num_steps_per_rollout=1",
        f"train.tensor_model_parallel_size={args.tp}",
        f"train.context_parallel_size={args.cp}",
        "eval.eval_interval=null",
        "cluster.mode=ray",
        f"cluster.colocate={str(args.colocate).lower()}",
        f"cluster.actor_num_nodes={args.nodes}",
        f"cluster.actor_num_gpus_per_node={args.trainers // args.nodes}",
        f"cluster.rollout_num_gpus={args.engines}",
        *(["model.random_init=true"] if args.random_init else []),
        *args.overrides,
    ]
    cmd = [sys.executable, "-m", "reinforge", "train", *overrides]
    print("$", " ".join(cmd), flush=True)
    t = time.perf_counter()
    proc = subprocess.run(cmd, timeout=args.timeout)
    wall = time.perf_counter() - t
    metrics = out / "metrics.jsonl"
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()] if metrics.exists() else []
    rows = [r for r in rows if "train/loss" in r]
    if proc.returncode != 0 or not rows:
        raise SystemExit(
            f"{args.name}: the run failed (exit {proc.returncode}, {len(rows)} training rows in "
            f"{metrics}); see the output above"
        )
    gpus = max(args.trainers, args.engines) if args.colocate else args.trainers + args.engines
    r = {
        "name": args.name,
        "arch": tag,
        "colocate": args.colocate,
        "trainers": args.trainers,
        "engines": args.engines,
        "tp": args.tp,
        "cp": args.cp,
        "length": args.length,
        "process_s": wall,
        "overrides": args.overrides,
        **summarize(rows, gpus),
    }
    with (args.output_dir / "results.jsonl").open("a") as f:
        f.write(json.dumps(r) + "\n")
    print(HEAD + "\n" + row(args.name, r), flush=True)
    return r


if __name__ == "__main__":
    main()
