"""Synchronous vs asynchronous RL on one config: samples/s, wall time, held-out accuracy.

Runs the same config (same seeds) with ``rollout.max_staleness`` = each of ``--staleness``
(default 0 1 2; 0 is the synchronous loop), each run in its own process, for ``--num-rollout``
rollouts, then prints one table row per run:

* samples/s: trained samples / wall time of the training loop (from the first metrics row to the
  last rollout's row; the final evaluation is not counted),
* wall time to the fixed number of samples (``num_rollout * rollout_batch_size * n_samples``),
* held-out greedy accuracy after that many samples (``eval/greedy_accuracy`` of the final eval),
* the trainer's time in `time/generate` (synchronous: generating; asynchronous: waiting for the
  producer) and the mean token staleness.

Two GPUs, disaggregated (one trainer, one engine), e.g.::

    python bench/async_vs_sync.py --config examples/arith_grpo.yaml --num-rollout 100 \\
        cluster.mode=ray cluster.rollout_num_gpus=1

Trailing ``key=value`` arguments override the config for every run. ``--partial-rollout`` turns on
``rollout.partial_rollout`` in the asynchronous runs. ``--seeds`` repeats every setting with each seed
(``train.seed`` and ``rollout.seed``) and adds, per setting, the mean and the spread (max - min) of
the held-out accuracy over the seeds. Results go to ``--output-dir`` (one run folder per setting
and seed, ``table.md`` and ``results.json``). Tokens/s counts the trained samples' response tokens
(``rollout/response_len_mean`` x ``rollout/num_samples`` per rollout) over the same wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def run_one(config: str, k: int, args: argparse.Namespace, out: Path, seed: int | None = None) -> dict:
    """One training run with ``rollout.max_staleness=k`` (and ``seed``) in a fresh process; its summary."""
    seeds = [] if seed is None else [f"train.seed={seed}", f"rollout.seed={seed}"]
    overrides = (
        list(args.overrides)
        + seeds
        + [
            f"train.num_rollout={args.num_rollout}",
            f"rollout.max_staleness={k}",
            f"run.output_dir={out}",
            "eval.eval_before_train=false",
            "eval.eval_interval=null",
            "run.save_interval=null",
            "run.save_final=false",
            "run.progress=false",
            "run.tensorboard=false",
        ]
    )
    if k > 0 and args.partial_rollout:
        overrides.append("rollout.partial_rollout=true")
    cmd = [sys.executable, "-m", "reinforge", "train", "-c", config, *overrides]
    print("$", " ".join(cmd), flush=True)
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=os.environ.copy())
    total = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"max_staleness={k}: the run failed (exit {proc.returncode}); see the output above")
    rows = read_jsonl(out / "metrics.jsonl")
    train = [r for r in rows if "train/loss" in r]
    if not rows or not train:
        raise SystemExit(f"max_staleness={k}: no training rows in {out / 'metrics.jsonl'}")
    wall = train[-1]["time"] - rows[0]["time"]
    samples = sum(r["rollout/num_samples"] for r in train)
    tokens = sum(r["rollout/num_samples"] * r.get("rollout/response_len_mean", 0.0) for r in train)
    evals = read_jsonl(out / "eval.jsonl")
    acc = evals[-1].get("eval/greedy_accuracy") if evals else None
    return {
        "max_staleness": k,
        "seed": seed,
        "partial_rollout": bool(k > 0 and args.partial_rollout),
        "samples": samples,
        "wall_s": wall,
        "samples_per_s": samples / max(wall, 1e-9),
        "tokens_per_s": tokens / max(wall, 1e-9),
        "trainer_wait_s": sum(r.get("time/generate", 0.0) for r in train),
        "staleness_mean": (sum(r.get("async/staleness_mean", 0.0) for r in train) / len(train)),
        "greedy_accuracy": acc,
        "process_s": total,
    }


def format_table(results: list[dict]) -> str:
    head = (
        "| max_staleness | seed | partial | samples | wall s | samples/s | tokens/s | speed-up | generate (wait) s "
        "| staleness | greedy acc |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    )
    base = results[0]["samples_per_s"]
    lines = [head]
    for r in results:
        acc = "n/a" if r["greedy_accuracy"] is None else f"{100 * r['greedy_accuracy']:.1f}%"
        seed = "default" if r.get("seed") is None else r["seed"]
        partial = "yes" if r["partial_rollout"] else "no"
        lines.append(
            f"| {r['max_staleness']} | {seed} | {partial} | {r['samples']:.0f} | {r['wall_s']:.1f} | "
            f"{r['samples_per_s']:.2f} | {r.get('tokens_per_s', 0.0):.1f} | {r['samples_per_s'] / base:.2f}x | "
            f"{r['trainer_wait_s']:.1f} | {r['staleness_mean']:.2f} | {acc} |"
        )
    return "\n".join(lines)


def accuracy_spread(results: list[dict]) -> str:
    """Per ``max_staleness``: held-out accuracy mean and spread (max - min) over the seeds, as a table."""
    lines = ["| max_staleness | seeds | greedy acc mean | spread (max - min) |", "| --- | --- | --- | --- |"]
    for k in dict.fromkeys(r["max_staleness"] for r in results):
        accs = [r["greedy_accuracy"] for r in results if r["max_staleness"] == k and r["greedy_accuracy"] is not None]
        if accs:
            lines.append(
                f"| {k} | {len(accs)} | {100 * sum(accs) / len(accs):.1f}% | "
                f"{100 * (max(accs) - min(accs)):.1f} points |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", required=True, help="training config (YAML)")
    p.add_argument("--num-rollout", type=int, required=True, help="rollouts per run (the fixed sample budget)")
    p.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2], help="max_staleness values to compare")
    p.add_argument(
        "--seeds",
        type=int,
        nargs="*",
        default=None,
        help="repeat each setting with these seeds (train.seed, rollout.seed); default: the config's",
    )
    p.add_argument("--partial-rollout", action="store_true", help="rollout.partial_rollout=true in async runs")
    p.add_argument("--output-dir", default="runs/bench_async_vs_sync", help="where the runs and the table go")
    p.add_argument("overrides", nargs="*", help="key=value config overrides for every run")
    args = p.parse_args(argv)
    root = Path(args.output_dir)
    root.mkdir(parents=True, exist_ok=True)
    if args.seeds:
        results = [
            run_one(args.config, k, args, root / f"staleness_{k}_seed_{s}", s)
            for k in args.staleness
            for s in args.seeds
        ]
    else:
        results = [run_one(args.config, k, args, root / f"staleness_{k}") for k in args.staleness]
    table = format_table(results)
    if args.seeds:
        table += "\n\n" + accuracy_spread(results)
    (root / "table.md").write_text(table + "\n")
    (root / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print("\n" + table, flush=True)
    return results


if __name__ == "__main__":
    main()
