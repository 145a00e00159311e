"""A discrete-event model of the RL loop's two sides (issue 56, item 3): the engines generating rollouts and the
trainers training on them, synchronous or asynchronous with ``rollout.max_staleness`` = ``k``, driven by each step's
phase seconds (the planner's time model, :func:`.model.times`, or measured ones). Pure: no clock, no threads.

The rules are the loop's (``reinforge/loop.py``, ``reinforge/rollout/async_rollout.py``):

* rollout ``j`` may start generating once the engines hold policy version ``>= j - k`` (``k`` = 0: the synchronous
  loop, one side at a time); the trainer trains rollout ``j`` (log-probs, then the optimizer steps) once it is
  generated, producing version ``j + 1``;
* the weight sync of version ``j + 1`` follows each training and holds both sides: it waits for the engines'
  generation in flight to finish (``rollout.partial_rollout=false``: its sequences end under the weights they
  began with), or interrupts it (``partial_rollout``: the rollout resumes after the sync, ``sync`` seconds later);
* colocated (``cluster.colocate``: one set of GPUs) the phases run one after another whatever ``k``, and the GPUs
  idle only between them (never, here).

:func:`simulate` returns the time of ``n`` steps, the steady-state step (between the weight syncs of the middle
half of the steps: the first rollout cannot overlap anything, the last has nothing to overlap), each side's idle
share of the whole run (the weight sync counts as busy on both sides) and the mean staleness of the trained
rollouts. :func:`jittered` makes steps whose generation and training vary from one to the next (the long tail: a
rollout's longest response sets its generation time), which is what ``k`` > 1 absorbs; :func:`choose_staleness`
picks the smallest ``k`` within a tolerance of the best throughput. Without partial rollouts every sync waits for
the generation in flight, so the trainers idle then whatever ``k``: more staleness absorbs little.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StepPhases:
    """Seconds of one rollout step's phases, each on its own side: ``generation`` (the engines, until the rollout's
    longest response ends), ``log_probs`` and ``training`` (the trainers), ``weight_sync`` (both);
    ``generation_full``: the engines' seconds for the same tokens with every slot busy to the end (no long tail),
    what a streaming engine spends (None: ``generation``)."""

    generation: float
    log_probs: float
    training: float
    weight_sync: float
    generation_full: float | None = None

    @property
    def trainer(self) -> float:
        return self.log_probs + self.training


@dataclass(frozen=True)
class SimResult:
    """What :func:`simulate` found over ``steps`` steps.

    Attributes:
        seconds: from the first generation's start to the last weight sync's end.
        step: the steady-state seconds per step (module doc; ``seconds`` for one step).
        engine_idle, trainer_idle: each side's share of ``seconds`` doing none of its phases nor a sync (0-1).
        staleness: the mean of ``j - version`` over the rollouts ``j``, ``version`` the policy that began it.
    """

    steps: int
    seconds: float
    step: float
    engine_idle: float
    trainer_idle: float
    staleness: float


def simulate(
    phases: Sequence[StepPhases],
    max_staleness: int = 0,
    colocated: bool = False,
    partial_rollout: bool = False,
    streaming: bool = False,
) -> SimResult:
    """Run the two sides over ``phases`` (one per step) under the module's rules; ``streaming``: a rollout takes the
    engines ``generation_full``, its long tail cut or overlapped: the synchronous loop's early stop with the unfinished
    samples carried into the next rollout (``rollout.over_sampling_batch_size`` with ``rollout.partial_rollout``), or
    engines that top their slots up with the next rollout's prompts as sequences finish (AReaL's and verl's fully
    asynchronous rollouts; not reinforge's asynchronous loop, which generates a rollout at a time).

    Raises:
        ValueError: no steps, a negative phase or ``max_staleness`` < 0.
    """
    n = len(phases)
    if n == 0 or max_staleness < 0 or any(min(p.generation, p.trainer, p.weight_sync) < 0 for p in phases):
        raise ValueError("simulate needs >= 1 step of non-negative phases and max_staleness >= 0")
    k = 0 if colocated else max_staleness

    def gen(p: StepPhases) -> float:
        return p.generation_full if streaming and p.generation_full is not None else p.generation

    events: list[tuple[float, int, str, int]] = []  # (time, order, kind, step); order keeps ties first-in first-out
    order = 0

    def at(t: float, kind: str, j: int) -> None:
        nonlocal order
        heapq.heappush(events, (t, order, kind, j))
        order += 1

    version = 0  # the policy the engines hold
    next_gen = next_train = 0
    generated: set[int] = set()
    gen_end: dict[int, float] = {}  # the step in flight and when it ends (moved by an interrupting sync)
    engine_busy = trainer_busy = False
    pending_sync: int | None = None  # the version waiting to be loaded
    busy = {"engine": 0.0, "trainer": 0.0}
    started_by: dict[int, int] = {}
    sync_ends: list[float] = []
    t = 0.0

    def start(t: float) -> None:
        nonlocal engine_busy, trainer_busy, next_gen, next_train, pending_sync
        interrupt = partial_rollout and engine_busy and gen_end
        if pending_sync is not None and (not engine_busy or interrupt):
            s = phases[pending_sync - 1].weight_sync
            if interrupt:  # the rollout in flight pauses for the sync
                (j,) = gen_end
                gen_end[j] += s
                at(gen_end[j], "gen", j)
            engine_busy = trainer_busy = True
            busy["engine"] += s
            busy["trainer"] += s
            at(t + s, "sync", pending_sync)
            pending_sync = None
            return
        if not engine_busy and next_gen < n and version >= next_gen - k and (not colocated or not trainer_busy):
            j, next_gen = next_gen, next_gen + 1
            started_by[j] = version
            gen_end[j] = t + gen(phases[j])
            busy["engine"] += gen(phases[j])
            engine_busy = True
            if colocated:
                trainer_busy = True
            at(gen_end[j], "gen", j)
        if not trainer_busy and pending_sync is None and next_train in generated:
            j, next_train = next_train, next_train + 1
            busy["trainer"] += phases[j].trainer
            trainer_busy = True
            if colocated:
                engine_busy = True
            at(t + phases[j].trainer, "train", j)

    start(0.0)
    while events:
        t, _, kind, j = heapq.heappop(events)
        if kind == "gen":
            if gen_end.get(j) != t:  # superseded: an interrupting sync moved this rollout's end
                continue
            del gen_end[j]
            generated.add(j)
            engine_busy = False
            if colocated:
                trainer_busy = False
        elif kind == "train":
            pending_sync = j + 1
            if colocated:
                engine_busy = False
        else:  # a sync ended: version j is in the engines
            version = j
            sync_ends.append(t)
            trainer_busy = False
            engine_busy = bool(gen_end)  # (an interrupted rollout resumes)
        start(t)
    seconds = sync_ends[-1]
    q = (n - 1) // 4  # the steady state: the middle half of the syncs (the first step fills, the last drains)
    step = seconds if n == 1 else (sync_ends[n - 1 - q] - sync_ends[q]) / (n - 1 - 2 * q)
    if colocated:  # one set of GPUs, each phase in turn: both "sides" work whenever either does
        busy = dict.fromkeys(busy, busy["engine"] + busy["trainer"] - sum(p.weight_sync for p in phases))
    idle = {side: max(0.0, 1 - b / seconds) if seconds > 0 else 0.0 for side, b in busy.items()}
    stale = sum(j - v for j, v in started_by.items()) / n
    return SimResult(n, seconds, step, idle["engine"], idle["trainer"], stale)


def jittered(base: StepPhases, n: int, spread: float = 0.15, seed: int = 0) -> list[StepPhases]:
    """``n`` steps around ``base``: generation and training each scaled by a log-normal factor of mean 1 and
    coefficient of variation ``spread`` (seeded: the same steps every call); log-probs follow training, the sync
    stays. 0: ``n`` copies of ``base``."""
    rng = random.Random(seed)
    sigma = math.sqrt(math.log1p(spread * spread))

    def factor() -> float:
        return math.exp(rng.gauss(-sigma * sigma / 2, sigma)) if spread > 0 else 1.0

    out = []
    for _ in range(n):
        g, tr = factor(), factor()
        full = base.generation_full * g if base.generation_full is not None else None
        out.append(StepPhases(base.generation * g, base.log_probs * tr, base.training * tr, base.weight_sync, full))
    return out


def choose_staleness(
    base: StepPhases,
    steps: int = 64,
    spread: float = 0.15,
    tolerance: float = 0.02,
    most: int = 4,
    partial_rollout: bool = False,
    streaming: bool = False,
) -> tuple[int, dict[int, SimResult]]:
    """The smallest ``max_staleness`` in 1..``most`` whose steady-state step over :func:`jittered` steps is within
    ``tolerance`` of the shortest any of them reaches, with every ``k`` simulated (disaggregated): more staleness
    than that only makes the trained rollouts older."""
    phases = jittered(base, steps, spread)
    runs = {k: simulate(phases, k, partial_rollout=partial_rollout, streaming=streaming) for k in range(1, most + 1)}
    best = min(r.step for r in runs.values())
    return min(k for k, r in runs.items() if r.step <= best * (1 + tolerance)), runs


__all__ = ["SimResult", "StepPhases", "choose_staleness", "jittered", "simulate"]
