"""Predicted vs measured (issue 37 item 2): every rollout's ``plan/*`` metrics and the end-of-run line
naming the phase furthest from its hardware limit. docs/planner.md ("Predicted vs measured").

Per rollout and phase (``generation``, ``logprob`` (old + reference log-probs, and the critic's
values), ``training`` (actor, and critic when there is one), ``sync``) :meth:`PlanReport.rollout`
returns

* ``plan/<phase>_measured_s``: the loop's own timing (``time/generate``, or the producer's
  ``async/producer_generate_s`` when asynchronous; ``time/logprob``; ``time/train`` +
  ``time/train_critic``; ``time/sync``);
* ``plan/<phase>_predicted_s``: the planner's time model (:mod:`.model`) at this rollout's actual
  token counts: generation from the generated samples' response lengths, their count and their mean
  prompt length; log-probs and training from the trained samples' sequence lengths (``len(tokens)``),
  the log-prob passes that ran; weight sync from the parameter count (no length in it);
* ``plan/<phase>_ratio``: measured / predicted;
* ``plan/<phase>_limit_fraction``: the achieved share of the phase's hardware limit: the seconds the
  phase would take at 100% of it over the measured seconds. Generation: decode bytes / HBM bandwidth
  + prefill FLOPs / peak (the bound of :func:`.model.generation_seconds` at efficiency 1); log-probs and
  training: model FLOPs (2 x / 6 x active parameters per token + causal attention, recomputation not
  counted: MFU) / (peak bf16 FLOP/s x trainer GPUs); weight sync (colocated): 6 B per parameter /
  HBM bandwidth; disaggregated: none (the network's speed is not a hardware fact the planner has);
* ``plan/generation_tail_share``: the share of the rollout's decode time (bytes read, as the bandwidth
  model counts them) spent with fewer than half of the engine's slots busy, from the response lengths
  (a continuous-batching simulation over :func:`.model.engine_slots` slots, :func:`tail_share`:
  nothing measures the engine's occupancy).

Without a GPU whose speed the planner knows (a CPU run, a GPU not in :mod:`.hardware`'s table) only
``plan/<phase>_measured_s`` is logged, and the end line says why no limit is given.

:meth:`PlanReport.finish` names the phase with the most seconds above its limit over the run (the
first rollout left out when there are more: it carries start-up and compilation), its achieved share
and a suggestion from the facts at hand (:func:`suggest`); it is logged, written into the trace as an
instant event ``plan_bottleneck`` and printed by the loop above the run's summary. Every rollout's
``plan/*`` numbers go into the trace as an instant event ``plan`` inside its ``rollout_step``.
"""

from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..utils import trace
from . import model as M

if TYPE_CHECKING:
    from ..config import Config
    from ..records import Sample
    from .planner import Plan

log = logging.getLogger(__name__)

PHASES = ("generation", "logprob", "training", "sync")
WORDS = {"generation": "generation", "logprob": "log-probs", "training": "training", "sync": "weight sync"}
LIMITS = {"generation": "of the bandwidth limit", "logprob": "MFU", "training": "MFU", "sync": "of the bandwidth limit"}
TAIL_WORTH = 0.25  # a long tail at least this share of the decode steps: over-sampling is suggested
BALANCE = 1.25  # asynchronous on separate GPUs, one side this many times the other: it is named
ROOM = 1.5  # a micro-batch that could grow by this factor: a larger one is suggested


@dataclass
class Phase:
    """One phase's seconds over the rollouts counted: measured, predicted, at its hardware limit."""

    measured: float = 0.0
    predicted: float = 0.0
    limit: float = 0.0
    has_limit: bool = False

    @property
    def fraction(self) -> float | None:
        return self.limit / self.measured if self.has_limit and self.measured > 0 else None

    @property
    def lost(self) -> float:
        """Seconds above the limit (the phase's weight in choosing the bottleneck)."""
        return self.measured - self.limit if self.has_limit else 0.0


@dataclass
class Totals:
    """Sums over rollouts: each phase, the tail share x generation seconds, tokens trained per GPU."""

    rollouts: int = 0
    tail_seconds: float = 0.0
    tokens_per_gpu: float = 0.0
    phases: dict[str, Phase] = field(default_factory=lambda: {p: Phase() for p in PHASES})

    @property
    def tail(self) -> float:
        gen = self.phases["generation"].measured
        return self.tail_seconds / gen if gen > 0 else 0.0


def tail_share(
    lengths: list[int], slots: int, weight_bytes: float = 1.0, kv_bytes: float = 0.0, prompt: int = 0
) -> float:
    """Share of a rollout's decode time spent with fewer than half of ``slots`` sequences running, when
    ``lengths`` (in order) are decoded by continuous batching over ``slots`` slots (one token per
    sequence per step; a finished sequence's slot takes the next one at once). A step costs what the
    bandwidth model says it reads: ``weight_bytes`` and ``kv_bytes`` x (``prompt`` + position) for each
    running sequence (the defaults count steps)."""
    lengths = [n for n in lengths if n > 0]
    c = max(1, min(slots, len(lengths)))
    if c == 1:
        return 0.0
    ends, runs = [0] * c, []
    for n in lengths:
        start = heapq.heappop(ends)
        runs.append((start, n))
        heapq.heappush(ends, start + n)
    ends.sort()
    total, half = ends[-1], ends[c - (c + 1) // 2]  # from step ``half`` on, fewer than half of the slots are busy

    def read(after: int) -> float:  # bytes read from step ``after`` to the end
        out = weight_bytes * (total - after)
        for start, n in runs:
            a = max(0, after - start)
            if a < n:
                out += kv_bytes * (prompt * (n - a) + (a + n - 1) * (n - a) / 2)
        return out

    return read(half) / read(0)


def log_prob_passes(cfg: Config) -> int:
    """Forward passes before training as the loop runs them: old log-probs, reference, values."""
    return int(cfg.needs_old_log_probs) + int(cfg.algo.needs_reference) + int(cfg.algo.needs_critic)


def predict(
    w: M.Workload, cfg: Config, generated: list[Sample], trained: list[Sample]
) -> tuple[dict[str, float | None], dict[str, float | None], float]:
    """(predicted seconds, seconds at the hardware limit, tail share) of each phase at the rollout's
    actual token counts (module doc)."""
    lengths = [s.response_length for s in generated]
    prompt = round(sum(s.prompt_length for s in generated) / max(len(generated), 1))
    gw, per_engine = M.per_engine(M.with_(w, prompt_len=prompt, num_seqs=max(1, len(lengths))), lengths)
    gen = M.generation_seconds(gw, per_engine)
    gen_limit = M.generation_seconds(gw, per_engine, efficiency=1.0, mfu=1.0, host_step_s=0.0)
    seqs = [len(s.tokens) for s in trained]
    tw = M.with_(w, prompt_len=0, logprob_passes=log_prob_passes(cfg))  # ``seqs`` are whole sequences
    peak = (w.gpu.bf16_flops or 0.0) * w.shards
    f = M.forward_flops(tw, seqs) if seqs and peak else 0.0
    predicted = {
        "generation": gen,
        "logprob": M.logprob_seconds(tw, seqs) if seqs else 0.0,
        "training": M.train_seconds(tw, seqs) if seqs else 0.0,
        "sync": M.sync_seconds(w),
    }
    limit = {
        "generation": gen_limit,
        "logprob": tw.logprob_passes * f / peak if peak else None,
        "training": 3 * f * (2 if w.critic else 1) / peak if peak else None,  # model FLOPs: MFU
        "sync": M.sync_seconds(w, bound=True),
    }
    slots, kv = M.engine_slots(gw, per_engine), w.arch.kv_bytes_per_token(w.kv_elem_bytes) / w.engine_tp
    return predicted, limit, tail_share(per_engine, slots, M.decode_weight_bytes(gw, slots), kv, prompt)


def measured(metrics: dict[str, float]) -> dict[str, float]:
    """Each phase's measured seconds from the loop's ``time/*`` metrics (module doc)."""
    gen = metrics.get("async/producer_generate_s", metrics.get("time/generate"))
    out = {
        "generation": gen,
        "logprob": metrics.get("time/logprob"),
        "training": metrics.get("time/train", 0.0) + metrics.get("time/train_critic", 0.0)
        if "time/train" in metrics
        else None,
        "sync": metrics.get("time/sync"),
    }
    return {k: float(v) for k, v in out.items() if v is not None}


def no_limit_reason(plan: Plan) -> str | None:
    """Why no phase gets a predicted time or a limit (None: they do)."""
    if plan.gpu is None:
        return "no GPU (a CPU run): the planner predicts no time and knows no hardware limit"
    if plan.workload is None:
        return "the model's size is unknown to the planner (its config.json's keys): no time is predicted"
    if not plan.gpu.knows_speed:
        return (
            f"{plan.gpu.name} is not in the planner's table (reinforge/plan/hardware.py): its bandwidth and "
            f"FLOP/s are unknown"
        )
    return None


def suggest(phase: str, fraction: float, w: M.Workload, cfg: Config, tail: float, tokens_per_gpu: float) -> str:
    """A concrete change for ``phase`` at ``fraction`` of its limit, from the facts at hand:
    the long tail's share of generation, the engine's slots, the KV cache dtype; the recomputed
    layers and the micro-batch against what fits; the tokens one GPU trains per rollout."""
    from .planner import AUTO_HEADROOM

    r, L = cfg.rollout, w.arch.num_layers
    limit = w.usable * AUTO_HEADROOM  # the margin the planner's own `auto` choices keep
    if phase == "generation":
        if tail >= TAIL_WORTH:
            head = f"the long tail is {tail:.0%} of it: "
            if r.max_staleness > 0:
                return head + "consider rollout.partial_rollout=true"
            if r.over_sampling_batch_size is None:
                return head + (
                    f"consider over-sampling (rollout.over_sampling_batch_size > rollout.rollout_batch_size="
                    f"{r.rollout_batch_size})"
                )
            return head + f"raise rollout.over_sampling_batch_size (now {r.over_sampling_batch_size})"
        share = M.per_engine(w)[0]  # each engine decodes its share of the rollout
        slots = M.engine_slots(share)
        if slots < share.num_seqs:
            return (
                f"only {slots} of {M.share_text(w)} decode at once: raise engine.max_num_seqs or "
                f"engine.kv_cache_memory_fraction"
                + (" or set engine.kv_cache_dtype=fp8" if w.kv_elem_bytes > 1 else "")
            )
        if w.kv_elem_bytes > 1:
            return "engine.kv_cache_dtype=fp8 halves the KV cache each decode step reads"
        return f"all {w.num_seqs} sequences decode at once from an fp8 cache: the decode kernels are the limit"
    if phase in ("training", "logprob"):
        if phase == "training":
            k = M.min_recompute_that_fits(w, w.micro_tokens, limit)
            if k is not None and k < w.recompute:
                return f"recompute {k} of {L} layers (model.recompute_num_layers={k}; now {w.recompute})"
        if tokens_per_gpu < w.micro_tokens / ROOM:
            return (
                f"a rollout gives each GPU {tokens_per_gpu:.0f} tokens, less than one micro-batch "
                f"(train.max_tokens_per_gpu={w.micro_tokens}): more samples per rollout fill it"
            )
        fit = M.max_tokens_that_fit(w, limit=limit)
        if fit >= ROOM * w.micro_tokens:
            return f"raise train.max_tokens_per_gpu to {fit} (now {w.micro_tokens}; `reinforge plan` shows the memory)"
        return f"the micro-batches are as large as memory allows: the {WORDS[phase]} kernels are the limit"
    if not w.colocated:
        return "raise cluster.weight_sync_bucket_mb"
    return "the weight copy is the limit (a small share of the step)"


def percent(x: float) -> str:
    """``41%``; below 1% two significant digits (``0.034%``: a CPU run planned as a GPU)."""
    return f"{x:.0%}" if x >= 0.01 or x == 0 else f"{x * 100:.2g}%"


class PlanReport:
    """Collects one run's predicted and measured phase times (module doc)."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.reason = no_limit_reason(plan)
        self.first, self.rest = Totals(), Totals()  # the first rollout; the others
        if self.reason:
            log.info("plan/* metrics: measured times only (%s)", self.reason)

    @property
    def rollouts(self) -> int:
        return self.first.rollouts + self.rest.rollouts

    @property
    def counted(self) -> Totals:
        """The rollouts the end line reads: all but the first, or the first when it is the only one."""
        return self.rest if self.rest.rollouts else self.first

    def rollout(
        self, metrics: dict[str, float], generated: list[list[Sample]], trained: list[Sample]
    ) -> dict[str, float]:
        """The ``plan/*`` metrics of one rollout (module doc); also written into the trace."""
        got = measured(metrics)
        out = {f"plan/{p}_measured_s": s for p, s in got.items()}
        predicted: dict[str, float | None] = {}
        limit: dict[str, float | None] = {}
        tail = 0.0
        w = self.plan.workload
        if self.reason is None and w is not None:
            predicted, limit, tail = predict(w, self.plan.cfg, [s for g in generated for s in g], trained)
            out["plan/generation_tail_share"] = tail
        into = self.rest if self.first.rollouts else self.first
        for p, s in got.items():
            pred, lim = predicted.get(p), limit.get(p)
            if lim is not None and s < lim:
                # faster than the hardware allows: the phase did less than the plan counts (a training
                # step whose samples all had zero advantage skips its passes); no prediction this rollout
                pred = lim = None
            if pred is not None and pred > 0:  # 0: nothing ran to predict (no log-prob pass)
                out[f"plan/{p}_predicted_s"] = pred
                out[f"plan/{p}_ratio"] = s / pred
            if lim is not None and lim > 0 and s > 0:
                out[f"plan/{p}_limit_fraction"] = lim / s
            t = into.phases[p]
            t.measured += s
            t.predicted += pred or 0.0
            if lim is not None and lim > 0:
                t.limit += lim
                t.has_limit = True
        into.rollouts += 1
        into.tail_seconds += tail * got.get("generation", 0.0)
        into.tokens_per_gpu += sum(len(s.tokens) for s in trained) / (w.shards if w is not None else 1)
        trace.instant("plan", "plan", **{k.removeprefix("plan/"): round(v, 6) for k, v in out.items()})
        return out

    def bottleneck(self) -> tuple[str, Phase] | None:
        """The phase with the most seconds above its limit and its totals; None when no phase has a limit."""
        phases = self.counted.phases
        with_limit = [p for p in PHASES if phases[p].has_limit and phases[p].measured > 0]
        if not with_limit:
            return None
        phase = max(with_limit, key=lambda p: phases[p].lost)
        return phase, phases[phase]

    def end_line(self) -> str | None:
        """The line naming the bottleneck (module doc); None before any rollout."""
        c = self.counted
        if c.rollouts == 0:
            return None
        n = c.rollouts
        if self.reason is not None:
            times = ", ".join(f"{WORDS[p]} {c.phases[p].measured / n:.2f} s" for p in PHASES)
            return f"plan: no hardware limit given ({self.reason}); measured per rollout: {times}"
        found = self.bottleneck()
        if found is None or self.plan.workload is None:
            return "plan: no phase has a hardware limit to compare with"
        phase, t = found
        tip = suggest(phase, t.fraction or 0.0, self.plan.workload, self.plan.cfg, c.tail, c.tokens_per_gpu / n)
        return (
            f"plan: {WORDS[phase]} at {percent(t.fraction or 0.0)} {LIMITS[phase]} ({t.measured / n:.2f} s per "
            f"rollout, {t.lost / n:.2f} s above the limit, predicted {t.predicted / n:.2f} s)"
            f"{',' if tip.startswith('the long tail') else ':'} {tip}"
        )

    def balance_line(self) -> str | None:
        """Engines and trainers on separate GPUs (Ray, not colocated): how generation and the trainer's
        work (log-probs + training) share the step, from the measured seconds per rollout. Synchronous:
        the step is their sum, ``rollout.max_staleness`` >= 1 makes it about their max; asynchronous:
        the step is at least the longer side, so the GPUs of that side are the lever (run 1a of
        docs/multi_gpu.md: 30 s against 15 s, 1.38x where 1.52x bounds it). None when colocated,
        before any rollout, or when asynchronous and within :data:`BALANCE`."""
        w, c = self.plan.workload, self.counted
        if w is None or w.colocated or c.rollouts == 0:
            return None
        n = c.rollouts
        g = c.phases["generation"].measured / n
        t = (c.phases["logprob"].measured + c.phases["training"].measured) / n
        if min(g, t) <= 0:
            return None
        if self.plan.cfg.rollout.max_staleness == 0:
            return (
                f"plan: generation ({g:.2f} s per rollout) and the trainer ({t:.2f} s) take turns on separate GPUs: "
                f"rollout.max_staleness=1 overlaps them (a step of the longer instead of the sum: up to "
                f"{(g + t) / max(g, t):.2f}x)"
            )
        if max(g, t) < BALANCE * min(g, t):
            return None
        side, other, key = (
            ("generation", "the trainer", "cluster.rollout_num_gpus")
            if g > t
            else ("the trainer", "generation", "cluster.actor_num_gpus_per_node")
        )
        return (
            f"plan: asynchronous on separate GPUs, a step is at least its longer side: {side} "
            f"({max(g, t):.2f} s per rollout) is {max(g, t) / min(g, t):.1f}x {other} ({min(g, t):.2f} s); "
            f"more GPUs for it ({key}) would shorten the step"
        )

    def finish(self, log_line: bool = True) -> str | None:
        """The end line and the balance line (:meth:`balance_line`), written into the trace
        (``plan_bottleneck``) and, with ``log_line``, logged (the training loop prints it instead, once,
        above the run's summary); None before any rollout."""
        line = self.end_line()
        if line is None:
            return None
        balance = self.balance_line()
        if balance is not None:
            line = f"{line}\n{balance}"
        if log_line:
            log.info("%s", line)
        args: dict[str, Any] = {"message": line}
        found = self.bottleneck() if self.reason is None else None
        if found is not None:
            args.update(
                phase=found[0], fraction=round(found[1].fraction or 0.0, 4), tail_share=round(self.counted.tail, 4)
            )
        trace.instant("plan_bottleneck", "plan", **args)
        return line
