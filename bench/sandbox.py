"""The python tool's sandbox: start latency and runs per second, on this machine.

Runs a trivial program (``pass``) ``--runs`` times one after another (latency of one sandbox:
launcher + bubblewrap + the interpreter's start, p50 / p99 in ms), then ``--runs`` programs through
``--concurrency`` slots at once (runs per second of the fleet), and prints one table row per
setting. ``--code`` replaces the program. The physical floor beside it: the same interpreter started
bare (``python -I -S -c pass``, as the sandbox starts it) without any sandbox, p50 in ms.

    python bench/sandbox.py --runs 100 --concurrency 1 2 4 8
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time

from reinforge.tools.sandbox import SandboxLimits, SandboxSlots, check_sandbox, run_python


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


async def sequential(code: str, runs: int, limits: SandboxLimits) -> tuple[list[float], int]:
    times, failures = [], 0
    for _ in range(runs):
        t = time.perf_counter()
        r = await run_python(code, limits, checked=True)
        times.append(time.perf_counter() - t)
        failures += bool(r.infra_error or r.returncode != 0)
    return times, failures


async def fleet(code: str, runs: int, concurrency: int, limits: SandboxLimits) -> tuple[float, int]:
    slots = SandboxSlots(concurrency)

    async def one():
        async with slots:
            return await run_python(code, limits, checked=True)

    t = time.perf_counter()
    results = await asyncio.gather(*(one() for _ in range(runs)))
    return time.perf_counter() - t, sum(bool(r.infra_error or r.returncode != 0) for r in results)


def bare_start_ms(runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-I", "-S", "-c", "pass"], check=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--code", default="pass")
    args = ap.parse_args()
    limits = SandboxLimits(timeout=30)
    check_sandbox("bwrap", limits.sandbox_uid)
    times, failures = asyncio.run(sequential(args.code, args.runs, limits))
    print(f"bare interpreter start (no sandbox), p50: {bare_start_ms(args.runs):.1f} ms")
    print(
        f"one sandbox at a time: start-to-exit p50 {percentile(times, 0.5) * 1e3:.1f} ms, "
        f"p99 {percentile(times, 0.99) * 1e3:.1f} ms, failures {failures}/{args.runs}"
    )
    print("\n| slots | runs | wall s | runs/s | failures |\n| ---: | ---: | ---: | ---: | ---: |")
    for c in args.concurrency:
        wall, failed = asyncio.run(fleet(args.code, args.runs, c, limits))
        print(f"| {c} | {args.runs} | {wall:.2f} | {args.runs / wall:.1f} | {failed} |")


if __name__ == "__main__":
    main()
