"""Over-sampling with early stop: the long tail of a synchronous rollout.

A synchronous rollout waits for its slowest sample. With ``rollout.over_sampling_batch_size`` (M)
the default rollout keeps M prompts' groups in flight in the embedded engine and stops stepping
it once ``rollout.rollout_batch_size`` (B <= M) groups are complete, every one of their ``n``
samples finished; the rest are aborted (slime's ``--over-sampling-batch-size``; Active Partial
Rollouts, APRIL). What happens to the groups left at the stop:

* with ``rollout.partial_rollout`` they are carried into the next rollout: their samples keep
  their tokens, log-probs and the policy version of every token (:class:`~.async_rollout.PartialSample`),
  the unfinished ones are continued under the new weights, and their requests are queued before
  the new prompts' (so they finish first); a carried group that was already complete is trained
  first. The trained tokens may then come from older policy versions: ``rollout/off_policy_*``
  and ``rollout/staleness_*`` measure how many and how old (:func:`off_policy_metrics`);
* without it the groups that started generating are dropped (their prompts are skipped in this
  pass over the data; ``rollout/dropped_prompts``, ``rollout/discarded_tokens``); every trained
  token then comes from the current policy.

Either way a group of which nothing was generated yet (its prompt still queued at the stop) is
handed on as it is (``rollout/requeued_prompts``), so each rollout takes M minus the groups handed
on new prompts from the data, at least B. A checkpoint saves the prompts handed on (their dataset
indices, :meth:`OverSampledRollout.state`), not their partial samples: a resumed run generates
them again from scratch, so it follows the uninterrupted run's data but not its tokens.

``over_sampling_batch_size == rollout_batch_size`` stops only when every group is complete: the
samples equal the default rollout's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ..data import Prompt
from ..records import FinishReason, GenerateRequest, Sample
from .async_rollout import PartialSample
from .generate import RolloutContext, samples_from_results

COUNTS = (
    "rollout/over_sampled_prompts",
    "rollout/aborted_samples",
    "rollout/carried_samples",
    "rollout/requeued_prompts",
    "rollout/dropped_prompts",
    "rollout/discarded_tokens",
)


@runtime_checkable
class SteppableEngine(Protocol):
    """An engine the caller steps itself (the embedded engine): queue requests, run one step, abort."""

    weight_version: int

    def add_request(self, request: GenerateRequest) -> Any:
        """Queue ``request``; returns an object whose ``results`` (one entry per sample, None until
        it finishes) fill in as :meth:`step` runs."""
        ...

    def step(self) -> None: ...

    def abort(self, *request_ids: Any) -> None:
        """End the requests' unfinished samples (``FinishReason.ABORT``, the tokens so far kept)."""
        ...

    def has_unfinished(self) -> bool: ...


@dataclass
class _Group:
    """One prompt's ``n`` samples in flight, possibly over several rollouts."""

    prompt: Prompt
    parts: list[PartialSample]

    @property
    def complete(self) -> bool:
        return all(p.result is not None for p in self.parts)

    @property
    def started(self) -> bool:
        return any(p.tokens or p.result is not None for p in self.parts)

    def requests(self) -> list[tuple[GenerateRequest, list[PartialSample]]]:
        """Engine requests for the unfinished samples: one of ``n = k`` for the ``k`` samples with
        no token yet (the prompt prefilled once), one continuation per sample with tokens."""
        fresh = [p for p in self.parts if p.result is None and not p.tokens]
        out = [(p.continuation(), [p]) for p in self.parts if p.result is None and p.tokens]
        if fresh:
            out.insert(0, (GenerateRequest(list(self.prompt.prompt_ids), fresh[0].request.params, n=len(fresh)), fresh))
        return out


class OverSampledRollout:
    """The default rollout with over-sampling and early stop (module docstring); a
    :data:`~.generate.RolloutFn` that keeps the groups handed on between calls.

    Args:
        cfg: the run's config (``rollout.rollout_batch_size``, ``over_sampling_batch_size``,
            ``n_samples_per_prompt``, ``partial_rollout``).

    Counts of the calls since the last :meth:`pop_counts` (``rollout/*``): ``over_sampled_prompts``
    (groups in flight beyond ``rollout_batch_size``), ``aborted_samples`` (samples the early stop
    cut), ``carried_samples`` (samples whose tokens go on to the next rollout),
    ``requeued_prompts`` (groups handed on with nothing generated), ``dropped_prompts`` and
    ``discarded_tokens`` (groups dropped without ``partial_rollout``, and their response tokens).
    """

    def __init__(self, cfg: Any):
        r = cfg.rollout
        self.batch_size, self.over = r.rollout_batch_size, r.over_sampling_batch_size
        self.n, self.carry = r.n_samples_per_prompt, r.partial_rollout
        self.pending: list[_Group] = []  # handed on to the next call, in order
        self.counts: dict[str, float] = {}

    def __call__(self, ctx: RolloutContext, rollout_id: int, data: Any) -> list[list[Sample]]:
        """``rollout_batch_size`` complete groups (unscored), the first to complete; the groups handed
        on from the previous call go first.

        Raises:
            TypeError: ``ctx.engine`` cannot be stepped (not the in-process embedded engine).
        """
        engine = ctx.engine
        if not isinstance(engine, SteppableEngine):
            raise TypeError(
                f"rollout.over_sampling_batch_size needs the in-process embedded engine; "
                f"{type(engine).__name__} cannot be stepped (engine.backend=embedded, cluster.mode=local)"
            )
        for key in COUNTS:
            self.counts.setdefault(key, 0.0)
        params = ctx.sampling_params()
        groups = self.pending + [
            self._new_group(p, params) for p in data.next_batch(max(self.over - len(self.pending), 0))
        ]
        self.pending = []
        done = [g for g in groups if g.complete]  # carried complete groups: trained first
        if len(done) < self.batch_size:
            done += self._run(engine, [g for g in groups if not g.complete], self.batch_size - len(done))
        trained = done[: self.batch_size]
        chosen = {id(g) for g in trained}
        self._hand_on([g for g in groups if id(g) not in chosen], len(groups))
        return samples_from_results(ctx, [(g.prompt, [p.result for p in g.parts]) for g in trained], self.n)

    def _new_group(self, prompt: Prompt, params: Any) -> _Group:
        request = GenerateRequest(list(prompt.prompt_ids), params, n=self.n)
        return _Group(prompt, [PartialSample(request) for _ in range(self.n)])

    def _run(self, engine: SteppableEngine, groups: list[_Group], want: int) -> list[_Group]:
        """Step the engine until ``want`` of ``groups`` are complete (or nothing is left to run), then
        abort the rest; returns the groups completed, in the order they completed (ties: in
        ``groups``' order)."""
        inflight = []  # (request, the engine's handle on it, the samples its results go to)
        for g in groups:
            for request, parts in g.requests():
                inflight.append((request, engine.add_request(request), parts))
        done: list[_Group] = []
        running = list(groups)

        def collect() -> None:
            nonlocal inflight, running
            left = []
            for item in inflight:
                results = item[1].results
                if any(r is None for r in results):
                    left.append(item)
                    continue
                for part, r in zip(item[2], results):
                    part.add(r, interrupted=True)  # an ABORT with budget left stays unfinished
            inflight = left
            done.extend(g for g in running if g.complete)
            running = [g for g in running if not g.complete]

        while len(done) < want and engine.has_unfinished():
            engine.step()
            collect()
        engine.abort(*(request.request_id for request, _, _ in inflight))  # one read-back for all
        self._add(
            "rollout/aborted_samples",
            sum(r.finish_reason == FinishReason.ABORT for _, handle, _ in inflight for r in handle.results),
        )
        collect()  # the aborted samples get their tokens so far
        return done

    def _hand_on(self, rest: list[_Group], submitted: int) -> None:
        """Keep the groups not trained for the next call (without ``partial_rollout`` only those
        not started) and count them."""
        self._add("rollout/over_sampled_prompts", submitted - self.batch_size)
        for g in rest:
            if self.carry or not g.started:
                self.pending.append(g)
                self._add("rollout/carried_samples", sum(bool(p.tokens) or p.result is not None for p in g.parts))
                self._add("rollout/requeued_prompts", not g.started)
            else:
                self._add("rollout/dropped_prompts", 1)
                self._add("rollout/discarded_tokens", sum(len(p.tokens) for p in g.parts))

    def _add(self, key: str, value: float) -> None:
        self.counts[key] = self.counts.get(key, 0.0) + float(value)

    def pop_counts(self) -> dict[str, float]:
        counts, self.counts = self.counts, {}
        return counts

    # ------------------------------------------------------------------ checkpoints
    def state(self) -> list[int]:
        """Dataset indices (``Prompt.index``) of the groups handed on, in order: a checkpoint keeps
        these prompts, not their partial samples."""
        return [g.prompt.index for g in self.pending]

    def load_state(self, indices: list[int], data: Any, params: Any) -> None:
        """Hand on ``indices``' prompts (of :meth:`state`) to the next call, with nothing generated.

        Raises:
            ValueError: an index that ``data`` does not hold (different data settings).
        """
        by_index = {p.index: p for p in data.prompts}
        missing = [i for i in indices if i not in by_index]
        if missing:
            raise ValueError(
                f"the checkpoint's over-sampled prompts {missing[:5]} are not in this run's data: resume "
                f"with the same data settings"
            )
        self.pending = [self._new_group(by_index[i], params) for i in indices]


def off_policy_metrics(samples: list[Sample], version: int) -> dict[str, float]:
    """How off-policy the trained samples are, against the policy ``version`` they train:
    ``rollout/off_policy_token_share`` (response tokens generated by an older version / all response
    tokens), ``rollout/off_policy_samples`` (samples with such a token), ``rollout/staleness_mean``
    and ``rollout/staleness_max`` (``version`` minus the token's version, over response tokens)."""
    ages = [[version - v for v in s.token_versions()] for s in samples]
    tokens = [a for sample in ages for a in sample]
    return {
        "rollout/off_policy_token_share": sum(a > 0 for a in tokens) / len(tokens) if tokens else 0.0,
        "rollout/off_policy_samples": float(sum(any(a > 0 for a in sample) for sample in ages)),
        "rollout/staleness_mean": sum(tokens) / len(tokens) if tokens else 0.0,
        "rollout/staleness_max": float(max(tokens)) if tokens else 0.0,
    }
