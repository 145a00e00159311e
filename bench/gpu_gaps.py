"""Where the GPU idles in a profiled stretch of work: a reading of a ``torch.profiler`` Chrome trace.

A small RL step is often bound by the host: the GPU waits while Python schedules, builds batches or
reads results back. The profiler's own tables sum kernel time; they do not say when the GPU had nothing
to run. This reads the trace the profiler exports (``prof.export_chrome_trace(path)``) and prints:

* per annotated phase (``record_function`` ranges; reinforge's ``trace.span`` phases show up as such
  while a torch profiler runs), its wall time, the time at least one kernel or copy ran on the GPU, and
  the idle rest;
* the longest GPU gaps, each with the phase it falls in and the host's top-level ``aten`` ops that ran
  during it (what is left of the gap ran Python or waited);
* per phase, the host's top-level ops by their summed duration (where a host-bound phase spends it).

The profiler slows the host (every op is recorded), so idle times here are upper bounds of those of an
unprofiled run; their order is what to read.

    python bench/gpu_gaps.py trace.json [--phases generate,reward,train] [--gaps 15]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Union of ``(start, end)`` intervals, sorted and disjoint."""
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def covered(busy: list[tuple[float, float]], a: float, b: float) -> float:
    """Length of ``[a, b)`` covered by the disjoint sorted intervals ``busy``."""
    return sum(max(0.0, min(b, y) - max(a, x)) for x, y in busy if y > a and x < b)


def top_level(ops: list[dict]) -> list[dict]:
    """The events of ``ops`` not nested inside another of the same thread (the outermost calls)."""
    out, by_thread = [], defaultdict(list)
    for e in ops:
        by_thread[(e.get("pid"), e.get("tid"))].append(e)
    for evs in by_thread.values():
        end = float("-inf")
        for e in sorted(evs, key=lambda e: (e["ts"], -e.get("dur", 0))):
            if e["ts"] >= end:
                out.append(e)
                end = e["ts"] + e.get("dur", 0)
    return out


def analyse(
    events: list[dict], phases: list[str] | None = None, gaps: int = 15, min_gap_us: float = 20.0, host_ops: int = 6
) -> dict:
    """GPU busy / idle time per phase and the longest gaps.

    Args:
        events: the trace's ``traceEvents`` (complete events, ``"ph": "X"``; times in microseconds).
        phases: names of the ``user_annotation`` ranges to report (None: every name that occurs).
        gaps: how many of the longest gaps to list.
        min_gap_us: gaps shorter than this are not listed (they still count as idle).
        host_ops: how many of each phase's top-level host ops (by their summed duration) to list.

    Returns:
        ``{"phases": [(name, wall_us, busy_us)], "gaps": [(start_us, length_us, phase, [(op, us)])],
        "host_ops": {phase: [(op, us, calls)]},
        "span": (start_us, end_us), "busy_us": float}``; times count from the first event.
    """
    xs = [e for e in events if e.get("ph") == "X" and "ts" in e]
    if not xs:
        raise ValueError("no complete events in the trace")
    t0 = min(e["ts"] for e in xs)
    kernels = merge([(e["ts"] - t0, e["ts"] - t0 + e.get("dur", 0)) for e in xs if e.get("cat") in GPU_CATS])
    notes = [e for e in xs if e.get("cat") == "user_annotation" and (phases is None or e["name"] in phases)]
    ops = top_level([e for e in xs if e.get("cat") == "cpu_op"])
    end = max(e["ts"] + e.get("dur", 0) for e in xs) - t0
    rows = []
    for name in dict.fromkeys(e["name"] for e in notes):
        wall = busy = 0.0
        for e in notes:
            if e["name"] == name:
                a = e["ts"] - t0
                wall += e["dur"]
                busy += covered(kernels, a, a + e["dur"])
        rows.append((name, wall, busy))
    holes = [(b0, a1 - b0) for (_, b0), (a1, _) in zip(kernels, kernels[1:]) if a1 - b0 >= min_gap_us]
    holes.sort(key=lambda h: -h[1])
    listed = []
    for start, length in holes[:gaps]:
        inside = [e["name"] for e in notes if e["ts"] - t0 <= start < e["ts"] - t0 + e["dur"]]
        by_op: dict[str, float] = defaultdict(float)
        for e in ops:
            a = e["ts"] - t0
            o = min(start + length, a + e.get("dur", 0)) - max(start, a)
            if o > 0:
                by_op[e["name"]] += o
        top = sorted(by_op.items(), key=lambda kv: -kv[1])[:3]
        listed.append((start, length, inside[-1] if inside else "-", top))
    hosts = {}
    for name, *_ in rows:
        by_op: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
        for n in notes:
            if n["name"] != name:
                continue
            a, b = n["ts"], n["ts"] + n["dur"]
            for e in ops:
                if a <= e["ts"] < b:
                    by_op[e["name"]][0] += e.get("dur", 0)
                    by_op[e["name"]][1] += 1
        hosts[name] = sorted(((k, us, c) for k, (us, c) in by_op.items()), key=lambda t: -t[1])[:host_ops]
    busy = sum(b - a for a, b in kernels)
    return {"phases": rows, "host_ops": hosts, "gaps": listed, "span": (0.0, end), "busy_us": busy}


def report(result: dict) -> str:
    """The tables of :func:`analyse`'s result (milliseconds)."""

    def row(name: str, wall: float, busy: float) -> str:
        ms = (wall / 1e3, busy / 1e3, (wall - busy) / 1e3)
        return f"| {name} | {ms[0]:.1f} | {ms[1]:.1f} | {ms[2]:.1f} | {busy / max(wall, 1e-9):.0%} |"

    lines = ["| phase | wall ms | GPU busy ms | GPU idle ms | busy |", "| --- | ---: | ---: | ---: | ---: |"]
    lines += [row(*r) for r in result["phases"]]
    a, b = result["span"]
    lines.append(row("(whole trace)", b - a, result["busy_us"]))
    lines += ["", "| gap ms | at ms | phase | host's top-level ops during the gap (ms) |"]
    lines.append("| ---: | ---: | --- | --- |")
    for start, length, phase, top in result["gaps"]:
        ops = ", ".join(f"{n} {us / 1e3:.2f}" for n, us in top) or "(no aten op: Python or a wait)"
        lines.append(f"| {length / 1e3:.2f} | {start / 1e3:.1f} | {phase} | {ops} |")
    lines += ["", "| phase | host's top-level ops: ms (calls) |", "| --- | --- |"]
    for name, top in result["host_ops"].items():
        lines.append(f"| {name} | " + ", ".join(f"{n} {us / 1e3:.1f} ({c})" for n, us, c in top) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", type=Path)
    ap.add_argument("--phases", help="comma-separated annotation names (default: all)")
    ap.add_argument("--gaps", type=int, default=15)
    args = ap.parse_args()
    events = json.loads(args.trace.read_text())["traceEvents"]
    print(report(analyse(events, args.phases.split(",") if args.phases else None, args.gaps)))


if __name__ == "__main__":
    main()
