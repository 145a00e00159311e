"""The embedded rollout engine: continuous batching over a preallocated per-slot KV cache.

Design (docs/design.md; measurements in docs/benchmarks.md):

* **Slots.** The KV cache is two tensors ``[layers, slots, kv_heads, max_model_len, head_dim]``.
  A sequence owns one slot from admission to finish, so admission control is the only
  memory policy needed: a request waits until enough slots are free (no preemption).
* **Continuous batching.** Each ``step()`` admits waiting requests into free slots (one
  batched prefill), runs ``sync_interval`` decode steps over the occupied slot range, then
  reads back which slots finished (one host sync) and frees them for the next admissions.
* **Prefix sharing.** The ``n`` samples of a request prefill the prompt once; its KV rows are
  copied into the other ``n - 1`` slots.
* **Device-side state.** Sampling parameters, lengths, finish flags and outputs live in
  per-slot device tensors; a decode step is a fixed sequence of tensor ops over static
  buffers (no per-token Python work), which is what makes it capturable as a CUDA graph.
* **Same model code as the trainer** (:class:`reinforge.models.transformer.CausalLM`), so
  log-probs agree with the trainer's up to floating-point reassociation.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import math
from dataclasses import dataclass
from typing import Any, Iterable

import torch

from ..config.sections import RolloutConfig
from ..models.loading import build_model, copy_weights_, is_native
from ..models.transformer import CausalLM
from .sampling import sample_tokens
from .types import FinishReason, GenerateRequest, GenerateResult

log = logging.getLogger(__name__)

_STOP, _LENGTH = 1, 2
MAX_STOP_IDS = 8


@dataclass
class EngineConfig:
    """Sizing and scheduling knobs of the embedded engine.

    ``max_num_seqs`` caps the slots (concurrent sequences); on CUDA the slots are further
    limited to what ``kv_cache_memory_fraction`` of the free device memory holds.
    ``max_model_len`` is the longest prompt + response a slot holds.
    ``max_prefill_tokens`` bounds the padded tokens of one prefill batch.
    ``sync_interval`` is the number of decode steps between host reads of finished slots.
    Defaults are the ``rollout`` config section's (one default per knob).
    """

    max_num_seqs: int = RolloutConfig.max_num_seqs
    max_model_len: int = 1024
    max_prefill_tokens: int = RolloutConfig.max_prefill_tokens
    kv_cache_memory_fraction: float = RolloutConfig.kv_cache_memory_fraction
    sync_interval: int = RolloutConfig.sync_interval
    cuda_graph: bool = RolloutConfig.cuda_graph
    seed: int = 0

    @classmethod
    def from_rollout(cls, r: RolloutConfig, max_model_len: int, seed: int) -> "EngineConfig":
        """The engine's settings from the ``rollout`` config section."""
        return cls(max_num_seqs=r.max_num_seqs, max_model_len=max_model_len, max_prefill_tokens=r.max_prefill_tokens,
                   kv_cache_memory_fraction=r.kv_cache_memory_fraction, sync_interval=r.sync_interval,
                   cuda_graph=r.cuda_graph, seed=seed)


class _Group:
    """A request and the slots of its ``n`` samples."""

    __slots__ = ("request", "results", "slots")

    def __init__(self, request: GenerateRequest):
        self.request = request
        self.results: list[GenerateResult | None] = [None] * request.n
        self.slots: list[int] = []


class _PrefillCtx:
    """Causal attention over a right-padded prompt batch; writes K/V into the given slots."""

    def __init__(self, engine: "EmbeddedEngine", slots: torch.Tensor):
        self.e, self.slots = engine, slots

    def attend(self, layer, q, k, v):
        T = k.shape[1]
        kt, vt = k.transpose(1, 2), v.transpose(1, 2)  # [P, KVH, T, D]
        self.e.k_cache[layer, self.slots, :, :T] = kt
        self.e.v_cache[layer, self.slots, :, :T] = vt
        o = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), kt, vt, is_causal=True, enable_gqa=kt.shape[1] != q.shape[2])
        return o.transpose(1, 2)


class _DecodeCtx:
    """One new token per slot in ``[0, B)``: write its K/V at ``pos``, attend to keys ``[0, pos]``."""

    def __init__(self, engine: "EmbeddedEngine", B: int, Lk: int, pos: torch.Tensor):
        self.e, self.B, self.Lk, self.pos = engine, B, Lk, pos
        self.rows = engine._arange[:B]
        visible = engine._arange[:Lk][None, :] <= pos[:, None]
        self.bias = torch.zeros(B, 1, 1, Lk, device=pos.device, dtype=torch.float32).masked_fill_(
            ~visible[:, None, None, :], float("-inf"))

    def attend(self, layer, q, k, v):
        e, B, Lk = self.e, self.B, self.Lk
        kc, vc = e.k_cache[layer], e.v_cache[layer]  # [S, KVH, L, D]
        kc[self.rows, :, self.pos] = k[:, 0]
        vc[self.rows, :, self.pos] = v[:, 0]
        H, D = q.shape[2], q.shape[3]
        KVH = kc.shape[1]
        qg = q.view(B, KVH, H // KVH, D)
        keys, values = kc[:B, :, :Lk], vc[:B, :, :Lk]  # views, no copy
        scores = torch.matmul(qg, keys.transpose(-1, -2)).float() * (D ** -0.5) + self.bias
        probs = torch.softmax(scores, dim=-1).to(values.dtype)
        return torch.matmul(probs, values).view(B, 1, H, D)


class EmbeddedEngine:
    """Continuous-batching generation with :class:`CausalLM`; implements ``RolloutEngine``.

    Args:
        model: the engine's own copy of the policy, already in the inference dtype and on the
            target device (weight sync copies into it in place).
        config: sizing and scheduling (:class:`EngineConfig`).
        tokenizer: needed only for requests with stop strings.
    """

    def __init__(self, model: CausalLM, config: EngineConfig | None = None, tokenizer: Any = None):
        if not isinstance(model, CausalLM):
            raise TypeError("EmbeddedEngine needs a reinforge CausalLM; use HFEngine for other models")
        self.model = model.eval().requires_grad_(False)
        self.config = config or EngineConfig()
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.weight_version = 0
        self.generator = torch.Generator(device=self.device).manual_seed(self.config.seed)
        self._graphs: dict[tuple[int, int, bool], Any] = {}
        self._graph_pool = None
        self._use_graphs = self.device.type == "cuda" and self.config.cuda_graph
        self._request_ids = itertools.count()
        self._waiting: collections.deque[_Group] = collections.deque()
        self._allocated = False
        self._sleeping_weights_device: torch.device | None = None
        self._interrupted = False
        self._allocate()

    # ------------------------------------------------------------------ memory
    def _bytes_per_slot(self) -> int:
        a = self.model.args
        elem = torch.tensor([], dtype=self.dtype).element_size()
        return 2 * a.num_layers * a.num_kv_heads * a.head_dim * self.config.max_model_len * elem

    def _num_slots(self) -> int:
        slots = self.config.max_num_seqs
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            fit = int(free * self.config.kv_cache_memory_fraction) // self._bytes_per_slot()
            if fit < 1:
                raise MemoryError(
                    f"the KV cache for one sequence of max_model_len={self.config.max_model_len} needs "
                    f"{self._bytes_per_slot() / 2**20:.0f} MiB but only {free / 2**20:.0f} MiB are free: lower "
                    f"rollout.max_model_len or raise rollout.kv_cache_memory_fraction")
            slots = min(slots, fit)
        return slots

    def _allocate(self) -> None:
        a, c = self.model.args, self.config
        S, L = self._num_slots(), c.max_model_len
        dev = self.device
        shape = (a.num_layers, S, a.num_kv_heads, L, a.head_dim)
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=dev)
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=dev)
        self.num_slots = S
        self.max_new_cap = L
        z = dict(device=dev)
        self._arange = torch.arange(max(S, L), **z)
        self.seq_lens = torch.zeros(S, dtype=torch.long, **z)
        self.gen_lens = torch.zeros(S, dtype=torch.long, **z)
        self.last_token = torch.zeros(S, dtype=torch.long, **z)
        self.done = torch.ones(S, dtype=torch.bool, **z)
        self.finish_code = torch.zeros(S, dtype=torch.int8, **z)
        self.max_new = torch.ones(S, dtype=torch.long, **z)
        self.temperature = torch.ones(S, dtype=torch.float32, **z)
        self.top_k = torch.zeros(S, dtype=torch.long, **z)
        self.top_p = torch.ones(S, dtype=torch.float32, **z)
        self.stop_ids = torch.full((S, MAX_STOP_IDS), -1, dtype=torch.long, **z)
        self.out_tokens = torch.zeros(S, L, dtype=torch.long, **z)
        self.out_logprobs = torch.zeros(S, L, dtype=torch.float32, **z)
        self._free = list(range(S))
        heapq.heapify(self._free)
        self._owner: list[tuple[_Group, int] | None] = [None] * S
        self._len_bound = [0] * S  # host-side upper bound of seq_lens per occupied slot
        self._filters = [False] * S  # slot uses top-k / top-p
        self._allocated = True
        log.info("embedded engine: %d slots x %d tokens, KV cache %.1f MiB", S, L,
                 2 * self.k_cache.numel() * self.k_cache.element_size() / 2**20)

    # ------------------------------------------------------------------ public API
    def generate(self, requests: list[GenerateRequest]) -> list[list[GenerateResult]]:
        """Results in request order. After :meth:`interrupt` it returns at the next step boundary:
        unfinished samples end with ``FinishReason.ABORT`` and keep the tokens generated so far."""
        groups = [self.add_request(r) for r in requests]
        while self.has_unfinished():
            if self._interrupted:
                for g in groups:
                    self.abort(g.request.request_id)
                break
            self.step()
        return [g.results for g in groups]  # type: ignore[misc]

    def interrupt(self) -> None:
        """Make a running (or the next) :meth:`generate` return at its next step boundary, until
        :meth:`resume`. Thread-safe: it only sets a flag (asynchronous RL's partial rollouts)."""
        self._interrupted = True

    def resume(self) -> None:
        """Undo :meth:`interrupt`."""
        self._interrupted = False

    def add_request(self, request: GenerateRequest) -> _Group:
        """Queue a request; its results fill in as ``step()`` runs.

        Raises:
            ValueError: prompt + max_new_tokens exceeds ``max_model_len``, n exceeds the slots, or
                more than 8 stop token ids are given.
        """
        if not self._allocated:
            raise RuntimeError("the engine is asleep: call wake_up() first")
        p = request.params
        if not request.prompt_ids:
            raise ValueError("empty prompt")
        need = len(request.prompt_ids) + p.max_new_tokens
        if need > self.config.max_model_len:
            raise ValueError(
                f"prompt of {len(request.prompt_ids)} tokens + max_new_tokens={p.max_new_tokens} exceeds the "
                f"engine's max_model_len={self.config.max_model_len}")
        if request.n > self.num_slots:
            raise ValueError(f"n={request.n} exceeds the engine's {self.num_slots} slots")
        if len(p.stop_token_ids) > MAX_STOP_IDS:
            raise ValueError(f"at most {MAX_STOP_IDS} stop token ids, got {len(p.stop_token_ids)}")
        if p.stop and self.tokenizer is None:
            raise ValueError("stop strings need the engine to be built with a tokenizer")
        if request.request_id is None:
            request.request_id = next(self._request_ids)
        group = _Group(request)
        self._waiting.append(group)
        return group

    def abort(self, request_id: Any) -> None:
        """Stop a queued or running request; its unfinished samples end with ``FinishReason.ABORT``."""
        for g in list(self._waiting):
            if g.request.request_id == request_id:
                self._waiting.remove(g)
                g.results = [GenerateResult([], [], FinishReason.ABORT, self.weight_version)] * g.request.n
        slots = [s for s, o in enumerate(self._owner) if o is not None and o[0].request.request_id == request_id]
        if slots:
            self._finish(slots, abort=True)

    def has_unfinished(self) -> bool:
        return bool(self._waiting) or any(o is not None for o in self._owner)

    def reseed(self, seed: int) -> None:
        """Restart the sampling random stream (the loop reseeds per rollout: resumable runs)."""
        self.generator.manual_seed(seed)

    def step(self) -> None:
        """Admit waiting requests, run ``sync_interval`` decode steps, collect finished slots."""
        self._admit()
        running = [s for s, o in enumerate(self._owner) if o is not None]
        if not running:
            return
        steps = self.config.sync_interval
        B = _bucket(max(running) + 1, self.num_slots)
        Lk = _bucket(max(self._len_bound[s] for s in running) + steps, self.config.max_model_len, quantum=64)
        filters = any(self._filters[s] for s in running)
        for _ in range(steps):
            self._decode_step(B, Lk, filters)
        for s in running:
            self._len_bound[s] += steps
        self._collect(running)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Copy new weights (Hugging Face names) into the engine's model in place.

        Raises:
            KeyError: a name that the model does not have.
        """
        copy_weights_(self.model, named_tensors)
        self.weight_version = version

    def sleep(self, offload_weights: bool = False) -> None:
        """Free the KV cache (and move the weights to CPU when ``offload_weights``)."""
        if self.has_unfinished():
            raise RuntimeError("sleep() with requests in flight")
        self._allocated = False
        self._graphs.clear()  # they point into the buffers freed below
        self._graph_pool = None
        for name in ("k_cache", "v_cache", "out_tokens", "out_logprobs"):
            setattr(self, name, None)
        if offload_weights and self.device.type != "cpu":
            self._sleeping_weights_device = self.device
            self.model.to("cpu")
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def wake_up(self) -> None:
        if self._sleeping_weights_device is not None:
            self.model.to(self._sleeping_weights_device)
            self._sleeping_weights_device = None
        if not self._allocated:
            self._allocate()

    def shutdown(self) -> None:
        """Drop every queued and running request (also after a failed step) and free the cache."""
        self._waiting.clear()
        if self._allocated:
            self._owner = [None] * self.num_slots
        self.sleep()

    # ------------------------------------------------------------------ internals
    @torch.no_grad()
    def _admit(self) -> None:
        chosen: list[_Group] = []
        budget = self.config.max_prefill_tokens
        longest = 0
        free = len(self._free)
        while self._waiting and self._waiting[0].request.n <= free:
            g = self._waiting[0]
            longest_if = max(longest, len(g.request.prompt_ids))
            if chosen and longest_if * (len(chosen) + 1) > budget:
                break
            self._waiting.popleft()
            chosen.append(g)
            longest = longest_if
            free -= g.request.n
        if not chosen:
            return
        dev = self.device
        P, T = len(chosen), longest
        ids = torch.zeros(P, T, dtype=torch.long)
        lens = torch.tensor([len(g.request.prompt_ids) for g in chosen])
        for i, g in enumerate(chosen):
            ids[i, : lens[i]] = torch.tensor(g.request.prompt_ids)
            g.slots = [heapq.heappop(self._free) for _ in range(g.request.n)]
            for j, s in enumerate(g.slots):
                self._owner[s] = (g, j)
                self._len_bound[s] = int(lens[i])
                p = g.request.params
                self._filters[s] = p.top_k > 0 or p.top_p < 1.0
        ids, lens_d = ids.to(dev), lens.to(dev)
        first = torch.tensor([g.slots[0] for g in chosen], device=dev)
        hidden = self.model.forward_hidden(ids, None, _PrefillCtx(self, first))
        last = hidden[torch.arange(P, device=dev), lens_d - 1]
        logits = self.model.lm_head(last).float()
        # prefix sharing: copy the prompt's KV rows into the group's other slots
        src = [g.slots[0] for g in chosen for _ in g.slots[1:]]
        if src:
            dst = torch.tensor([s for g in chosen for s in g.slots[1:]], device=dev)
            src_t = torch.tensor(src, device=dev)
            self.k_cache[:, dst, :, :T] = self.k_cache[:, src_t, :, :T]
            self.v_cache[:, dst, :, :T] = self.v_cache[:, src_t, :, :T]
        # per-slot state
        slots = [s for g in chosen for s in g.slots]
        reps = torch.tensor([g.request.n for g in chosen], device=dev)
        params = [g.request.params for g in chosen for _ in g.slots]
        slot_t = torch.tensor(slots, device=dev)

        def put(buf, values, dtype):
            buf[slot_t] = torch.tensor(values, dtype=dtype).to(dev)

        put(self.seq_lens, [len(g.request.prompt_ids) for g in chosen for _ in g.slots], torch.long)
        put(self.max_new, [p.max_new_tokens for p in params], torch.long)
        put(self.temperature, [p.temperature for p in params], torch.float32)
        put(self.top_k, [p.top_k for p in params], torch.long)
        put(self.top_p, [p.top_p for p in params], torch.float32)
        stop = torch.full((len(slots), MAX_STOP_IDS), -1, dtype=torch.long)
        for i, p in enumerate(params):
            if not p.ignore_eos and p.stop_token_ids:
                stop[i, : len(p.stop_token_ids)] = torch.tensor(p.stop_token_ids)
        self.stop_ids[slot_t] = stop.to(dev)
        filt = any(self._filters[s] for s in slots)
        rep_logits = logits.repeat_interleave(reps, dim=0)
        tok, lp = sample_tokens(rep_logits, self.temperature[slot_t], self.top_k[slot_t] if filt else None,
                                self.top_p[slot_t] if filt else None, self.generator)
        self.out_tokens[slot_t, 0] = tok
        self.out_logprobs[slot_t, 0] = lp
        self.gen_lens[slot_t] = 1
        self.last_token[slot_t] = tok
        is_stop = (tok[:, None] == self.stop_ids[slot_t]).any(-1)
        hit_len = self.max_new[slot_t] <= 1
        self.finish_code[slot_t] = torch.where(is_stop, _STOP, torch.where(hit_len, _LENGTH, 0)).to(torch.int8)
        self.done[slot_t] = is_stop | hit_len

    def _decode_step(self, B: int, Lk: int, filters: bool) -> None:
        """One decode step over slots [0, B) with keys [0, Lk): a CUDA graph replay when
        available. A shape seen for the first time runs eagerly (which also warms up the
        kernels) and is captured for the next time; graphs share one memory pool."""
        if not self._use_graphs:
            self._decode(B, Lk, filters)
            return
        key = (B, Lk, filters)
        graph = self._graphs.get(key)
        if graph is not None:
            graph.replay()
            return
        self._decode(B, Lk, filters)
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        graph.register_generator_state(self.generator)  # fresh random numbers at every replay
        if self._graph_pool is None:
            self._graph_pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self._graph_pool):
            self._decode(B, Lk, filters)
        self._graphs[key] = graph

    @torch.no_grad()
    def _decode(self, B: int, Lk: int, filters: bool) -> None:
        pos = self.seq_lens[:B]
        ctx = _DecodeCtx(self, B, Lk, pos)
        hidden = self.model.forward_hidden(self.last_token[:B, None], pos[:, None], ctx)
        logits = self.model.lm_head(hidden[:, 0]).float()
        tok, lp = sample_tokens(logits, self.temperature[:B], self.top_k[:B] if filters else None,
                                self.top_p[:B] if filters else None, self.generator)
        active = ~self.done[:B]
        rows = ctx.rows
        g = self.gen_lens[:B]
        w = g.clamp(max=self.max_new_cap - 1)
        self.out_tokens[rows, w] = torch.where(active, tok, self.out_tokens[rows, w])
        self.out_logprobs[rows, w] = torch.where(active, lp, self.out_logprobs[rows, w])
        new_g = g + active
        is_stop = active & (tok[:, None] == self.stop_ids[:B]).any(-1)
        hit_len = active & ~is_stop & ((new_g >= self.max_new[:B]) | (pos + 1 >= self.config.max_model_len))
        code = torch.where(is_stop, _STOP, torch.where(hit_len, _LENGTH, 0)).to(torch.int8)
        self.finish_code[:B] = torch.where(is_stop | hit_len, code, self.finish_code[:B])
        self.done[:B] |= is_stop | hit_len
        self.gen_lens[:B] = new_g
        self.seq_lens[:B] = pos + active
        self.last_token[:B] = torch.where(active, tok, self.last_token[:B])

    def _collect(self, running: list[int]) -> None:
        idx = torch.tensor(running, device=self.device)
        done = self.done[idx].cpu().tolist()
        finished = [s for s, d in zip(running, done) if d]
        stop_check = [s for s, d in zip(running, done) if not d and self._owner[s][0].request.params.stop]
        if stop_check:
            finished += self._check_stop_strings(stop_check)
        if finished:
            self._finish(finished)

    def _check_stop_strings(self, slots: list[int]) -> list[int]:
        """Slots whose text now contains a stop string: truncate them and mark them done."""
        idx = torch.tensor(slots, device=self.device)
        lens = self.gen_lens[idx].cpu().tolist()
        toks = self.out_tokens[idx].cpu()
        hit = []
        for s, n, row in zip(slots, lens, toks):
            cut = _stop_string_cut(self.tokenizer, row[:n].tolist(), self._owner[s][0].request.params.stop)
            if cut is not None:
                self.gen_lens[s] = cut
                self.finish_code[s] = _STOP
                self.done[s] = True
                hit.append(s)
        return hit

    def _finish(self, slots: list[int], abort: bool = False) -> None:
        idx = torch.tensor(slots, device=self.device)
        lens = self.gen_lens[idx].cpu().tolist()
        codes = self.finish_code[idx].cpu().tolist()
        width = max(lens) if lens else 0
        toks = self.out_tokens[idx, :width].cpu().tolist()
        lps = self.out_logprobs[idx, :width].cpu().tolist()
        for s, n, code, t, lp in zip(slots, lens, codes, toks, lps):
            g, j = self._owner[s]
            if code == _STOP:
                reason = FinishReason.STOP
            elif code == _LENGTH:
                reason = FinishReason.LENGTH
            else:
                reason = FinishReason.ABORT if abort else FinishReason.LENGTH
            if g.request.params.stop and reason == FinishReason.STOP:
                cut = _stop_string_cut(self.tokenizer, t[:n], g.request.params.stop)
                n = cut if cut is not None else n
            g.results[j] = GenerateResult(t[:n], lp[:n], reason, self.weight_version)
            self._owner[s] = None
            heapq.heappush(self._free, s)
        self.done[idx] = True


def _stop_string_cut(tokenizer, tokens: list[int], stops: list[str]) -> int | None:
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


def _bucket(n: int, cap: int, quantum: int = 8) -> int:
    """Round ``n`` up to a power of two (at least ``quantum``) or a multiple of 256 / quantum, capped."""
    if n <= 256:
        b = max(quantum, 1 << max(0, math.ceil(math.log2(max(n, 1)))))
    else:
        b = -(-n // 256) * 256
    return min(b, cap)


def from_spec(spec) -> Any:
    """The ``embedded`` backend's factory (:mod:`reinforge.rollout.backends`): the engine on its own
    copy of the model; a model the engine does not implement (not Llama / Qwen2 / Qwen3) falls back
    to transformers' ``generate`` with a warning."""
    model = build_model(spec.model_path, spec.dtype, spec.device, random_init=spec.random_init, seed=spec.init_seed)
    if not is_native(model):
        from .hf_engine import HFEngine

        log.warning("rollout.backend=embedded needs a Llama/Qwen2/Qwen3 model; falling back to transformers' "
                    "generate (rollout.backend=hf)")
        return HFEngine(model, pad_token_id=spec.tokenizer.pad_token_id, batch_size=spec.rollout.max_num_seqs,
                        seed=spec.seed)
    return EmbeddedEngine(model, EngineConfig.from_rollout(spec.rollout, spec.max_model_len, spec.seed),
                          tokenizer=spec.tokenizer)
