"""What a finished run shows: the before/after table, a curve PNG in the run directory, and the
commands that resume, evaluate and export it. Used by ``reinforge train`` and ``reinforge offline``
(and by ``scripts/plot_run.py`` for the PNG alone)."""

from __future__ import annotations

import logging
import shlex
from pathlib import Path

from ..utils.logging import read_metrics
from .evaluate import format_table

log = logging.getLogger(__name__)

CURVE_FILE = "curves.png"


def _moving_average(values: list[float], window: int) -> list[float]:
    w = max(1, window)
    return [sum(values[max(0, i - w + 1) : i + 1]) / len(values[max(0, i - w + 1) : i + 1]) for i in range(len(values))]


def plot_run(
    run_dir: str | Path,
    out: str | Path | None = None,
    curve_key: str = "rollout/reward_mean",
    eval_keys: tuple[str, ...] = ("eval/greedy_accuracy", "eval/pass@1"),
    smooth: int = 10,
    title: str = "",
    x_label: str = "rollout",
) -> Path | None:
    """Plot a run's training curve (``curve_key`` per logged step, raw and ``smooth``-step average)
    and its held-out evaluations (``eval_keys``, one marker per evaluation) from ``metrics.jsonl``.

    Args:
        run_dir: a run directory holding ``metrics.jsonl``.
        out: the PNG to write; default ``<run_dir>/curves.png``.
        curve_key: metric plotted per step (RL: ``rollout/reward_mean``; offline: ``train/loss``).
        eval_keys: evaluation metrics to plot where present (accuracy-like, in [0, 1], share the axis
            with ``curve_key`` when that lies in [0, 1]; otherwise they get a second y axis).
    Returns:
        The PNG's path, or ``None`` when matplotlib is not installed (``pip install reinforge[plot]``)
        or nothing was logged.
    Raises:
        FileNotFoundError: no ``metrics.jsonl`` in ``run_dir``.
    """
    run = Path(run_dir)
    path = run / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metrics.jsonl (is {run} a run directory?)")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("no curve PNG: matplotlib is not installed (pip install 'reinforge[plot]')")
        return None
    rows = read_metrics(path)  # a row cut short: skipped, with a warning naming file and line
    train = [r for r in rows if curve_key in r]
    evals = [r for r in rows if any(k in r for k in eval_keys)]
    if not train and not evals:
        return None
    x = [r["step"] for r in train]
    y = [r[curve_key] for r in train]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    unit_range = all(0.0 <= v <= 1.0 for v in y)
    if train:
        ax.plot(x, y, color="tab:blue", alpha=0.3, lw=0.8, label=curve_key)
        if len(y) > 2:
            ax.plot(
                x,
                _moving_average(y, smooth),
                color="tab:blue",
                lw=1.8,
                label=f"{curve_key} ({min(smooth, len(y))}-step average)",
            )
    ev_ax = ax if unit_range else ax.twinx()
    for key, style, color in zip(
        eval_keys, ("o-", "s--", "^:", "d-."), ("tab:red", "tab:orange", "tab:green", "tab:purple")
    ):
        pts = [(r["step"], r[key]) for r in evals if key in r]
        if pts:
            ev_ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                style,
                color=color,
                lw=1.6,
                ms=5,
                label=f"held-out {key.removeprefix('eval/')}",
            )
    if unit_range:
        ax.set_ylim(0, 1)
    ax.set_xlabel(x_label)
    ax.grid(alpha=0.3)
    handles = ax.get_legend_handles_labels()
    if ev_ax is not ax:
        extra = ev_ax.get_legend_handles_labels()
        handles = (handles[0] + extra[0], handles[1] + extra[1])
    ax.legend(*handles, loc="best", fontsize=8)
    ax.set_title(title or run.name)
    fig.tight_layout()
    target = Path(out) if out else run / CURVE_FILE
    fig.savefig(target)
    plt.close(fig)
    return target


def newest_listed(run_dir: Path) -> Path | None:
    """The newest checkpoint folder of ``run_dir/checkpoints`` that holds a ``state.json`` (RL, then
    offline), or None."""
    from ..checkpoint import list_checkpoints

    for prefix in ("rollout", "step"):
        found = [c for c in list_checkpoints(Path(run_dir) / "checkpoints", prefix) if (c / "state.json").is_file()]
        if found:
            return found[0]
    return None


def no_checkpoint_reason(run_dir: str | Path) -> str:
    """Why ``run_dir`` has no checkpoint to resume or export, in words, for the run's last line."""
    root = Path(run_dir) / "checkpoints"
    latest = root / "latest"
    if latest.is_file():
        return (
            f"no checkpoint to resume or export: {latest} names {latest.read_text().strip()}, which does not exist "
            f"(deleted or moved), and {root} holds no other"
        )
    if root.is_dir():
        return f"no checkpoint to resume or export: {root} holds none (deleted or moved?)"
    return "no checkpoint was written (run.save_final=false and no run.save_interval): nothing to resume or export"


def next_steps(run_dir: Path, command: str, checkpoint: Path | None, more_key: str, policy: bool = True) -> str:
    """One line with the commands that resume, evaluate and export the run in ``run_dir``; each
    is a command line ``reinforge`` accepts (``tests/integration/test_cli_help.py`` parses every one with
    :func:`reinforge.cli.build_parser`), separated by ``  |  `` after a ``what:`` label.

    Args:
        command: ``train`` or ``offline`` (the command that resumes).
        checkpoint: the newest checkpoint directory, or ``None`` when none was written.
        more_key: the key to raise to train further after resuming (``train.num_rollout``).
        policy: whether ``reinforge eval`` applies (not to a reward model).
    """
    q = shlex.quote
    checkpoint = checkpoint or newest_listed(run_dir)  # `latest` may name a checkpoint that is gone
    if checkpoint is None:
        return no_checkpoint_reason(run_dir)

    def opt(name: str, path: Path) -> str:  # --name=value: a path starting with "-" is not taken for an option
        return q(f"--{name}={path}")

    cfg = opt("config", run_dir / "config.yaml")
    parts = [f"resume: reinforge {command} {cfg} {opt('load', run_dir)} {more_key}=<more>"]
    if policy:
        parts.append(f"evaluate: reinforge eval {cfg} {opt('model', checkpoint / 'model')}")
    parts.append(
        f"export: reinforge convert {opt('checkpoint', run_dir)} {opt('out', run_dir / 'hf')} --dtype=bfloat16"
    )
    return "next: " + "  |  ".join(parts)


EXPORT_NOTE = (
    "export: --dtype=bfloat16 (the default) halves the folder but rounds the trained fp32 weights to bf16, so "
    "the exported model's evaluation can differ from the run's table; --dtype=float32 keeps them as trained"
)


def print_run_summary(
    run_dir: Path,
    evals: list[tuple[str, dict[str, float]]],
    *,
    command: str,
    checkpoint: Path | None,
    more_key: str,
    curve_key: str,
    eval_keys: tuple[str, ...],
    x_label: str,
    policy: bool = True,
) -> None:
    """Write ``eval_table.txt`` and ``curves.png`` into ``run_dir`` and print the table, the PNG's
    path, :func:`next_steps` and (a checkpoint written) :data:`EXPORT_NOTE`.
    A failure to plot is logged, never raised (the run is done)."""
    lines = []
    if evals:
        table = format_table(evals)
        (run_dir / "eval_table.txt").write_text(table + "\n")
        lines += ["", table]
    try:
        png = plot_run(run_dir, curve_key=curve_key, eval_keys=eval_keys, x_label=x_label)
    except Exception as e:  # noqa: BLE001 - a broken plot must not fail a finished run
        log.warning("could not plot the run: %s", e)
        png = None
    if png is not None:
        lines.append(f"\ncurves: {png}")
    lines.append(next_steps(run_dir, command, checkpoint, more_key, policy))
    if checkpoint is not None:
        lines.append(EXPORT_NOTE)
    print("\n".join(lines), flush=True)
