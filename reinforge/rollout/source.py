"""Where the loop's rollouts come from: generated now (synchronous) or ahead by a producer thread
(asynchronous RL). Both sources have one interface, so the loop reads the same in both modes
(slime keeps ``train.py`` and ``train_async.py`` each one screen long):

* :meth:`RolloutSource.take` ``(rollout_id) -> Rollout``: the groups to train on, every group
  generated, and the rollout's metrics;
* :meth:`RolloutSource.sync_weights` ``(update, version)``: run the weight update (asynchronous:
  through the :class:`~.async_rollout.WeightGate`, which lets the generation in flight finish or
  interrupts it);
* :meth:`RolloutSource.exclusive`: a context in which the loop may use the engine itself
  (evaluation);
* :meth:`RolloutSource.data_state` ``(rollout_id)``: the data position a checkpoint after that
  rollout saves (asynchronous: the one before rollout ``rollout_id + 1`` started, so the rollouts in
  flight are regenerated on resume; over-sampling: with the prompts handed on to the next rollout),
  and :meth:`RolloutSource.load_data_state` to resume from it;
* :meth:`RolloutSource.close` (stop producing) and :meth:`RolloutSource.shutdown`.

Generation itself (:func:`generate_groups`) is shared: the rollout function, scoring, and DAPO's
dynamic sampling. The synchronous source's rollout function is :class:`~.over_sampling.OverSampledRollout`
when ``rollout.over_sampling_batch_size`` is set (early stop; ``rollout/off_policy_*`` metrics).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..records import Sample, Status
from ..utils import faults, seeds, trace
from .async_rollout import AsyncRolloutProducer, WeightGate, drop_stale_groups, staleness_metrics
from .generate import RolloutContext, RolloutFn
from .over_sampling import OverSampledRollout, off_policy_metrics


@dataclass
class Rollout:
    """One rollout as the loop receives it.

    Attributes:
        groups: the groups to train on (after dynamic sampling).
        generated: every group generated (dynamic sampling's dropped ones too).
        metrics: counts and timings (``time/generate``, ``time/reward``; ``async/*`` when asynchronous).
        generate_s: seconds the engine spent generating it (for tokens/s).
    """

    groups: list[list[Sample]]
    generated: list[list[Sample]]
    metrics: dict[str, float] = field(default_factory=dict)
    generate_s: float = 0.0


class RolloutSource(Protocol):
    def start(self, first: int, last: int) -> None: ...

    def take(self, rollout_id: int) -> Rollout: ...

    def sync_weights(self, update: Callable[[], dict[str, float]], version: int) -> dict[str, float]: ...

    def exclusive(self) -> contextlib.AbstractContextManager: ...

    def data_state(self, rollout_id: int) -> dict: ...

    def load_data_state(self, state: dict) -> None:
        """Resume at ``state`` (of :meth:`data_state`, read from a checkpoint)."""

    def close(self) -> None:
        """Stop producing (idempotent; the loop may still evaluate with the engine)."""

    def shutdown(self) -> None:
        """:meth:`close`, and release what the source holds."""


def generate_groups(
    rollout_fn: RolloutFn, ctx: RolloutContext, rollout_id: int, data: Any, reward: Any, algo: Any, want: int
) -> tuple[list[list[Sample]], list[list[Sample]], dict[str, float]]:
    """Groups to train on, all groups generated, and counts (``time/reward`` included).

    With ``algo.dynamic_sampling`` groups whose rewards are all equal are dropped and further prompts
    are sampled until ``want`` (``rollout_batch_size``) groups are kept or ``dynamic_sampling_max_rounds``
    rounds ran (DAPO, Yu et al. 2025); the rollout then trains on the groups it kept (all of the last
    round if none was kept).
    """
    kept: list[list[Sample]] = []
    generated: list[list[Sample]] = []
    counts: dict[str, float] = {}
    rounds = 0
    while True:
        with trace.span("generate", "rollout", rollout_id=rollout_id, round=rounds):
            groups = rollout_fn(ctx, rollout_id, data)
        faults.hit("rollout")  # fault injection (tests): no-op unless REINFORGE_FAULT arms it
        unscored = [s for g in groups for s in g if s.reward is None]
        with trace.span("reward", "rollout", rollout_id=rollout_id, samples=len(unscored)) as span:
            for k, v in (reward.score(unscored) if unscored else {}).items():
                counts[k] = counts.get(k, 0.0) + v
        counts["time/reward"] = counts.get("time/reward", 0.0) + span.seconds
        generated += groups
        rounds += 1
        if not algo.dynamic_sampling:
            return groups, generated, counts
        kept += [g for g in groups if len({s.reward for s in g if s.status != Status.FAILED}) > 1]
        if len(kept) >= want or rounds >= algo.dynamic_sampling_max_rounds:
            break
    counts["rollout/dynamic_sampling_rounds"] = float(rounds)
    counts["rollout/kept_groups"] = float(min(len(kept), want))
    return (kept[:want] or groups), generated, counts


class _Generator:
    """What both sources share: the rollout function, its context, the data and the reward."""

    def __init__(self, cfg: Any, rollout_fn: RolloutFn, ctx: RolloutContext, data: Any, reward: Any):
        self.cfg, self.rollout_fn, self.ctx, self.data, self.reward = cfg, rollout_fn, ctx, data, reward

    def seed(self, engine: Any, rollout_id: int) -> None:
        engine.reseed(seeds.derive(self.cfg.rollout.seed, seeds.ENGINE_ROLLOUT, rollout_id))

    def generate(self, rollout_id: int) -> tuple[list[list[Sample]], list[list[Sample]], dict[str, float]]:
        return generate_groups(
            self.rollout_fn,
            self.ctx,
            rollout_id,
            self.data,
            self.reward,
            self.cfg.algo,
            self.cfg.rollout.rollout_batch_size,
        )


class SyncRollouts(_Generator):
    """Each rollout generated when the loop asks for it, with the current weights; with
    ``rollout.over_sampling_batch_size`` by :class:`~.over_sampling.OverSampledRollout` (which replaces
    ``rollout_fn``, the default rollout: the config refuses custom ones with it)."""

    def __init__(self, cfg: Any, rollout_fn: RolloutFn, ctx: RolloutContext, data: Any, reward: Any):
        self.over_sampling = OverSampledRollout(cfg) if cfg.rollout.over_sampling_batch_size is not None else None
        super().__init__(cfg, self.over_sampling or rollout_fn, ctx, data, reward)

    def start(self, first: int, last: int) -> None:
        pass

    def take(self, rollout_id: int) -> Rollout:
        with trace.span("rollout", "rollout", rollout_id=rollout_id) as span:
            self.seed(self.ctx.engine, rollout_id)
            groups, generated, counts = self.generate(rollout_id)
        counts["time/generate"] = span.seconds - counts["time/reward"]
        if self.over_sampling is not None:
            counts.update(self.over_sampling.pop_counts())
            counts.update(off_policy_metrics([s for g in groups for s in g], self.ctx.engine.weight_version))
        return Rollout(groups, generated, counts, counts["time/generate"])

    def sync_weights(self, update: Callable[[], dict[str, float]], version: int) -> dict[str, float]:
        return update()

    def exclusive(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def data_state(self, rollout_id: int) -> dict:
        """The data position; with over-sampling also ``pending_prompts``, the dataset indices of the
        prompts handed on to the next rollout (generated again from scratch on resume)."""
        state = self.data.state_dict()
        if self.over_sampling is not None:
            state["pending_prompts"] = self.over_sampling.state()
        return state

    def load_data_state(self, state: dict) -> None:
        """Raises: ValueError: the checkpoint's data differ from this run's (the message says so)."""
        self.data.load_state_dict(state)
        if self.over_sampling is not None:
            self.over_sampling.load_state(state.get("pending_prompts", []), self.data, self.ctx.sampling_params())

    def close(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


class AsyncRollouts(_Generator):
    """Rollouts generated ahead by a producer thread through a :class:`WeightGate`, at most
    ``rollout.max_staleness`` policy versions behind the trainer (AReaL; docs/design.md#asynchronous-rl).

    Args:
        engine: the rollout engine the gate wraps.
        ctx_for: builds the producer's rollout context around the gate.
    """

    def __init__(
        self,
        cfg: Any,
        rollout_fn: RolloutFn,
        ctx_for: Callable[[Any], RolloutContext],
        data: Any,
        reward: Any,
        engine: Any,
    ):
        self.gate = WeightGate(engine, cfg.rollout.partial_rollout)
        super().__init__(cfg, rollout_fn, ctx_for(self.gate), data, reward)
        self.producer: AsyncRolloutProducer | None = None
        self._t_prev = 0.0

    def start(self, first: int, last: int) -> None:
        if first >= last:
            return
        self.producer = AsyncRolloutProducer(
            self._produce, self.gate, first, last, self.cfg.rollout.max_staleness, snapshot=self.data.state_dict
        )
        self._t_prev = time.perf_counter()
        self.producer.start()

    def _produce(self, rollout_id: int):
        """Rollout ``rollout_id`` in the producer thread: seeded as the synchronous one."""
        with trace.span("rollout", "rollout", rollout_id=rollout_id, version=self.gate.version):
            self.seed(self.gate, rollout_id)
            return self.generate(rollout_id)

    def take(self, rollout_id: int) -> Rollout:
        """The producer's rollout ``rollout_id``, its groups checked against the staleness bound."""
        assert self.producer is not None, "start() first"
        k, version = self.cfg.rollout.max_staleness, self.gate.version
        with trace.span("wait_rollout", "rollout", rollout_id=rollout_id) as span:
            got = self.producer.take(rollout_id)
        groups, generated, counts = got.value
        counts = dict(counts)
        counts["async/producer_reward_s"] = counts.pop("time/reward")
        groups, dropped = drop_stale_groups(groups, version, k)
        if not groups:
            raise RuntimeError(
                f"rollout {rollout_id}: every group has tokens older than policy version "
                f"{version} - rollout.max_staleness={k}"
            )
        counts["async/dropped_stale_groups"] = float(dropped)
        counts.update(staleness_metrics([s for g in groups for s in g], version, k))
        counts["async/trainer_wait_s"] = got.trainer_wait_s
        counts["async/engine_idle_s"] = got.engine_idle_s
        counts["async/producer_generate_s"] = got.generate_s
        counts["time/generate"] = span.seconds  # the trainer's wait for the rollout
        now = time.perf_counter()
        counts["async/samples_per_s"] = sum(len(g) for g in groups) / max(now - self._t_prev, 1e-9)
        self._t_prev = now
        return Rollout(groups, generated, counts, got.generate_s)

    def sync_weights(self, update: Callable[[], dict[str, float]], version: int) -> dict[str, float]:
        out, waited = self.gate.run_update(update, version)
        out["async/weight_update_wait_s"] = waited
        return out

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """The producer's generation pauses (finishes or is interrupted) meanwhile."""
        if self.producer is None:
            yield
            return
        with self.gate.exclusive():
            yield

    def data_state(self, rollout_id: int) -> dict:
        if self.producer is None:
            return self.data.state_dict()
        return self.producer.snapshot_before(rollout_id + 1, self.data.state_dict)

    def load_data_state(self, state: dict) -> None:
        self.data.load_state_dict(state)

    def close(self) -> None:
        """End the producer thread (interrupting its generation) and the producer's context; idempotent."""
        producer, self.producer = self.producer, None
        if producer is not None:
            producer.close()

    def shutdown(self) -> None:
        self.close()
        self.ctx.close()
