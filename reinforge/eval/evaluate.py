"""Held-out evaluation: greedy accuracy, sampled pass@1 and unbiased pass@k, lengths."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from ..algo.passk import pass_at_k
from ..data import Prompt
from ..records import Sample, Status
from ..reward.manager import reward_info_metrics
from ..reward.registry import REWARDS
from ..rollout.generate import RolloutContext, generate_groups, rollout_stats
from ..rollout.infra_guard import failure_kind

log = logging.getLogger(__name__)


def threshold_metric_names(reward_type: str) -> tuple[str, str]:
    """``(greedy key, prefix of the pass@k keys)`` of the share of samples whose reward is at least
    ``reward.correct_threshold``: ``eval/greedy_accuracy`` and ``eval/pass@`` for a verifier
    (reasoning-gym, math, exact match, custom), ``eval/greedy_score_above_threshold`` and
    ``eval/score_above_threshold@`` for a reward registered with ``preference``
    (:data:`~reinforge.reward.registry.REWARDS`: ``reward.type=model``), whose scores measure a
    reward model's preference, not correctness."""
    if REWARDS.info(reward_type).get("preference"):
        return "eval/greedy_score_above_threshold", "eval/score_above_threshold@"
    return "eval/greedy_accuracy", "eval/pass@"


def eval_plot_keys(reward_type: str) -> tuple[str, str]:
    """The evaluation metrics a run's ``curves.png`` shows: the greedy share and the @1 share."""
    greedy, at = threshold_metric_names(reward_type)
    return greedy, f"{at}1"


class EvalProgress:
    """An evaluation's console output: a start line (``evaluating N prompts (label): 1 greedy + n sampled
    completions each, M in all``), a progress bar with ETA over the completions (``run.progress``; tqdm,
    as the training loop's bar) fed after each engine step where the engine reports its steps (the
    embedded engine's :attr:`~reinforge.engine.engine.EmbeddedEngine.on_step`), else after each pass,
    and an end line with the seconds taken. The engine's hook is removed on exit."""

    def __init__(self, ctx: Any, num_prompts: int, n: int, label: str):
        # per-step progress from the engine's one batch; a custom generate function calls it many times
        self.engine = getattr(ctx, "engine", None) if getattr(ctx, "custom_generate", None) is None else None
        self.total, self.base, self.label = num_prompts * (1 + n), 0, label
        self.bar: Any = None
        log.info(
            "evaluating %d prompts%s: 1 greedy + %d sampled completion(s) each, %d in all",
            num_prompts,
            f" ({label})" if label else "",
            n,
            self.total,
        )
        if getattr(getattr(ctx.config, "run", None), "progress", False) and self.total:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, desc="eval", unit="completion", dynamic_ncols=True, leave=False)

    def __enter__(self) -> EvalProgress:
        self.start = time.perf_counter()
        if self.engine is not None and hasattr(self.engine, "on_step"):
            self.engine.on_step = self._step
        return self

    def _step(self, finished: int) -> None:  # completions of the pass in flight finished so far
        if self.bar is not None:
            self.bar.update(self.base + finished - self.bar.n)

    def done(self, finished: int) -> None:
        """``finished`` completions of the whole evaluation are done (a pass ended)."""
        self.base = finished
        self._step(0)

    def __exit__(self, *exc: Any) -> None:
        if self.engine is not None and hasattr(self.engine, "on_step"):
            self.engine.on_step = None
        if self.bar is not None:
            self.bar.close()
        log.info("evaluated %d completions in %.1f s", self.total, time.perf_counter() - self.start)


GREEDY_KEY = "eval_greedy"
"""``sample.metadata`` key of an evaluation's completion: True for the greedy one of its prompt, False for a
sampled one (written as ``greedy`` in ``eval/<label>.jsonl``)."""


def evaluate(ctx: RolloutContext, prompts: list[Prompt], label: str = "") -> tuple[dict[str, float], list[Sample]]:
    """Evaluate the engine's current policy on ``prompts`` (``label``: the evaluation's name in the
    start line that :class:`EvalProgress` prints, with a progress bar, while it runs).

    One greedy completion per prompt gives ``eval/greedy_accuracy`` (share with reward >=
    ``reward.correct_threshold``); ``eval.n_samples_per_eval_prompt`` sampled completions
    give ``eval/pass@1`` (mean correctness) and ``eval/pass@k`` for each ``eval.pass_k``
    (unbiased estimator, Chen et al. 2021). With ``reward.type=model`` the same shares are named
    ``eval/greedy_score_above_threshold`` and ``eval/score_above_threshold@k``
    (:func:`threshold_metric_names`): a reward model's score above a threshold is not accuracy.
    Lengths are in tokens; ``truncated`` is the share of completions that hit the length limit.

    A sample that failed by infrastructure (status ``failed``: its environment, sandbox, MCP server or
    judge failed) is not a wrong answer: every share and mean is over the **scored** samples, and the
    failed ones are counted in ``eval/failed_samples`` (greedy and sampled; ``eval/greedy_failed`` of
    the greedy ones). pass@k of a prompt uses its scored samples (``n`` minus the failed), and a prompt
    with fewer than ``k`` of them is left out of pass@k. A metric with no scored sample is NaN.

    Returns:
        (metrics, all scored samples: greedy ones first).
    """
    cfg = ctx.config
    greedy_key, at = threshold_metric_names(cfg.reward.type)
    n = cfg.eval.n_samples_per_eval_prompt
    with EvalProgress(ctx, len(prompts), n, label) as progress:
        greedy = generate_groups(ctx, prompts, 1, ctx.sampling_params(evaluation=True, greedy=True))
        progress.done(len(prompts))
        sampled = generate_groups(ctx, prompts, n, ctx.sampling_params(evaluation=True)) if n > 0 else []
        progress.done(len(prompts) * (1 + n))
        flat = [s for g in greedy + sampled for s in g]
        for g, is_greedy in ((greedy, True), (sampled, False)):
            for s in (s for group in g for s in group):
                s.metadata[GREEDY_KEY] = is_greedy
        unscored = [s for s in flat if s.reward is None]  # an environment's episodes come with their reward
        counts = ctx.reward.score(unscored) if unscored else {}
    thr = cfg.reward.correct_threshold

    def correct(s: Sample) -> bool:
        return s.reward is not None and s.reward >= thr

    scored_greedy = [g[0] for g in greedy if g[0].status != Status.FAILED]
    scored_groups = [[s for s in g if s.status != Status.FAILED] for g in sampled]
    scored_sampled = [s for g in scored_groups for s in g]
    m: dict[str, float] = {
        "eval/num_prompts": float(len(prompts)),
        greedy_key: _mean([correct(s) for s in scored_greedy]),
        "eval/greedy_reward": _mean([s.reward for s in scored_greedy]),
        "eval/greedy_response_len": _mean([s.response_length for s in scored_greedy]),
        "eval/greedy_truncated": _mean([s.status == Status.TRUNCATED for s in scored_greedy]),
    }
    if sampled:
        m[f"{at}1"] = _mean([correct(s) for s in scored_sampled])
        for k in cfg.eval.pass_k:
            m[f"{at}{k}"] = _mean([pass_at_k(len(g), sum(map(correct, g)), k) for g in scored_groups if len(g) >= k])
        m["eval/sampled_reward"] = _mean([s.reward for s in scored_sampled])
        m["eval/sampled_response_len"] = _mean([s.response_length for s in scored_sampled])
        m["eval/sampled_truncated"] = _mean([s.status == Status.TRUNCATED for s in scored_sampled])
    m["eval/greedy_failed"] = float(len(greedy) - len(scored_greedy))
    m["eval/failed_samples"] = float(len(flat) - len(scored_greedy) - len(scored_sampled))
    m["eval/reward_errors"] = counts.get("reward/errors", 0.0) + counts.get("reward/timeouts", 0.0)
    m.update({f"eval/{k}": v for k, v in rollout_stats(flat).items()})  # e.g. agent tool use
    m.update(reward_info_metrics(flat, prefix="eval/reward_info/"))  # a custom reward's extra numbers
    return m, flat


def _mean(xs: list[Any]) -> float:
    """The mean of the numbers of ``xs`` (None skipped); NaN when there is none (nothing was scored)."""
    xs = [float(x) for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else float("nan")


def model_label(path: str | Path) -> str:
    """How an eval table names a model folder: ``runs/x/checkpoints/rollout_000099/model`` is
    ``x/rollout_000099`` (not ``model``), any other folder its name."""
    p = Path(str(path))
    if p.name == "model" and p.parent.parent.name == "checkpoints":
        return f"{p.parent.parent.parent.name}/{p.parent.name}"
    if p.name == "model":
        return p.parent.name
    return p.name


def format_table(rows: list[tuple[str, dict[str, float]]]) -> str:
    """Eval results as a fixed-width text table: one row per (label, metrics)."""
    if not rows:
        return ""
    keys = [k for k in rows[0][1] if k != "eval/num_prompts"]
    headers = ["", *(k.removeprefix("eval/") for k in keys)]
    body = [[label, *(_fmt(m.get(k)) for k in keys)] for label, m in rows]
    widths = [max(len(str(r[i])) for r in [headers, *body]) for i in range(len(headers))]
    lines = [
        "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
        for r in [headers, *body]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if abs(v) >= 10 else f"{v:.3f}"


def write_eval(out_dir: Path, label: str, metrics: dict[str, float], samples: list[Sample]) -> None:
    """Append metrics to ``eval.jsonl`` and write the completions to ``eval/<label>.jsonl`` (a failed
    sample with ``reward`` null, its ``infra_failure`` reason and ``infra_failure_kind``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / "eval.jsonl").open("a") as f:
        f.write(json.dumps({"label": label, **metrics}) + "\n")
    (out_dir / "eval").mkdir(exist_ok=True)
    with (out_dir / "eval" / f"{label}.jsonl").open("w") as f:
        for s in samples:
            f.write(
                json.dumps(
                    {
                        "greedy": s.metadata.get(GREEDY_KEY),  # (reinforge compare pairs problems by it)
                        "prompt": s.prompt,
                        "response": s.response,
                        "label": s.label,
                        "reward": None if s.status == Status.FAILED else s.reward,  # a placeholder is no score
                        "status": s.status.value,
                        **(
                            {"infra_failure": s.metadata.get("infra_failure", ""), "infra_failure_kind": kind}
                            if (kind := failure_kind(s))
                            else {}
                        ),
                    }
                )
                + "\n"
            )
