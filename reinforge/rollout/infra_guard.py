"""Infrastructure failures of a run, counted and guarded in one place (issue 57).

A sample whose environment, sandbox, MCP server or judge failed has status ``failed``: it is
infrastructure's failure, never the model's score, so it is left out of its group's statistics and
of the loss (docs/agents.md). Left alone, a run whose every sample fails that way "trains" on
nothing and exits 0. :class:`InfraGuard` watches every rollout's samples:

* it counts them by kind (``sample.metadata["infra_failure_kind"]``: ``environment``, ``sandbox``,
  ``mcp_server``, ``judge``; ``other`` when a custom rollout marks a sample failed without one):
  the metrics ``rollout/infra_failed/<kind>``;
* it logs one warning line with the reason the first time a kind occurs, and after that one line of
  counts per rollout that had failures;
* it stops the run with :class:`InfraFailing` (one line, exit status 1) after
  :attr:`InfraGuard.ALL_FAILED_LIMIT` rollouts in a row in which every sample failed, and at the end
  of a shorter run (or of ``reinforge eval``) in which every sample failed, as the reward manager
  does for a reward function that always fails.
"""

from __future__ import annotations

import logging
from collections import Counter

from ..records import Sample, Status

log = logging.getLogger(__name__)

KIND_KEY = "infra_failure_kind"  # sample.metadata: which part failed
REASON_KEY = "infra_failure"  # sample.metadata: why, in words
OTHER = "other"


class InfraFailing(RuntimeError):
    """Infrastructure failed on every sample of ``InfraGuard.ALL_FAILED_LIMIT`` consecutive rollouts,
    or on every sample of a whole run: the run stops with this one-line message (exit status 1)."""


def failure_kind(sample: Sample) -> str | None:
    """The kind of infrastructure failure of ``sample`` (``environment``, ``sandbox``, ``mcp_server``,
    ``judge``, ``teacher``, ``other``), or None when its status is not ``failed``."""
    if sample.status != Status.FAILED:
        return None
    return str(sample.metadata.get(KIND_KEY) or OTHER)


def mark_failed(sample: Sample, kind: str, reason: str) -> None:
    """Mark ``sample`` as an infrastructure failure of ``kind``: status ``failed``, no loss, the
    reason kept in ``metadata["infra_failure"]`` (its first 2000 characters). Its reward is left as it
    is: a placeholder that no statistic reads."""
    sample.status = Status.FAILED
    sample.loss_mask = [0] * sample.response_length
    sample.metadata[REASON_KEY] = reason[:2000]
    sample.metadata[KIND_KEY] = kind


def _hint(kinds: Counter[str]) -> str:
    top = kinds.most_common(1)[0][0] if kinds else OTHER
    return {
        "environment": "fix the environment (agent.environment) or raise agent.env_timeout",
        "sandbox": "check that bubblewrap runs here (docs/agents.md, the python sandbox)",
        "mcp_server": "check the MCP servers of agent.mcp_servers (their stderr is logged at DEBUG)",
        "judge": "check the judge (judge.url / judge.model, or judge.model_path)",
        "teacher": "check the distillation teacher's endpoint (distill.teacher_path / distill.teachers)",
    }.get(top, "see sample.metadata['infra_failure'] (run.dump_rollouts=true writes it)")


class InfraGuard:
    """Counts a run's infrastructure failures, warns once per kind and stops a run in which they are
    all there is (module docstring)."""

    ALL_FAILED_LIMIT = 3

    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()  # failed samples per kind over the run (rollouts)
        self.num_samples = 0  # samples of the run's rollouts
        self.num_eval_samples = 0  # samples of the run's evaluations
        self.eval_kinds: Counter[str] = Counter()  # failed samples per kind over the run's evaluations
        self._streak = 0
        self._first: dict[str, str] = {}  # kind -> the first failure's account

    @property
    def num_failed(self) -> int:
        """Failed samples over the run's rollouts."""
        return sum(self.kinds.values())

    def _note(self, samples: list[Sample], where: str) -> Counter[str]:
        """Count ``samples``' failures by kind and warn on the first of each kind (with its reason)."""
        kinds: Counter[str] = Counter()
        for s in samples:
            kind = failure_kind(s)
            if kind is None:
                continue
            kinds[kind] += 1
            if kind not in self._first:
                reason = " ".join(str(s.metadata.get(REASON_KEY, "no reason given")).split())[:500]
                self._first[kind] = f"sample {s.index}: {reason}"
                log.warning(
                    "infrastructure failure (%s) in %s, sample %d: %s. The sample is left out of training, "
                    "the reward means and the accuracies, not scored 0; further %s failures are counted "
                    "(rollout/infra_failed/%s, eval/failed_samples)",
                    kind,
                    where,
                    s.index,
                    reason,
                    kind,
                    kind,
                )
        return kinds

    def observe(self, rollout_id: int, samples: list[Sample]) -> dict[str, float]:
        """Account for one rollout's samples (every one generated): returns the metrics
        ``rollout/infra_failed/<kind>`` (failed samples of that kind; present from the kind's first
        occurrence on, 0 in rollouts without one).

        Raises:
            InfraFailing: every sample failed in ``ALL_FAILED_LIMIT`` consecutive rollouts.
        """
        kinds = self._note(samples, f"rollout {rollout_id}")
        self.kinds.update(kinds)
        self.num_samples += len(samples)
        failed = sum(kinds.values())
        if failed:
            log.warning(
                "rollout %d: %d of %d samples failed by infrastructure (%s): left out of training",
                rollout_id,
                failed,
                len(samples),
                ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())),
            )
        if samples and failed == len(samples):
            self._streak += 1
        else:
            self._streak = 0
        if self._streak >= self.ALL_FAILED_LIMIT:
            raise InfraFailing(
                f"every sample of {self._streak} consecutive rollouts failed by infrastructure (the last: "
                f"{failed} of {len(samples)}: {self._counts(kinds)}); e.g. {self._example(kinds)}. Stopping "
                f"instead of training on nothing: {_hint(kinds)}, then resume with run.recover=auto"
            )
        return {f"rollout/infra_failed/{k}": float(kinds.get(k, 0)) for k in sorted(self.kinds)}

    def observe_eval(self, label: str, samples: list[Sample]) -> int:
        """Account for one evaluation's samples (warnings only: no streak); returns how many failed."""
        kinds = self._note(samples, f"evaluation {label!r}")
        failed = sum(kinds.values())
        self.num_eval_samples += len(samples)
        self.eval_kinds.update(kinds)
        if failed:
            log.warning(
                "evaluation %r: %d of %d samples failed by infrastructure (%s): not counted as wrong answers; "
                "the accuracies are over the %d scored samples",
                label,
                failed,
                len(samples),
                self._counts(kinds),
                len(samples) - failed,
            )
        return failed

    def check_run(self) -> None:
        """At the end of a run: raise when every sample of its rollouts failed (or, for a run without
        rollouts such as ``reinforge eval``, every sample of its evaluations); otherwise log the run's
        failures in one line when there were any.

        Raises:
            InfraFailing: samples were generated and none of them was scored.
        """
        if self.num_samples:
            total, kinds, what = self.num_samples, self.kinds, "rollouts"
        else:
            total, kinds, what = self.num_eval_samples, self.eval_kinds, "evaluations"
        failed = sum(kinds.values())
        if total and failed == total:
            raise InfraFailing(
                f"every sample of this run's {what} failed by infrastructure ({failed} of {total}: "
                f"{self._counts(kinds)}); e.g. {self._example(kinds)}. Nothing was scored or trained: {_hint(kinds)}"
            )
        if self.kinds:
            log.warning(
                "this run's rollouts: %d of %d samples failed by infrastructure (%s), left out of training",
                self.num_failed,
                self.num_samples,
                self._counts(self.kinds),
            )

    @staticmethod
    def _counts(kinds: Counter[str]) -> str:
        return ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))

    def _example(self, kinds: Counter[str]) -> str:
        for k in kinds:
            if k in self._first:
                return self._first[k]
        return next(iter(self._first.values()), "no reason recorded")
