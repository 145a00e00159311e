"""Render a run's ``trace.json`` (:mod:`reinforge.utils.trace`) to a PNG: one band per track
(thread; processes in their ``process_sort_index`` order), nested spans stacked below their
parents, one colour per span name, instants as ticks. For a look without a browser;
ui.perfetto.dev shows the same file interactively.

``python -m reinforge.utils.trace_plot RUN_DIR/trace.json OUT.png [--max-depth 3] [--title T]``
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path
from typing import Any

from .trace import read_trace

__all__ = ["plot_trace", "span_depths"]


def span_depths(spans: list[dict[str, Any]]) -> list[int]:
    """The nesting depth of each complete event of one track (0: not inside another), in input order.

    A span is inside another when it starts at or after the other's start and ends at or before
    its end (``ts``/``dur`` in microseconds; 1 ns of slack for rounding)."""
    order = sorted(range(len(spans)), key=lambda i: (spans[i]["ts"], -spans[i]["dur"]))
    depth = [0] * len(spans)
    stack: list[float] = []  # end times of the open ancestors
    for i in order:
        end = spans[i]["ts"] + spans[i]["dur"]
        while stack and stack[-1] < end - 1e-3:
            stack.pop()
        depth[i] = len(stack)
        stack.append(end)
    return depth


def plot_trace(path: str | Path, out: str | Path, max_depth: int = 3, title: str = "") -> Path:
    """Draw the trace at ``path`` into ``out`` (PNG); spans nested deeper than ``max_depth`` are left out.

    Raises:
        ValueError: the file holds no complete events (or is not a trace).
        ImportError: matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    events = read_trace(path)
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        raise ValueError(f"{path}: no spans to draw")
    t0 = min(e["ts"] for e in spans)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    tracks: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for e in spans:
        tracks[(e["pid"], e.get("tid", 0))].append(e)
    rank = {e["pid"]: e["args"]["sort_index"] for e in events if e.get("name") == "process_sort_index"}
    order = sorted(tracks, key=lambda k: (rank.get(k[0], 1 << 30), k[0], names.get(k) != "loop", names.get(k, "")))
    colours = {}
    cmap = plt.get_cmap("tab20")
    fig_rows = []
    for key in order:
        depths = span_depths(tracks[key])
        fig_rows.append((key, depths, min(max(depths), max_depth) + 1))
    height = sum(r[2] for r in fig_rows)
    fig, ax = plt.subplots(figsize=(14, 1.0 + 0.45 * height))
    y = 0.0
    ticks, labels = [], []
    for key, depths, lanes in fig_rows:
        for e, d in zip(tracks[key], depths):
            if d > max_depth:
                continue
            c = colours.setdefault(e["name"], cmap(len(colours) % 20))
            x, w = (e["ts"] - t0) / 1e6, e["dur"] / 1e6
            ax.broken_barh([(x, w)], (y + d + 0.1, 0.8), facecolors=c, edgecolors="black", linewidth=0.3)
        for e in events:
            if e.get("ph") == "i" and (e["pid"], e.get("tid", 0)) == key:
                ax.plot([(e["ts"] - t0) / 1e6] * 2, [y, y + lanes], color="red", linewidth=0.8)
        ticks.append(y + lanes / 2)
        proc = procs.get(key[0], str(key[0]))
        labels.append(f"{names.get(key, key[1])}\n({proc})")
        y += lanes
        ax.axhline(y, color="grey", linewidth=0.5)
    ax.set_ylim(y, 0)
    ax.set_yticks(ticks, labels, fontsize=8)
    ax.set_xlabel("seconds since the first span")
    ax.legend(
        handles=[Patch(color=c, label=n) for n, c in colours.items()],
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=7,
    )
    if title:
        ax.set_title(title)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--max-depth", type=int, default=3, help="leave out spans nested deeper than this")
    ap.add_argument("--title", default="")
    args = ap.parse_args()
    print(plot_trace(args.trace, args.out, args.max_depth, args.title))


if __name__ == "__main__":
    main()
