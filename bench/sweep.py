#!/usr/bin/env python3
"""Run one config under several override sets (and seeds) in parallel processes and print held-out
greedy accuracy before/after for each: a small hyper-parameter sweep for one GPU or CPU.

    python bench/sweep.py -c examples/demo_cpu.yaml --jobs 8 --seeds 1 2 \\
        --variant base: --variant lr5e-5:train.lr=5e-5 --variant short:rollout.rollout_max_response_len=32,train.lr=5e-5

A variant is NAME:KEY=VALUE,KEY=VALUE (values without commas; lists as [a;b] are written [a,b]
after the split). ``--common`` overrides apply to every run. Runs go to --out/NAME-sSEED.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def parse_variant(text: str) -> tuple[str, list[str]]:
    name, _, rest = text.partition(":")
    return name, [o.replace(";", ",") for o in rest.split(",") if o]


def run_one(config: str, out: Path, overrides: list[str], seed: int) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "reinforge.cli",
        "train",
        "-c",
        config,
        *overrides,
        f"train.seed={seed}",
        f"rollout.seed={seed}",
        f"run.output_dir={out}",
        "run.progress=false",
        "run.save_final=false",
    ]
    t = time.perf_counter()
    with (out / "log.txt").open("w") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t
    evals = {}
    if (out / "eval.jsonl").is_file():
        for line in (out / "eval.jsonl").read_text().splitlines():
            row = json.loads(line)
            evals[row["label"]] = row
    return {
        "rc": rc,
        "wall": wall,
        "before": evals.get("before", {}).get("eval/greedy_accuracy"),
        "after": evals.get("after", {}).get("eval/greedy_accuracy"),
        "trunc_after": evals.get("after", {}).get("eval/greedy_truncated"),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-c", "--config", required=True)
    ap.add_argument("--variant", action="append", required=True)
    ap.add_argument("--common", default="", help="KEY=VALUE,... applied to every run")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1])
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--out", default="runs/sweep")
    args = ap.parse_args()
    common = parse_variant("c:" + args.common)[1]
    jobs = [(name, seed, common + ovr) for name, ovr in map(parse_variant, args.variant) for seed in args.seeds]
    env_note = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = {(n, s): pool.submit(run_one, args.config, Path(args.out) / f"{n}-s{s}", o, s) for n, s, o in jobs}
        results = {k: f.result() for k, f in futures.items()}
    print(f"\nconfig {args.config}  common {common}  {env_note}")
    print(f"{'variant':24s} {'seed':>4s} {'before':>7s} {'after':>7s} {'ratio':>6s} {'trunc':>6s} {'wall_s':>7s} rc")
    by_name: dict[str, list[float]] = {}
    for (n, s), r in results.items():
        ratio = r["after"] / r["before"] if r["before"] and r["after"] is not None else float("nan")
        by_name.setdefault(n, []).append(ratio)
        fmt = lambda v: f"{v:7.3f}" if v is not None else "      -"  # noqa: E731
        print(
            f"{n:24s} {s:4d} {fmt(r['before'])} {fmt(r['after'])} {ratio:6.2f} "
            f"{(r['trunc_after'] or 0):6.2f} {r['wall']:7.1f} {r['rc']}"
        )
    print(
        "\nworst ratio per variant: "
        + ", ".join(f"{n} {min(v):.2f} (mean {statistics.mean(v):.2f})" for n, v in by_name.items())
    )


if __name__ == "__main__":
    main()
