"""The embedded engine's front door: requests in, results out; ``step()`` = schedule -> run -> postprocess.

Design (docs/design.md#the-embedded-engine; numbers in docs/benchmarks.md):

* **Scheduler** (:mod:`.scheduler`, host only): the waiting queue, slots, KV blocks; admission,
  block grants and the choice of the sequence to preempt.
* **Runner** (:mod:`.runner`, device): the KV cache and per-slot buffers, prefill, decode steps
  (CUDA graphs), read-backs.
* **Postprocess** (here): finished sequences become results; stop strings are checked on the host.

A sequence owns a slot from admission to finish; its keys and values live in blocks of a shared
pool (:mod:`.kv_cache`), so memory follows the tokens held. Each ``step()`` admits waiting
requests (one batched prefill), gives every running sequence the blocks of its next
``sync_interval`` tokens (preempting the newest when the pool runs dry: recompute preemption),
launches ``sync_interval`` decode steps and reads back which sequences finished.

**Overlap scheduling** (GPU, ``engine.overlap_schedule``): the read-back (:class:`~.runner.Snapshot`)
is copied to pinned memory behind the decode steps, and ``step()`` processes the *previous* run's
read-back after launching the next run, so the host's Python hides behind GPU work. What keeps it
exact: the scheduler's upper bound of each length (a sequence that must have hit its budget is not
decoded again); a sequence that stopped early idles one more run; a read-back entry counts only
while its slot holds the same admission; finished outputs are read on a side stream; preemption
and abort first drain (:meth:`EmbeddedEngine._drain`).

The model is :class:`reinforge.models.transformer.CausalLM`, the trainer's code, in its inference
variant: log-probs agree with the trainer's up to floating-point reassociation (fp32: < 1e-5).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from ..config.engine import EngineConfig
from ..config.fields import unplanned
from ..models.loading import copy_weights_, free_weight_storage, restore_weight_storage
from ..models.transformer import CausalLM, Variant
from ..records import FinishReason, GenerateRequest, GenerateResult
from ..utils import faults, stall, trace
from ..weights.verify import ArrivalSums
from .attention import bucket
from .fp8 import quantize_model
from .kv_cache import plan_kv_layout
from .linear_state import linear_layers, state_bytes_per_slot
from .runner import LENGTH, MAX_STOP_IDS, STOP, ModelRunner, Snapshot
from .scheduler import Group, Pending, Scheduler

log = logging.getLogger(__name__)


class EmbeddedEngine:
    """Continuous-batching generation with :class:`CausalLM`; implements ``RolloutEngine`` and
    ``InterruptibleEngine`` (:mod:`reinforge.records`).

    Args:
        model: the engine's own copy of the policy, already in the inference dtype and on the
            target device (weight sync copies into it in place). The engine switches it to its
            inference variant (``CausalLM.set_variant``: fused kernels where Triton runs, residual
            adds inside the norms, q/k/v and gate/up as one matmul each), so do not share this
            object with a trainer.
        config: the ``engine`` config section (slots, KV cache, prefill budget, scheduling, graphs).
        max_model_len: the longest prompt + response a slot holds, in tokens.
        seed: seed of the sampling streams (:meth:`reseed` restarts them).
        tokenizer: needed only for requests with stop strings.
        record_routes: record the experts behind every generated token of a mixture-of-experts
            model (``GenerateResult.routed_experts``; rollout routing replay). Off: nothing is recorded.
        discard_weights: what ``sleep(offload_weights=True)`` does with the weights. True (a policy
            engine, whose next weight sync rewrites every parameter): free their memory, no copy kept
            (vLLM's sleep level 2); generating before a sync has refilled them all raises. False (a
            frozen model, e.g. the embedded judge): move them to host memory and back.

    Raises:
        TypeError: ``model`` is not a reinforge ``CausalLM``.
        ValueError: ``record_routes`` for a dense model; ``engine.kv_cache_dtype`` unusable here
            (:func:`.kv_cache.kv_cache_dtype`); ``engine.quantization`` unusable here (:func:`.fp8.quantize_model`).
        MemoryError, ValueError: the KV cache cannot hold one sequence (:func:`.kv_cache.plan_kv_layout`).
    """

    def __init__(
        self,
        model: CausalLM,
        config: EngineConfig | None = None,
        *,
        max_model_len: int = 1024,
        seed: int = 0,
        tokenizer: Any = None,
        record_routes: bool = False,
        discard_weights: bool = False,
    ):
        if not isinstance(model, CausalLM):
            raise TypeError("EmbeddedEngine needs a reinforge CausalLM; use HFEngine for other models")
        self.model = model.eval().requires_grad_(False)
        self.kernels = self.model.set_variant(Variant.for_inference()).fused_kernels
        self.config = unplanned(config or EngineConfig())  # `auto` keys no planner resolved: their unplanned values
        # engine.quantization=fp8: the linear layers' weights in fp8 from here on, synced weights too
        # (before the KV cache is sized: the bf16 weights' memory is free then)
        self.fp8 = quantize_model(self.model, self.config.quantization)
        self._arrivals = ArrivalSums(self.weight_dtype)
        self.max_model_len = max_model_len
        self.tokenizer = tokenizer
        self.weight_version = 0
        self.runner = ModelRunner(
            self.model,
            self.kernels,
            max_model_len,
            self.config.cuda_graph,
            seed,
            record_routes=record_routes,
            kv_cache_dtype=self.config.kv_cache_dtype,
        )
        self.device = self.runner.device
        # launch the next decode steps before reading back the last ones (no gain without an
        # asynchronous device; tests turn it on on a CPU to exercise the same bookkeeping)
        self._overlap = self.runner.on_cuda and self.config.overlap_schedule
        self._request_ids = itertools.count()
        self._interrupted = False
        # called after each step of generate() with the completions finished so far (evaluation's progress bar)
        self.on_step: Callable[[int], None] | None = None
        self._offloaded_from: torch.device | None = None
        self.discard_weights = discard_weights and self.fp8 is None  # (fp8 layers: moved to host instead)
        self._freed: list | None = None  # the weights' storages a discarding sleep freed
        self._to_refill: set[str] = set()  # parameters no weight sync has written since
        self.scheduler: Scheduler | None = None
        self._pending: Snapshot | None = None  # read-back of the last decode steps, not processed yet
        self._heartbeat = stall.Heartbeat("engine", "engine")  # sequences in flight, the last token's time
        self._allocate()

    def _allocate(self) -> None:
        state = state_bytes_per_slot(linear_layers(self.model), self.runner.dtype)
        layout = plan_kv_layout(
            self.model.args, self.runner.kv_dtype, self.device, self.config, self.max_model_len, self.kernels, state
        )
        self.runner.allocate(layout)
        self.scheduler = Scheduler(layout, self.config.max_prefill_tokens, self.config.sync_interval)
        self._pending = None

    @property
    def num_slots(self) -> int:
        return self.scheduler.layout.num_slots

    @property
    def num_preemptions(self) -> int:
        return self.scheduler.num_preemptions

    # ------------------------------------------------------------------ public API
    def generate(self, requests: list[GenerateRequest]) -> list[list[GenerateResult]]:
        """Results in request order. After :meth:`interrupt` it returns at the next step boundary:
        unfinished samples end with ``FinishReason.ABORT`` and keep the tokens generated so far.
        :attr:`on_step`, when set, gets the number of completions finished after each step."""
        groups = [self.add_request(r) for r in requests]
        while self.has_unfinished():
            if self._interrupted:
                self.abort(*(g.request.request_id for g in groups))
                break
            self.step()
            if self.on_step is not None:
                self.on_step(sum(r is not None for g in groups for r in g.results))
        return [g.results for g in groups]  # type: ignore[misc]

    def interrupt(self) -> None:
        """Make a running (or the next) :meth:`generate` return at its next step boundary, until
        :meth:`resume`. Thread-safe: it only sets a flag (asynchronous RL's partial rollouts)."""
        self._interrupted = True

    def resume(self) -> None:
        """Undo :meth:`interrupt`."""
        self._interrupted = False

    @property
    def interrupted(self) -> bool:
        return self._interrupted

    def add_request(self, request: GenerateRequest) -> Group:
        """Queue a request; its results fill in as ``step()`` runs.

        Raises:
            RuntimeError: the engine is asleep.
            ValueError: empty prompt, prompt + max_new_tokens exceeds ``max_model_len``, n exceeds
                the slots, more than 8 stop token ids, or stop strings without a tokenizer.
        """
        if self.scheduler is None:
            raise RuntimeError("the engine is asleep: call wake_up() first")
        if self._to_refill:
            raise RuntimeError(
                f"the engine's weights were freed by sleep(offload_weights=True) and {len(self._to_refill)} "
                f"parameters (e.g. {min(self._to_refill)}) have not been written by update_weights since"
            )
        p = request.params
        if not request.prompt_ids:
            raise ValueError("empty prompt")
        if len(request.prompt_ids) + p.max_new_tokens > self.max_model_len:
            raise ValueError(
                f"prompt of {len(request.prompt_ids)} tokens + max_new_tokens={p.max_new_tokens} exceeds the "
                f"engine's max_model_len={self.max_model_len}"
            )
        if request.n > self.num_slots:
            raise ValueError(f"n={request.n} exceeds the engine's {self.num_slots} slots")
        if len(p.stop_token_ids) > MAX_STOP_IDS:
            raise ValueError(f"at most {MAX_STOP_IDS} stop token ids, got {len(p.stop_token_ids)}")
        if p.stop and self.tokenizer is None:
            raise ValueError("stop strings need the engine to be built with a tokenizer")
        if request.request_id is None:
            request.request_id = next(self._request_ids)
        group = Group(request)
        self.scheduler.waiting.append(Pending(group, list(range(request.n)), list(request.prompt_ids)))
        return group

    def abort(self, *request_ids: Any) -> None:
        """Stop queued or running requests; their unfinished samples end with ``FinishReason.ABORT``
        and keep the tokens generated so far. Several requests are aborted with one read-back of the
        running sequences (the interrupt of :meth:`generate`, over-sampling's early stop)."""
        ids, sched = set(request_ids), self.scheduler
        for pend in list(sched.waiting):
            if pend.group.request.request_id in ids:
                sched.waiting.remove(pend)
                for j in pend.samples:
                    pend.group.results[j] = GenerateResult(
                        list(pend.carried_ids),
                        list(pend.carried_logprobs),
                        FinishReason.ABORT,
                        self.weight_version,
                        routed_experts=self._carried_routes(pend),
                    )
        if sched.request_slots(ids):
            self._drain()  # samples that finished meanwhile end normally
            slots = sched.request_slots(ids)
            if slots:
                self._process(self._snapshot(slots), abort=True)
        if not sched.has_unfinished():
            self._heartbeat.idle()

    def has_unfinished(self) -> bool:
        return self.scheduler is not None and self.scheduler.has_unfinished()

    def reseed(self, seed: int) -> None:
        """Restart the sampling random stream (the loop reseeds per rollout: resumable runs)."""
        self.runner.reseed(seed)

    def step(self) -> None:
        """Schedule -> run -> postprocess: admit waiting requests, give the running sequences the KV
        blocks of the next ``sync_interval`` tokens (preempting if the pool runs dry), launch the
        decode steps, and collect the finished sequences: those of this run, or with overlap
        scheduling those of the previous run (read back while this one decodes)."""
        self._admit()
        sched, steps = self.scheduler, self.config.sync_interval
        running = sched.live()
        if sched.short_of_blocks(running, steps):
            # preemption reads a running sequence's state: finish what has finished first (frees blocks)
            self._drain()
            running = [s for s in running if sched.owner[s] is not None]
        running, changed = sched.grow(running, steps, self._preempt)
        waiting = sum(len(p.samples) for p in sched.waiting)
        self._heartbeat.busy(sequences=len(running) + waiting, running=len(running), waiting=waiting)
        if changed:
            self.runner.set_table_rows(changed, sched.table_rows(changed))
        if running:
            faults.hit("engine_step")  # fault injection (tests): no-op unless REINFORGE_FAULT arms it
            layout = sched.layout
            B = bucket(max(running) + 1, layout.num_slots)
            Lk = self.runner.Decode.key_range(max(sched.len_bound[s] for s in running) + steps, layout)
            filters = any(sched.filters[s] for s in running)
            for _ in range(steps):
                self.runner.decode(B, Lk, filters)
                self._heartbeat.beat()
            sched.advance(running, steps)
        owned = sched.occupied()
        previous, self._pending = self._pending, self._snapshot(owned) if owned else None
        if previous is not None:
            self._process(previous)
        if self._pending is not None and not (running and self._overlap):
            snap, self._pending = self._pending, None
            self._process(snap)
        if not sched.has_unfinished():
            self._heartbeat.idle()

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Copy new weights (Hugging Face names) into the engine's model in place; with
        ``engine.quantization: fp8`` those of the fp8 layers are quantized in place (:mod:`.fp8`).

        Raises:
            KeyError: a name that the model does not have.
            ValueError: a tensor of an fp8 layer with the wrong shape.
            RuntimeError: asleep with the weights freed (``wake_up`` first).
        """
        if self._freed is not None:
            raise RuntimeError("update_weights() while asleep with the weights freed: call wake_up() first")
        if self._to_refill:
            named_tensors = self._refilling(named_tensors)
        if self.fp8 is not None:  # quantized on arrival: checksummed before (weight_checksums)
            named_tensors = self.fp8.load(self._arrivals.watch(named_tensors))
        copy_weights_(self.model, named_tensors)
        self.weight_version = version

    @property
    def weight_dtype(self) -> torch.dtype:
        """The dtype the engine holds its weights in (the layout of :meth:`weight_checksums`)."""
        return self.model.model.embed_tokens.weight.dtype

    def weight_checksums(self, names: list[str]) -> dict[str, int | None]:
        """Checksums (:func:`reinforge.weights.verify.checksum`) of the named weights as the engine holds
        them after the last :meth:`update_weights`: each parameter's bytes where it landed (a view into
        a fused q/k/v or gate/up matrix included); an fp8-quantized layer's weight as it arrived, cast to
        :attr:`weight_dtype`, before quantization; None for a tied ``lm_head.weight`` (it is the
        embedding). A name the engine has no weight for is left out (the caller reports it)."""
        from ..weights.verify import param_checksums

        out = param_checksums(self.model, names, self.weight_dtype)
        if self.fp8 is not None:
            arrived = self._arrivals.result()
            out.update({n: arrived[n] for n in names if n not in out and n in arrived})
        return out

    def _refilling(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in named_tensors:
            yield name, tensor
            self._to_refill.discard(name)  # (resumed once the copy has landed: a failed copy stays to refill)

    def sleep(self, offload_weights: bool = False) -> None:
        """Free the KV cache; with ``offload_weights`` the weights' memory too: freed outright with
        ``discard_weights`` (the next weight syncs refill them), else moved to host memory (GPU only).

        Raises:
            RuntimeError: requests are in flight.
        """
        if self.has_unfinished():
            raise RuntimeError("sleep() with requests in flight")
        self.scheduler, self._pending = None, None
        self.runner.free()
        if not offload_weights or self._freed is not None or self._offloaded_from is not None:
            pass  # (weights kept, or already freed / moved by an earlier sleep)
        elif self.discard_weights:
            self._to_refill = {n for n, _ in self.model.named_parameters()}  # (a tied head: listed once)
            self._freed = free_weight_storage(self.model)
        elif self.device.type != "cpu":
            self._offloaded_from = self.device
            if self.fp8 is not None:  # the fp8 layers are no parameters: moved on their own
                self.fp8.to("cpu")
            else:
                self.model.fuse_projections(False)  # .to copies each view on its own: drop the fused matrices
            self.model.to("cpu")
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def wake_up(self) -> None:
        """Undo :meth:`sleep`: weights back on the device (discarded ones: allocated, to be written
        by weight syncs), KV cache allocated again."""
        if self._freed is not None:
            restore_weight_storage(self._freed)
            self._freed = None
        if self._offloaded_from is not None:
            self.model.to(self._offloaded_from)
            if self.fp8 is not None:
                self.fp8.to(self._offloaded_from)
            else:
                self.model.fuse_projections(self.model.variant.fused_projections)
            self._offloaded_from = None
        if self.scheduler is None:
            self._allocate()

    def shutdown(self) -> None:
        """Drop every queued and running request (also after a failed step) and free the cache."""
        self._heartbeat.idle()  # (the stall doctor: nothing in flight any more)
        if self.scheduler is not None:
            self.scheduler.waiting.clear()
            self.scheduler.owner = [None] * self.num_slots
        self.sleep()

    # ------------------------------------------------------------------ schedule -> run
    def _admit(self) -> None:
        sched = self.scheduler
        chosen = sched.admissible()
        if not chosen:
            return
        for pend in chosen:
            sched.place(pend)
        slots = [s for p in chosen for s in p.slots]
        self.runner.set_table_rows(slots, sched.table_rows(slots))
        bs = sched.layout.block_size
        tail_copies = [
            (sched.blocks[p.slots[0]][-1], sched.blocks[s][-1])
            for p in chosen
            if len(p.prompt_ids) % bs
            for s in p.slots[1:]
        ]
        self.runner.prefill(
            chosen, [sched.blocks[p.slots[0]] for p in chosen], tail_copies, self.config.max_prefill_tokens
        )

    def _preempt(self, slot: int) -> None:
        """Recompute preemption of ``slot`` (after :meth:`_drain`: it reads the sequence's state)."""
        ids, lps, routes = self.runner.generated(slot)
        trace.instant("preempt", "engine", slot=slot, generated_tokens=len(ids))
        if routes is not None:  # those of the tokens carried from earlier admissions, then these
            routes = torch.cat([self._carried_routes(self.scheduler.owner[slot][0]), routes])
        self.scheduler.requeue(slot, ids, lps, routes)
        self.runner.release([slot])

    def _carried_routes(self, pend: Pending) -> torch.Tensor | None:
        """The routes of a waiting entry's carried tokens ([0, layers, k] when it has none), None
        when routes are not recorded."""
        if not self.runner.record_routes:
            return None
        if pend.carried_routes is not None:
            return pend.carried_routes
        return torch.zeros(0, *self.runner.out_routes.shape[2:], dtype=self.runner.route_dtype)

    def _snapshot(self, slots: list[int]) -> Snapshot:
        return self.runner.snapshot(slots, [self.scheduler.admitted[s] for s in slots])

    def _drain(self) -> None:
        """Process every outstanding read-back now (waits for the queued decode steps): afterwards
        no occupied slot holds a finished sequence and the device state is current."""
        owned = self.scheduler.occupied()
        previous, self._pending = self._pending, None
        if previous is not None:
            self._process(previous)
        if owned:
            self._process(self._snapshot(owned))

    # ------------------------------------------------------------------ postprocess
    def _process(self, snap: Snapshot, abort: bool = False) -> None:
        """Finish the slots that ``snap`` shows done (all of its slots with ``abort``), and those whose
        text now contains a stop string; hand back their results and free them. Slots finished or
        re-admitted since the snapshot are skipped. Waits for the snapshot's copy (and only for it)."""
        sched = self.scheduler
        done, lens, codes = snap.read()
        finished, check = [], []
        for s, admitted in zip(snap.slots, snap.admitted):
            owner = sched.owner[s]
            if owner is None or sched.admitted[s] != admitted:
                continue
            if done[s] or abort:
                finished.append(s)
            elif owner[0].group.request.params.stop:
                check.append(s)
        rows, check = finished + check, set(check)
        if not rows:
            return
        toks, lps, routes = self.runner.read_outputs(rows, max(lens[s] for s in rows))
        ended = []
        for i, s in enumerate(rows):
            pend, k = sched.owner[s]
            n, code = lens[s], codes[s]
            params = pend.group.request.params
            if s in check:  # still running: did it just complete a stop string?
                carried = pend.carried_ids
                cut = stop_string_cut(self.tokenizer, carried + toks[i][:n], params.stop)
                if cut is None:
                    continue
                n, code = max(cut - len(carried), 0), STOP
            if code == STOP:
                reason = FinishReason.STOP
            elif code == LENGTH:
                reason = FinishReason.LENGTH
            else:
                reason = FinishReason.ABORT if abort else FinishReason.LENGTH
            t, lp = pend.carried_ids + toks[i][:n], pend.carried_logprobs + lps[i][:n]
            r = torch.cat([self._carried_routes(pend), routes[i, :n]]) if routes is not None else None
            if params.stop and reason == FinishReason.STOP:
                cut = stop_string_cut(self.tokenizer, t, params.stop)
                if cut is not None:
                    t, lp = t[:cut], lp[:cut]
                    r = r[:cut] if r is not None else None
            pend.group.results[pend.samples[k]] = GenerateResult(t, lp, reason, self.weight_version, routed_experts=r)
            ended.append(s)
        if ended:
            sched.release(ended)
            self.runner.release(ended)


def stop_string_cut(tokenizer, tokens: list[int], stops: list[str]) -> int | None:
    """Smallest prefix length of ``tokens`` whose text contains one of ``stops``; None if none."""
    if not stops:
        return None
    text = tokenizer.decode(tokens)
    if not any(s in text for s in stops):
        return None
    lo, hi = 1, len(tokens)
    while lo < hi:  # the first prefix containing a stop string
        mid = (lo + hi) // 2
        t = tokenizer.decode(tokens[:mid])
        if any(s in t for s in stops):
            hi = mid
        else:
            lo = mid + 1
    return lo
