"""One run driver for every training mode: the loop around a job's steps.

A *job* knows how to take one step, evaluate once, write its part of a checkpoint and what its
checkpoint state is (:class:`Job`; the RL loop :class:`reinforge.loop.RLLoop`, the offline loop
:class:`reinforge.offline_loop.OfflineLoop`). :class:`Driver` owns everything around the steps,
the same for each mode: the metrics logger (``metrics.jsonl``, TensorBoard, W&B), the progress
bar, the trace (``run.trace``), when to evaluate (``eval.eval_before_train``, ``eval.eval_interval``,
at the end) and when to save (``run.save_interval``, ``run.save_final``), recover checkpoints
(``run.recover=auto`` every ``run.recover_interval_s``; SIGTERM / SIGINT: a checkpoint at the end
of the step in flight, then :class:`~reinforge.recover.Preempted`, :class:`~reinforge.recover.RecoverTimer`)
and the summary printed at the end. Which checkpoint a run resumes from (with the fallback to an
older one) is :mod:`reinforge.run.resume`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .. import checkpoint as ckpt
from ..config import Config
from ..eval.summary import print_run_summary
from ..recover import Preempted, RecoverTimer
from ..utils import trace
from ..utils.logging import MetricsLogger

log = logging.getLogger(__name__)


class Job(Protocol):
    """What one training mode tells the :class:`Driver`.

    Attributes:
        start: the first step to run (0, or the step after a resumed checkpoint's).
        evals: ``(label, metrics)`` of every evaluation so far (a resumed run's included); the
            driver appends to it and stores it in each checkpoint.
    """

    start: int
    evals: list[tuple[str, dict[str, float]]]

    def step(self, i: int) -> dict[str, float]:
        """Step ``i`` (a rollout: take -> score -> train -> sync; offline: one optimizer step);
        its metrics, logged at ``i + 1``."""
        ...

    def evaluate(self, label: str, i: int) -> dict[str, float] | None:
        """Evaluate after ``i`` steps (None: no evaluation data). The driver logs the metrics."""
        ...

    def save(self, directory: Path | None, i: int) -> None:
        """Write this process's part of the checkpoint of step ``i`` into ``directory`` (None on a
        rank other than the main one, which is told the folder by a collective)."""
        ...

    def state(self) -> dict[str, Any]:
        """What ``state.json`` holds besides the step, config and evaluations (read after :meth:`save`)."""
        ...

    def begin(self) -> None:
        """Before the first step (and the evaluation before training)."""
        ...

    def finish(self) -> str | None:
        """After the last step, before the final evaluation; a line to print above the summary."""
        ...

    def cleanup(self) -> None:
        """However the run ends (also after an error or a signal)."""
        ...


@dataclass
class RunSpec:
    """What differs between modes in the run around the steps.

    Attributes:
        command: the CLI command (``train``, ``offline``), named in the summary's next commands.
        unit: ``rollout`` or ``step``: checkpoints are ``<unit>_NNNNNN``, evaluations ``<unit>_N``.
        position_key: the ``state.json`` key of the last step a checkpoint holds (``rollout_id``, ``step``).
        total: steps of the whole run.
        trace_title: the process name in ``trace.json``.
        progress_desc, progress_unit: the progress bar's label and unit.
        postfix: the progress bar's figures from a step's metrics.
        summary: keyword arguments of :func:`~reinforge.eval.summary.print_run_summary`.
        first_row: metrics logged at step 0 of a run started from scratch (data counts).
        is_main: this process logs, shows progress, traces, names checkpoints and prints the summary.
        agree: whether any rank wants a checkpoint now (several ranks: every one must save together).
        barrier: after a checkpoint is in place (several ranks).
    """

    command: str
    unit: str
    position_key: str
    total: int
    trace_title: str
    progress_desc: str
    progress_unit: str
    postfix: Callable[[dict[str, float]], dict[str, str]]
    summary: dict[str, Any] = field(default_factory=dict)
    first_row: dict[str, float] | None = None
    is_main: bool = True
    agree: Callable[[bool], bool] = lambda due: due
    barrier: Callable[[], None] = lambda: None


class Driver:
    """Runs a :class:`Job` from its ``start`` to ``spec.total`` (docs/design.md, "One driver").

    Args:
        job: the mode's steps, evaluation and checkpoint files.
        cfg: the run's config (``run``, ``eval`` sections read here).
        spec: what differs between modes.
    """

    def __init__(self, job: Job, cfg: Config, spec: RunSpec):
        self.job, self.cfg, self.spec = job, cfg, spec
        self.out = Path(cfg.run.output_dir)
        r = cfg.run
        self.timer = RecoverTimer(r.recover_interval_s if r.recover == "auto" else None)
        self.logger: MetricsLogger | None = None
        self.last = job.start - 1  # the last step finished

    # ------------------------------------------------------------------ pieces
    def evaluate(self, label: str, i: int) -> dict[str, float] | None:
        """The job's evaluation after ``i`` steps, logged at ``i`` and kept in ``job.evals``."""
        metrics = self.job.evaluate(label, i)
        if metrics is None:
            return None
        if self.logger is not None:
            self.logger.log(i, metrics)
        self.job.evals.append((label, metrics))
        return metrics

    def save(self, i: int) -> Path | None:
        """Checkpoint ``<output_dir>/checkpoints/<unit>_<i>`` (atomic; every rank takes part, the main one
        renames it into place and prunes older ones); its path on the main rank, else None."""
        spec, r = self.spec, self.cfg.run
        with trace.span("checkpoint", "io", **{spec.position_key: i}), self.timer.saving():
            if not spec.is_main:
                self.job.save(None, i)
                spec.barrier()
                return None
            state: dict[str, Any] = {spec.position_key: i, "config": self.cfg.to_dict(), "evals": self.job.evals}

            def write(d: Path) -> None:
                self.job.save(d, i)
                state.update(self.job.state())  # after the files (RL: the rollouts in flight finish meanwhile)

            path = ckpt.save_checkpoint(
                self.out / "checkpoints",
                i,
                write,
                state,
                keep_last=r.keep_last_n_checkpoints,
                prefix=spec.unit,
                drop_older_optimizer=r.save_optimizer == "newest",
            )
            log.info("saved checkpoint %s (%s)", path, ckpt.size_summary(path))
            spec.barrier()
        return path

    def _after_step(self, i: int) -> None:
        """Evaluation and checkpoint cadence after step ``i`` (the last step's are the run's end's)."""
        cfg, spec, timer = self.cfg, self.spec, self.timer
        if i == spec.total - 1:
            return
        e, s = cfg.eval.eval_interval, cfg.run.save_interval
        if e and (i + 1) % e == 0:
            self.evaluate(f"{spec.unit}_{i + 1}", i + 1)
        if not (s and (i + 1) % s == 0) and not spec.agree(timer.due()):
            return
        path = self.save(i)  # every save_interval steps, or a recover checkpoint
        timer.saved()
        if spec.agree(timer.signal is not None):  # (several ranks: one signalled stops every one)
            signame = timer.signal or "SIGTERM"
            log.warning(
                "stopped after %s: checkpoint %s holds %s %d; resume with --load %s",
                signame,
                path,
                spec.unit,
                i,
                self.out,
            )
            raise Preempted(signame, path or self.out)

    # ------------------------------------------------------------------ the run
    def run(self) -> int:
        """Run the remaining steps, the evaluations and checkpoints due, the final ones and the
        summary. Returns the last step finished (``start - 1`` when none was left).

        Raises:
            Preempted: SIGTERM / SIGINT arrived; a checkpoint holds the last step finished.
        """
        cfg, spec, job = self.cfg, self.spec, self.job
        r, start = cfg.run, job.start
        if spec.is_main:
            self.logger = MetricsLogger(
                self.out,
                r.tensorboard,
                wandb_project=r.wandb_project,
                wandb_group=r.wandb_group,
                wandb_mode=r.wandb_mode,
                config=cfg.to_dict(),
                start_step=start + 1 if start else 0,  # drop redone rows (and a row cut short)
            )
            if start == 0 and spec.first_row is not None:
                self.logger.log(0, spec.first_row)
        timer = self.timer
        timer.install()  # SIGTERM / SIGINT: a checkpoint at the end of the step in flight, then stop
        bar = None
        line = None
        if r.trace and spec.is_main:
            trace.start_trace(self.out / trace.TRACE_FILE, spec.trace_title)
        try:
            job.begin()
            if cfg.eval.eval_before_train and start == 0:
                self.evaluate("before", 0)
            if r.progress and spec.is_main:
                from tqdm.auto import tqdm

                bar = tqdm(
                    total=spec.total,
                    initial=start,
                    desc=spec.progress_desc,
                    unit=spec.progress_unit,
                    dynamic_ncols=True,
                )
            for i in range(start, spec.total):
                metrics = job.step(i)
                if self.logger is not None:
                    self.logger.log(i + 1, metrics)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(**spec.postfix(metrics))
                self._after_step(i)
                self.last = i
            line = job.finish()
            if start < spec.total:
                self.evaluate("after" if spec.total else "final", spec.total)
                if r.save_final:
                    self.save(spec.total - 1)
        finally:
            job.cleanup()
            if bar is not None:
                bar.close()
            trace.stop_trace()
            timer.uninstall()
            if self.logger is not None:
                self.logger.close()
        if spec.is_main:
            if line:
                print(f"\n{line}", flush=True)
            print_run_summary(
                self.out, job.evals, command=spec.command, checkpoint=ckpt.latest_checkpoint(self.out), **spec.summary
            )
        return self.last
