"""The python tool's sandbox: start latency and runs per second, on this machine, for both launchers.

For each ``--concurrency`` (slots at once) it runs ``--runs`` trivial programs (``pass``; ``--code``
replaces it) through each launcher: ``exec`` (a new interpreter runs the launcher for every run:
how sandboxes started before the launch server) and ``server`` (the launch server forks it:
reinforge.sandbox.launch_server). The launchers alternate in rounds of ``--round`` runs, so that a
change of the machine's load meets both alike. Per launcher and concurrency: the start latency
(``SandboxResult.start_ms``: launch to the program's first line, the ``sandbox/start_ms`` metric),
p50 / p99 in ms; the whole run (launch to result) p50; runs per second; failures (infrastructure
or a non-zero exit); and the CPU time one run costs, all processes together (the trainer's process,
the launch server and every process of the run: launcher, bwrap, the program), which the machine's
load does not change: on a shared machine the latencies grow with the load, the CPU time does not.
Beside it the floor: the interpreter started bare (``python -I -S -c pass``, as the sandbox starts
it), p50 in ms, and the load average before and after (the machine is shared).

    python bench/sandbox.py --runs 100 --concurrency 1 2 4 8
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from reinforge.sandbox import LAUNCHERS, SandboxLimits, SandboxSlots, check_sandbox, run_python


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in [0, 1]); nan for no values."""
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


async def fleet(code: str, runs: int, concurrency: int, limits: SandboxLimits, launcher: str) -> dict:
    """``runs`` programs through ``concurrency`` slots: start and run times (s), wall time, failures."""
    slots = SandboxSlots(concurrency)
    out: dict = {"start": [], "run": [], "failures": 0}

    async def one() -> None:
        async with slots:
            r = await run_python(code, limits, checked=True, launcher=launcher)
        if r.infra_error or r.returncode != 0:
            out["failures"] += 1
        if r.start_ms is not None:
            out["start"].append(r.start_ms)
        out["run"].append(r.seconds * 1e3)

    t = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(runs)))
    out["wall"] = time.perf_counter() - t
    return out


class CpuMeter:
    """CPU time of this process and every process it starts (the launch server, each run's launcher,
    bwrap and program, wherever they are reaped): a cgroup v1 ``cpuacct`` group of its own, which the
    sandboxes do not leave (they join memory, pids and cpu groups only). None where it cannot be made
    (no cgroup v1 cpuacct, not root)."""

    def __init__(self) -> None:
        self.dir: Path | None = Path("/sys/fs/cgroup/cpuacct") / f"reinforge-bench-{os.getpid()}"
        try:
            self.dir.mkdir()
            (self.dir / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            self.dir = None

    def seconds(self) -> float | None:
        return int((self.dir / "cpuacct.usage").read_text()) / 1e9 if self.dir is not None else None

    def close(self) -> None:
        """Back to the parent group, with the processes left in ours (the launch server), and remove it."""
        if self.dir is not None:
            for pid in (self.dir / "cgroup.procs").read_text().split():
                try:
                    (self.dir.parent / "cgroup.procs").write_text(pid)
                except OSError:  # gone meanwhile
                    pass
            self.dir.rmdir()


def bare_start_ms(runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-I", "-S", "-c", "pass"], check=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=50, help="runs per launcher and concurrency")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--round", type=int, default=10, help="runs of one launcher before the other's")
    ap.add_argument("--launchers", nargs="+", default=["exec", "server"], choices=LAUNCHERS)
    ap.add_argument("--code", default="pass")
    args = ap.parse_args()
    meter = CpuMeter()  # before anything starts: the server and the sandboxes are counted
    limits = SandboxLimits(timeout=30)
    check_sandbox("bwrap", limits.sandbox_uid)
    for launcher in args.launchers:  # warm-up: the server's start, the caches
        asyncio.run(fleet(args.code, 2, 1, limits, launcher))
    load = os.getloadavg()[0]
    print(f"bare interpreter start (no sandbox), p50: {bare_start_ms(20):.1f} ms; load average {load:.1f}")
    print(
        "\n| launcher | slots | runs | start p50 ms | start p99 ms | run p50 ms | runs/s | CPU ms/run | failures |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    )
    for c in args.concurrency:
        acc = {name: {"start": [], "run": [], "failures": 0, "wall": 0.0, "cpu": 0.0} for name in args.launchers}
        done = 0
        while done < args.runs:
            n = min(args.round, args.runs - done)
            for name in args.launchers:
                cpu = meter.seconds()
                r = asyncio.run(fleet(args.code, n, c, limits, name))
                acc[name]["cpu"] += (meter.seconds() - cpu) if cpu is not None else float("nan")
                for k in ("start", "run"):
                    acc[name][k] += r[k]
                acc[name]["failures"] += r["failures"]
                acc[name]["wall"] += r["wall"]
            done += n
        for name, a in acc.items():
            p50, p99 = percentile(a["start"], 0.5), percentile(a["start"], 0.99)
            print(
                f"| {name} | {c} | {args.runs} | {p50:.1f} | {p99:.1f} | {percentile(a['run'], 0.5):.1f} "
                f"| {args.runs / a['wall']:.1f} | {a['cpu'] / args.runs * 1e3:.1f} | {a['failures']} |"
            )
    print(f"\nload average after: {os.getloadavg()[0]:.1f}")
    meter.close()


if __name__ == "__main__":
    main()
