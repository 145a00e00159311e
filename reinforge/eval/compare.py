"""``reinforge compare``: how sure a comparison of evaluations on the same problems is.

Each evaluation is an ``eval/<label>.jsonl`` file (:func:`~reinforge.eval.evaluate.write_eval`: one line per
completion, the greedy ones first) or a run directory (its ``eval/after.jsonl`` or ``eval/final.jsonl``);
several runs of one arm (seeds) are given comma-separated. A problem is identified by its prompt and label,
so the evaluations are paired problem by problem; a problem's score in one run is its greedy completion's
correctness (``reward >= threshold``), or with ``sampled`` the mean correctness of its sampled completions.

The statistics, pure functions on numbers:

* each arm's accuracy with a 95% interval: Wilson's score interval for one run of 0/1 scores, else a
  bootstrap percentile interval (problems resampled; with several runs, runs resampled too);
* the paired difference of each arm with the first, with a 95% paired-bootstrap interval and a two-sided
  bootstrap p-value (the problems resampled together for both arms, and with several runs per arm the runs
  of each arm resampled as a second level: Davison & Hinkley 1997, ch. 3.8's two-stage bootstrap), and for
  one 0/1 run per arm McNemar's exact test on the discordant problems (Dietterich 1998);
* "not distinguishable" where the interval contains 0 (p >= 0.05).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval (Wilson 1927) of a binomial proportion ``successes / n``; (0, 1) when n is 0."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for ``b`` problems right only under A and ``c`` only under B: the
    binomial test of ``min(b, c)`` in ``b + c`` trials at 1/2, doubled and capped at 1 (1 when b + c is 0)."""
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def _resample_mean(scores: np.ndarray, problems: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """[B] means of ``scores`` [runs, problems] over the resampled ``problems`` [B, P], runs resampled per draw."""
    runs = scores.shape[0]
    if runs == 1:
        return scores[0][problems].mean(axis=1)
    picks = rng.integers(0, runs, size=(problems.shape[0], runs))  # the second level: runs (seeds)
    per_problem = scores[picks].mean(axis=1)  # [B, P]: each draw's mean over its resampled runs
    return np.take_along_axis(per_problem, problems, axis=1).mean(axis=1)


@dataclass
class Difference:
    """B's accuracy minus A's over the shared problems, its 95% interval and p-values."""

    diff: float
    low: float
    high: float
    p_bootstrap: float
    p_mcnemar: float | None = None  # one 0/1 run per arm only

    @property
    def distinguishable(self) -> bool:
        """Whether the 95% interval excludes 0."""
        return self.low > 0 or self.high < 0


def paired_bootstrap(
    a: np.ndarray, b: np.ndarray, resamples: int = 10000, seed: int = 0
) -> tuple[float, float, float, float]:
    """Paired (two-level with several runs) bootstrap of ``mean(b) - mean(a)``.

    Args:
        a, b: [runs, problems] scores of the same problems (column j is one problem in both).
        resamples: bootstrap draws; seed: their generator's seed.
    Returns:
        (the observed difference, the 2.5% and 97.5% percentiles of the resampled differences, the two-sided
        p-value ``min(1, 2 min(P(d <= 0), P(d >= 0)))`` of the resampled differences, floored at 1/resamples).
    Raises:
        ValueError: the arms hold different numbers of problems, or none.
    """
    a, b = np.atleast_2d(np.asarray(a, dtype=np.float64)), np.atleast_2d(np.asarray(b, dtype=np.float64))
    if a.shape[1] != b.shape[1] or a.shape[1] == 0:
        raise ValueError(f"paired_bootstrap: {a.shape[1]} and {b.shape[1]} problems (the same problems are needed)")
    rng = np.random.default_rng(seed)
    problems = rng.integers(0, a.shape[1], size=(resamples, a.shape[1]))
    d = _resample_mean(b, problems, rng) - _resample_mean(a, problems, rng)
    observed = float(b.mean() - a.mean())
    low, high = np.percentile(d, [2.5, 97.5])
    p = min(1.0, 2 * min(float((d <= 0).mean()), float((d >= 0).mean())))
    return observed, float(low), float(high), max(p, 1.0 / resamples)


def accuracy_interval(scores: np.ndarray, resamples: int = 10000, seed: int = 0) -> tuple[float, float, float]:
    """(mean, 95% low, 95% high) of ``scores`` [runs, problems]: Wilson's interval for one run of 0/1 scores,
    else the bootstrap percentile interval (problems and runs resampled)."""
    scores = np.atleast_2d(np.asarray(scores, dtype=np.float64))
    mean = float(scores.mean())
    if scores.shape[0] == 1 and np.isin(scores, (0.0, 1.0)).all():
        lo, hi = wilson_interval(int(scores.sum()), scores.shape[1])
        return mean, lo, hi
    rng = np.random.default_rng(seed)
    draws = _resample_mean(scores, rng.integers(0, scores.shape[1], size=(resamples, scores.shape[1])), rng)
    lo, hi = np.percentile(draws, [2.5, 97.5])
    return mean, float(lo), float(hi)


def compare_arms(a: np.ndarray, b: np.ndarray, resamples: int = 10000, seed: int = 0) -> Difference:
    """:class:`Difference` of arm ``b`` against arm ``a`` ([runs, problems] each, the same problems)."""
    a, b = np.atleast_2d(a), np.atleast_2d(b)
    diff, lo, hi, p = paired_bootstrap(a, b, resamples, seed)
    exact = None
    if a.shape[0] == b.shape[0] == 1 and np.isin(a, (0, 1)).all() and np.isin(b, (0, 1)).all():
        exact = mcnemar_exact(int(((a[0] == 1) & (b[0] == 0)).sum()), int(((a[0] == 0) & (b[0] == 1)).sum()))
    return Difference(diff, lo, hi, p, exact)


# ------------------------------------------------------------------------------ evaluation files


def eval_file(path: str | Path) -> Path:
    """The evaluation file of ``path``: the file itself, or a run directory's ``eval/after.jsonl`` (else
    ``eval/final.jsonl``).

    Raises:
        FileNotFoundError: naming what was looked for and the evaluations the directory holds.
    """
    p = Path(path)
    if p.is_file():
        return p
    if p.is_dir():
        for name in ("after", "final"):
            if (p / "eval" / f"{name}.jsonl").is_file():
                return p / "eval" / f"{name}.jsonl"
        held = sorted(f.name for f in (p / "eval").glob("*.jsonl")) if (p / "eval").is_dir() else []
        raise FileNotFoundError(
            f"{p}: no eval/after.jsonl or eval/final.jsonl"
            + (f"; it holds {', '.join(held)}: give one of them" if held else " (not a run directory with evaluations)")
        )
    raise FileNotFoundError(f"{p}: no such evaluation file or run directory")


def problem_scores(path: str | Path, threshold: float = 1.0, sampled: bool = False) -> dict[str, float]:
    """Each problem's score in one evaluation file: problem key (its prompt and label) -> the greedy
    completion's correctness (``reward >= threshold``), or with ``sampled`` the mean correctness of its
    sampled completions. A line's ``greedy`` field says which it is; files written before that field
    existed hold each problem's greedy completion first. Completions that failed by infrastructure
    (``reward`` null) are left out; a problem without a scored completion is left out.

    Raises:
        ValueError: a line that is not JSON (naming the file and line).
    """
    f = eval_file(path)
    greedy: dict[str, float] = {}
    samples: dict[str, list[float]] = {}
    seen: set[str] = set()
    for n, line in enumerate(f.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{f}:{n}: not a JSON line ({e.msg})") from None
        key = json.dumps([row.get("prompt"), row.get("label")], sort_keys=True, default=str)
        is_greedy = bool(row["greedy"]) if "greedy" in row else key not in seen
        seen.add(key)
        if row.get("reward") is None:
            continue
        correct = float(float(row["reward"]) >= threshold)
        if is_greedy:
            greedy.setdefault(key, correct)
        else:
            samples.setdefault(key, []).append(correct)
    if sampled:
        return {k: sum(v) / len(v) for k, v in samples.items()}
    return greedy


@dataclass
class Arm:
    """One side of a comparison: a name and its runs' per-problem scores."""

    name: str
    runs: list[dict[str, float]]


def load_arm(spec: str, threshold: float = 1.0, sampled: bool = False) -> Arm:
    """An arm from ``spec``: an evaluation file or run directory, or several comma-separated (seeds)."""
    paths = [s for s in spec.split(",") if s]
    return Arm(
        spec if len(paths) == 1 else f"{paths[0]} (+{len(paths) - 1} runs)",
        [problem_scores(p, threshold, sampled) for p in paths],
    )


def shared_problems(arms: list[Arm]) -> list[str]:
    """The problems every run of every arm scored (sorted keys)."""
    keys = set(arms[0].runs[0])
    for arm in arms:
        for run in arm.runs:
            keys &= set(run)
    return sorted(keys)


def comparison_table(arms: list[Arm], resamples: int = 10000, seed: int = 0, what: str = "greedy accuracy") -> str:
    """The report ``reinforge compare`` prints: each arm's accuracy with its 95% interval, then each later arm's
    paired difference with the first, its interval, p-values and verdict.

    Raises:
        ValueError: fewer than two arms, or no problem that every evaluation scored.
    """
    if len(arms) < 2:
        raise ValueError("compare needs at least two evaluations (or arms of comma-separated runs)")
    keys = shared_problems(arms)
    if not keys:
        raise ValueError("the evaluations share no scored problem (the same prompts and labels are needed)")
    grids = [np.array([[run[k] for k in keys] for run in arm.runs]) for arm in arms]
    width = max(len(a.name) for a in arms)
    lines = [f"{len(keys)} problems scored by every evaluation ({what}); 95% intervals", ""]
    for arm, g in zip(arms, grids):
        mean, lo, hi = accuracy_interval(g, resamples, seed)
        runs = f"{g.shape[0]} run{'s' if g.shape[0] > 1 else ''}"
        lines.append(f"  {arm.name:<{width}}  {mean:6.3f}  [{lo:.3f}, {hi:.3f}]  ({runs})")
    lines.append("")
    for arm, g in zip(arms[1:], grids[1:]):
        d = compare_arms(grids[0], g, resamples, seed)
        mc = f", McNemar exact p={d.p_mcnemar:.3g}" if d.p_mcnemar is not None else ""
        verdict = "distinguishable" if d.distinguishable else "not distinguishable"
        lines.append(
            f"  {arm.name} - {arms[0].name}: {d.diff:+.3f}  [{d.low:+.3f}, {d.high:+.3f}]  "
            f"paired bootstrap p={d.p_bootstrap:.3g}{mc}: {verdict} at 95%"
        )
    return "\n".join(lines)
