"""The local sandbox fleet on this machine: copy-on-write workspaces and sandbox episodes at rising
concurrency, and the largest fleet that holds its limits.

1. Workspaces (reinforge.sandbox.workspace): making one over a base of 20, 2,000 and 20,000 files (the
   episode's own layer over the shared base: nothing is copied), p50 / p99 in ms, and closing it;
   a git base's first extraction and a cached lookup.
2. Episodes: workspace over the 2,000-file base + one edit + one sandbox run of a trivial program
   that reads the edit through the merged, read-only view + close, ``--episodes`` of them through
   ``c`` slots (``sandbox.max_concurrent``) for each ``--concurrency``. One episode in
   ``--hog-every`` runs a memory hog instead: two children of ``--hog-mb`` MiB each under a
   ``--memory-mb`` limit (the sandbox's whole group may hold ``memory_mb + disk_mb``; each child
   alone is within the per-process limit): the sandbox's cgroup must kill one. A level **holds its
   limits** when no run is an infrastructure failure or times out, every trivial program ran and saw
   its edit, and every hog was stopped at the group's memory limit (killed, or ``MemoryError``).

Per level: episodes per second (all, hogs included), start latency p50 / p99 (the
``sandbox/start_ms`` metric), episode p50 / p99, CPU ms per episode (all processes: bench/sandbox.py's
``CpuMeter``), failures, hogs stopped / hogs, and whether it held.
The largest level that held is printed last. The load average (the machine is shared) before and after.

    python bench/sandbox_fleet.py --concurrency 1 2 4 8 16 32 64 --episodes 64
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from sandbox import CpuMeter  # bench/sandbox.py (bench/ is on sys.path for bench scripts)

from reinforge.sandbox import SandboxLimits, SandboxSlots, check_sandbox, run_python
from reinforge.sandbox.workspace import Workspace, git_base

TRIVIAL = "print(open('repo/edit.txt').read())"
HOG = """
import os, time
def child():
    b = bytearray({mb} * 2**20)
    for j in range(0, len(b), 4096):
        b[j] = 1
    time.sleep(0.2)
    os._exit(0)
pids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        child()
    pids.append(pid)
print(sum(os.WIFSIGNALED(os.waitpid(p, 0)[1]) for p in pids))
"""


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def make_base(root: Path, n: int) -> Path:
    for i in range(n):
        d = root / f"pkg{i % 50}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"mod{i}.py").write_text(f"VALUE = {i}\n")
    for p in [root, *root.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    return root


def workspaces(tmp: Path, sizes: list[int], n: int) -> None:
    print(
        "| base files | make p50 ms | make p99 ms | close p50 ms | files copied |\n| ---: | ---: | ---: | ---: | ---: |"
    )
    for size in sizes:
        base = make_base(tmp / f"base{size}", size)
        make, close, copied = [], [], 0
        for _ in range(n):
            t = time.perf_counter()
            ws = Workspace(base, tmp)
            make.append((time.perf_counter() - t) * 1e3)
            copied += sum(1 for _ in ws.upper.rglob("*"))
            t = time.perf_counter()
            ws.close()
            close.append((time.perf_counter() - t) * 1e3)
        print(f"| {size} | {pct(make, 0.5):.2f} | {pct(make, 0.99):.2f} | {pct(close, 0.5):.2f} | {copied} |")


def git_timing(tmp: Path, base: Path) -> None:
    repo = tmp / "repo"
    shutil.copytree(base, repo)
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "b"}
    env["GIT_COMMITTER_EMAIL"] = "b@b"
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "base"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, env=env, capture_output=True)
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    t = time.perf_counter()
    git_base(str(repo), commit.strip(), tmp / "cache")
    first = time.perf_counter() - t
    cached = []
    for _ in range(20):
        t = time.perf_counter()
        git_base(str(repo), commit.strip(), tmp / "cache")
        cached.append(time.perf_counter() - t)
    print(
        f"\ngit base of {sum(1 for _ in base.rglob('*.py'))} files: first extraction {first * 1e3:.0f} ms, "
        f"cached lookup p50 {pct(cached, 0.5) * 1e3:.3f} ms"
    )


async def level(base: Path, tmp: Path, c: int, episodes: int, args: argparse.Namespace) -> dict:
    slots = SandboxSlots(c)
    limits = SandboxLimits(timeout=args.timeout, memory_mb=args.memory_mb)
    out: dict = {"start": [], "episode": [], "failures": 0, "timeouts": 0, "bad": 0, "hogs": 0, "stopped": 0}

    async def episode(i: int) -> None:
        hog = args.hog_every > 0 and i % args.hog_every == args.hog_every - 1
        async with slots:  # the whole episode holds the slot: its time is not spent waiting for one
            t = time.perf_counter()
            ws = Workspace(base, tmp)
            try:
                ws.write_bytes("edit.txt", f"episode {i}".encode())
                code = HOG.format(mb=args.hog_mb) if hog else TRIVIAL
                r = await run_python(code, limits, checked=True, binds={"repo": ws.layers})
            finally:
                ws.close()
            out["episode"].append((time.perf_counter() - t) * 1e3)
        if r.start_ms is not None:
            out["start"].append(r.start_ms)
        out["failures"] += r.infra_error is not None
        out["timeouts"] += r.timed_out
        if hog:
            out["hogs"] += 1
            out["stopped"] += r.oom_kills > 0 or "MemoryError" in r.stderr
        elif r.infra_error is None and (r.returncode != 0 or r.stdout.strip() != f"episode {i}"):
            out["bad"] += 1

    t = time.perf_counter()
    await asyncio.gather(*(episode(i) for i in range(episodes)))
    out["wall"] = time.perf_counter() - t
    out["held"] = not (out["failures"] or out["timeouts"] or out["bad"]) and out["stopped"] == out["hogs"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--episodes", type=int, default=64, help="episodes per level (at least 2 x the level)")
    ap.add_argument("--base-files", type=int, default=2000)
    ap.add_argument("--sizes", type=int, nargs="+", default=[20, 2000, 20000], help="base sizes for part 1")
    ap.add_argument("--workspaces", type=int, default=200, help="workspaces made per base size")
    ap.add_argument("--timeout", type=float, default=10.0, help="each run's time limit, seconds")
    ap.add_argument("--memory-mb", type=int, default=128)
    ap.add_argument("--hog-mb", type=int, default=120)
    ap.add_argument("--hog-every", type=int, default=8, help="one episode in N is a memory hog (0: none)")
    args = ap.parse_args()
    meter = CpuMeter()
    check_sandbox("bwrap", SandboxLimits().sandbox_uid)
    tmp = Path(tempfile.mkdtemp(prefix="reinforge-fleet-bench-"))
    os.chmod(tmp, 0o755)
    try:
        print(f"load average {os.getloadavg()[0]:.1f}; cores {os.cpu_count()}\n")
        workspaces(tmp, args.sizes, args.workspaces)
        base = make_base(tmp / "fleet-base", args.base_files)
        git_timing(tmp, base)
        asyncio.run(level(base, tmp, 1, 2, args))  # warm-up: the launch server, the overlay check
        print(
            f"\nepisodes: workspace over {args.base_files} files + edit + sandbox run + close; memory_mb "
            f"{args.memory_mb}, timeout {args.timeout:g} s, one hog in {args.hog_every}\n\n"
            "| slots | episodes | episodes/s | start p50 ms | start p99 ms | episode p50 ms | episode p99 ms "
            "| CPU ms/episode | infra failures | timeouts | wrong | hogs stopped | held |\n"
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
        )
        largest = None
        for c in args.concurrency:
            n = max(args.episodes, 2 * c)
            cpu = meter.seconds()
            r = asyncio.run(level(base, tmp, c, n, args))
            cpu = (meter.seconds() - cpu) / n * 1e3 if cpu is not None else float("nan")
            largest = c if r["held"] else largest
            print(
                f"| {c} | {n} | {n / r['wall']:.1f} | {pct(r['start'], 0.5):.1f} | {pct(r['start'], 0.99):.1f} "
                f"| {pct(r['episode'], 0.5):.0f} | {pct(r['episode'], 0.99):.0f} | {cpu:.0f} | {r['failures']} "
                f"| {r['timeouts']} "
                f"| {r['bad']} | {r['stopped']}/{r['hogs']} | {'yes' if r['held'] else 'no'} |"
            )
        print(
            f"\nlargest fleet that held its limits: {largest} sandboxes at once; load average {os.getloadavg()[0]:.1f}"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        meter.close()


if __name__ == "__main__":
    main()
