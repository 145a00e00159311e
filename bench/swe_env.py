"""The swe environment's costs (docs/agents.md#the-swe-environment): making a workspace (reset),
one test run in the sandbox (run_tests), deleting the workspace (close); one episode at a time,
then ``--concurrency`` episodes at once; and the generator's rows per second.

    .venv/bin/python bench/swe_env.py --episodes 40 --concurrency 4
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from reinforge.config import load_config
from reinforge.envs import EnvContext, Turn, load_environment
from reinforge.envs.swe_data import generate_repos
from reinforge.sandbox import Sandboxes
from reinforge.tools import ToolCall, ToolSet


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def episode(env_cls, row, ctx, times):
    env = env_cls(row, ctx)
    t = time.perf_counter()
    await env.reset()
    times["reset"].append(time.perf_counter() - t)
    t = time.perf_counter()
    step = await env.step(Turn("", [ToolCall("run_tests", {})]))
    times["run_tests"].append(time.perf_counter() - t)
    assert step.tool_results[0].error is None, step.tool_results[0].output
    t = time.perf_counter()
    await env.close()
    times["close"].append(time.perf_counter() - t)


async def run(rows, ctx, concurrency):
    env_cls = load_environment("swe")
    times = {"reset": [], "run_tests": [], "close": []}
    sem = asyncio.Semaphore(concurrency)

    async def one(row):
        async with sem:
            await episode(env_cls, row, ctx, times)

    await episode(env_cls, rows[0], ctx, {"reset": [], "run_tests": [], "close": []})  # warm-up: the sandbox check
    start = time.perf_counter()
    await asyncio.gather(*(one(r) for r in rows))
    return times, len(rows) / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--sandbox", default="bwrap")
    args = ap.parse_args()
    t = time.perf_counter()
    rows = generate_repos(args.episodes, seed=0)
    print(f"generator: {args.episodes / (time.perf_counter() - t):.0f} verified repositories/s")
    cfg = load_config(None, ["agent.environment=swe", f"sandbox.backend={args.sandbox}"])
    ctx = EnvContext(cfg.agent, ToolSet([]), {}, Sandboxes.from_config(cfg.sandbox, cfg.agent.tool_timeout))
    for c in (1, args.concurrency):
        times, eps = asyncio.run(run(rows, ctx, c))
        parts = [
            f"{k} p50 {statistics.median(v) * 1000:.1f} ms p99 {pct(v, 0.99) * 1000:.1f} ms" for k, v in times.items()
        ]
        print(f"concurrency {c}: {eps:.1f} episodes/s (reset + run_tests + close); " + "; ".join(parts))


if __name__ == "__main__":
    main()
