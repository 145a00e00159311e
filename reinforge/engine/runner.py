"""The engine's model runner: every device tensor of the engine and the work launched on them.

It owns the KV cache and block table, the per-slot state (lengths, sampling parameters, stop ids,
finish flags, outputs), the random streams, the CUDA graphs and the read-backs (:class:`Snapshot`).
It runs prefills (:meth:`ModelRunner.prefill`) and decode steps (:meth:`ModelRunner.decode`) over
that state; it makes no scheduling decision (:mod:`.scheduler` does).

Routing record (rollout routing replay, ``record_routes``; mixture-of-experts models): beside each
output token ``out_tokens[s, j]`` the buffer ``out_routes[s, j]`` [num_moe_layers, k] holds the
experts every MoE layer used at the position that predicted it: the prefill's last prompt position
for ``j = 0`` (only the sampled row is kept), the decode step's input token after that. Decode steps
write it like the tokens (inside the CUDA graph, into the static buffer); it is read back with them.

Sampling state, lengths and outputs are device tensors, so a decode step is a fixed sequence of
tensor ops over static buffers (no per-token Python work), captured as a CUDA graph per
(batch bucket, key range, filters) shape. On CUDA, host-to-device copies go through pinned memory
(:meth:`ModelRunner.h2d`) and read-backs are copied behind the queued work, so the host never waits
for the GPU except where it must read a result (overlap scheduling, :mod:`.engine`).
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

import torch

from ..models.families import moe_models
from ..models.moe import Routing, grouped_mm_supported
from ..models.transformer import CausalLM
from .attention import PrefillContext, decode_context
from .kv_cache import KVLayout, cache_copy, ring_table
from .kv_cache import kv_cache_dtype as resolve_kv_dtype
from .linear_state import LinearStates, linear_layers
from .sampling import sample_tokens, sample_tokens_fused
from .slot_state import LENGTH, STOP, advance_slots, advance_slots_fused

if TYPE_CHECKING:
    from .scheduler import Pending

log = logging.getLogger(__name__)

MAX_STOP_IDS = 8


def philox_base(seed: int) -> int:
    """The fused sampler's first Philox key for ``seed`` (decode steps count up from it)."""
    return (seed & 0x7FFFFFFF) << 32


class Snapshot:
    """The done flags, generated lengths and finish codes of slots ``[0, max(slots)]`` as they are
    after the work queued so far, copied to pinned host memory behind that work (no host sync until
    :meth:`read`). ``slots`` are the occupied slots it is read for, ``admitted`` their admission
    numbers: a slot finished or re-admitted meanwhile is skipped."""

    __slots__ = ("slots", "admitted", "host", "event")

    def __init__(self, runner: ModelRunner, slots: list[int], admitted: list[int]):
        self.slots, self.admitted = slots, admitted
        B = max(slots) + 1
        state = torch.stack([runner.done[:B].long(), runner.gen_lens[:B], runner.finish_code[:B].long()])
        self.event = None
        if runner.on_cuda:
            self.host = torch.empty(state.shape, dtype=state.dtype, pin_memory=True)
            self.host.copy_(state, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = state

    def read(self) -> tuple[list[int], list[int], list[int]]:
        """(done, generated length, finish code) per slot index; waits for the copy."""
        if self.event is not None:
            self.event.synchronize()
        done, lens, codes = self.host.tolist()
        return done, lens, codes


class ModelRunner:
    """The device side of one engine.

    Args:
        model: the engine's copy of the model (inference variant already chosen).
        kernels: the fused Triton kernels run on this device (fused sampler, paged-attention kernel).
        max_model_len: longest prompt + response of a slot (the output buffers' width).
        cuda_graph: capture decode steps as CUDA graphs (CUDA only).
        seed: seed of the sampling streams.
        record_routes: keep the experts behind every sampled token (``out_routes``, see the module
            docstring); needs a mixture-of-experts model.
        kv_cache_dtype: ``engine.kv_cache_dtype`` (:func:`.kv_cache.kv_cache_dtype`): the cache's
            storage dtype, ``kv_dtype``.

    Raises:
        ValueError: ``record_routes`` for a dense model; an unusable ``kv_cache_dtype``.
    """

    def __init__(
        self,
        model: CausalLM,
        kernels: bool,
        max_model_len: int,
        cuda_graph: bool,
        seed: int,
        record_routes: bool = False,
        kv_cache_dtype: str = "auto",
    ):
        self.model, self.kernels, self.max_model_len = model, kernels, max_model_len
        if record_routes and not model.args.moe_layers:
            raise ValueError(
                f"algo.use_rollout_routing_replay=true: the embedded engine records expert routes of "
                f"{moe_models()}; this model is dense: set algo.use_rollout_routing_replay=false"
            )
        self.record_routes = record_routes
        # expert ids fit a byte up to 256 experts (Qwen3-MoE: 128, DeepSeek-V3: 256)
        self.route_dtype = torch.uint8 if model.args.num_experts <= 256 else torch.int16
        self.out_routes: torch.Tensor | None = None
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.kv_dtype = resolve_kv_dtype(kv_cache_dtype, self.dtype, self.device)
        self.on_cuda = self.device.type == "cuda"
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        # the fused sampler's Philox key: seed in the high 32 bits, decode steps in the low ones
        self._philox = torch.tensor([philox_base(seed)], dtype=torch.long, device=self.device)
        self._graphs: dict[tuple[int, int, bool], Any] = {}
        self._graph_pool = None
        self._use_graphs = self.on_cuda and cuda_graph
        if self._use_graphs and model.args.moe_layers and not grouped_mm_supported(self.device, self.dtype):
            # the MoE experts' loop (and torch's fp32 grouped matmul) reads group sizes back to the host
            log.warning(
                "engine: no CUDA graphs for this mixture-of-experts model in %s (the expert computation "
                "reads back to the host; bf16 on Hopper or later is captured)",
                self.dtype,
            )
            self._use_graphs = False
        self._side_stream = torch.cuda.Stream(self.device) if self.on_cuda else None
        self.layout: KVLayout | None = None
        self.linear: LinearStates | None = None

    def reseed(self, seed: int) -> None:
        self.generator.manual_seed(seed)
        self._philox.fill_(philox_base(seed))

    # ------------------------------------------------------------------ memory
    def allocate(self, layout: KVLayout) -> None:
        """The KV cache (``layout``'s blocks plus the sink block) and the per-slot buffers."""
        a, L, S, dev = self.model.args, self.max_model_len, layout.num_slots, self.device
        self.layout = layout
        self.Decode = decode_context(layout.paged, self.kernels)
        # the pool holds the global attention layers (not a hybrid's linear layers, not the sliding-window layers,
        # whose keys live in per-slot rings: kv_cache.py's module doc); k_cache[layer] / v_cache[layer]: that
        # layer's cache, a view of the pool or of its ring (None: a layer without keys and values). A latent cache
        # (multi-head latent attention) is one tensor for keys and values: v_pool is k_pool, v_cache is k_cache.
        rings, R = layout.ring_layers, layout.ring_blocks
        pooled = [i for i in (range(a.num_layers) if a.kv_layers is None else a.kv_layers) if i not in rings]
        heads, width = (1, a.kv_lora_rank + a.head_dim) if a.kv_lora_rank else (a.num_kv_heads, a.head_dim)
        shape = (len(pooled), layout.num_blocks + 1, heads, layout.block_size, width)
        self.k_pool = torch.zeros(shape, dtype=self.kv_dtype, device=dev)
        self.v_pool = self.k_pool if a.kv_lora_rank else torch.zeros(shape, dtype=self.kv_dtype, device=dev)
        self.block_table = torch.full((S, layout.blocks_per_seq), layout.sink_block, dtype=torch.int32, device=dev)
        self.is_ring = [i in rings for i in range(a.num_layers)]
        self.k_ring = self.v_ring = self.ring_table = None
        self.ring_sink = S * R
        if rings:
            ring_shape = (len(rings), S * R + 1, *shape[2:])
            self.k_ring = torch.zeros(ring_shape, dtype=self.kv_dtype, device=dev)
            self.v_ring = torch.zeros(ring_shape, dtype=self.kv_dtype, device=dev)
            self.ring_table = ring_table(S, R, layout.blocks_per_seq, dev)
        self.k_cache: list[torch.Tensor | None] = [None] * a.num_layers
        self.v_cache: list[torch.Tensor | None] = [None] * a.num_layers
        for caches, pool, ring in ((self.k_cache, self.k_pool, self.k_ring), (self.v_cache, self.v_pool, self.v_ring)):
            for row, i in enumerate(pooled):
                caches[i] = pool[row]
            for row, i in enumerate(rings):
                caches[i] = ring[row]
        if a.kv_lora_rank:
            self.v_cache = self.k_cache
        # a hybrid model's linear-attention layers: fixed states per slot (linear_state.py)
        layers = linear_layers(self.model)
        self.linear = LinearStates(layers, S, dev, self.dtype) if layers else None
        z = dict(device=dev)
        self.arange = torch.arange(max(S, L, layout.block_size * layout.blocks_per_seq), **z)
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
        names = ("done", "gen_lens", "seq_lens", "last_token", "max_new", "stop_ids", "finish_code")
        self.slot_state = {n: getattr(self, n) for n in (*names, "out_tokens", "out_logprobs")}
        if self.record_routes:
            self.out_routes = torch.zeros(S, L, len(a.moe_layers), a.num_experts_per_tok, dtype=self.route_dtype, **z)
            log.info(
                "embedded engine: routing record buffer of %.1f MiB (rollout routing replay)",
                self.out_routes.numel() * self.out_routes.element_size() / 2**20,
            )
        log.info(
            "embedded engine: %d slots, KV cache of %d blocks x %d tokens (%.1f MiB, %s)%s%s",
            S,
            layout.num_blocks,
            layout.block_size,
            self.kv_bytes() / 2**20,
            str(self.kv_dtype).removeprefix("torch."),
            ", Triton paged attention" if self.Decode.__name__ == "KernelDecode" else "",
            f", {len(rings)} sliding-window layers in rings of {R} blocks per slot" if rings else "",
        )

    def kv_bytes(self) -> int:
        """Bytes of the KV cache: the pool and the sliding-window layers' rings, keys and values."""
        tensors = {id(t): t for t in (self.k_pool, self.v_pool, self.k_ring, self.v_ring) if t is not None}
        return sum(t.numel() * t.element_size() for t in tensors.values())

    def table_of(self, layer: int) -> tuple[torch.Tensor, int]:
        """Layer ``layer``'s block table and sink block: the ring table for a ring layer, else the pool's."""
        if self.is_ring[layer]:
            return self.ring_table, self.ring_sink
        return self.block_table, self.layout.sink_block

    def drop_graphs(self) -> None:
        """Forget the captured decode graphs and their memory pool (a graph captured again into the pool of
        freed graphs trips PyTorch's caching allocator: ``use_count > 0`` at capture_begin)."""
        self._graphs.clear()
        self._graph_pool = None

    def free(self) -> None:
        """Drop the KV cache and the buffers (and the graphs that point into them)."""
        self.drop_graphs()
        names = ("k_cache", "v_cache", "k_pool", "v_pool", "k_ring", "v_ring", "ring_table", "block_table")
        for name in (*names, "out_tokens", "out_logprobs", "out_routes", "linear"):
            setattr(self, name, None)
        self.layout = None

    # ------------------------------------------------------------------ host <-> device
    def h2d(self, values: Any, dtype: torch.dtype = torch.long) -> torch.Tensor:
        """A host list (or CPU tensor) on the engine's device. On CUDA through pinned memory with a
        non-blocking copy: a plain copy from pageable memory waits for all queued GPU work, which
        would stall the overlap scheduler (the caching host allocator keeps the pinned buffer alive
        until the copy is done)."""
        t = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
        if not self.on_cuda:
            return t.to(self.device)
        return t.pin_memory().to(self.device, non_blocking=True)

    def set_table_rows(self, slots: list[int], rows: list[list[int]]) -> None:
        """Write block-table rows (from :meth:`Scheduler.table_rows`)."""
        self.block_table[self.h2d(slots)] = self.h2d(torch.tensor(rows, dtype=torch.int32))

    def snapshot(self, slots: list[int], admitted: list[int]) -> Snapshot:
        return Snapshot(self, slots, admitted)

    def read_outputs(
        self, slots: list[int], width: int
    ) -> tuple[list[list[int]], list[list[float]], torch.Tensor | None]:
        """The first ``width`` output tokens and log-probs of ``slots`` (host lists), and with
        ``record_routes`` their routes (CPU [len(slots), width, num_moe_layers, k], else None). On CUDA on a side
        stream: the decode steps queued meanwhile on the main stream leave these entries unchanged
        (finished rows are idle; running rows write past their read lengths), so the read need not
        wait for them."""
        side = torch.cuda.stream(self._side_stream) if self._side_stream is not None else contextlib.nullcontext()
        with side:
            idx = self.h2d(slots)
            toks, lps = self.out_tokens[idx, :width].cpu(), self.out_logprobs[idx, :width].cpu()
            routes = self.out_routes[idx, :width].cpu() if self.out_routes is not None else None
        return toks.tolist(), lps.tolist(), routes

    def generated(self, slot: int) -> tuple[list[int], list[float], torch.Tensor | None]:
        """The tokens, log-probs and (``record_routes``) routes [n, num_moe_layers, k] ``slot`` has
        generated (synchronous: call with nothing queued that changes them, i.e. after the engine drained)."""
        n = int(self.gen_lens[slot])
        routes = self.out_routes[slot, :n].cpu() if self.out_routes is not None else None
        return self.out_tokens[slot, :n].tolist(), self.out_logprobs[slot, :n].tolist(), routes

    def _routing(self) -> Routing | None:
        """A recording :class:`Routing` for one forward pass when routes are recorded, else None."""
        return Routing(record=True) if self.record_routes else None

    def _routes(self, routing: Routing) -> torch.Tensor:
        """The recorded experts of a forward pass over N tokens: [N, num_moe_layers, k] (route dtype)."""
        return torch.stack([routing.experts[i] for i in self.model.args.moe_layers], 1).to(self.route_dtype)

    def release(self, slots: list[int]) -> None:
        """The slots' rows become idle (done, every block the sink). (``index_fill_`` takes the value as a
        kernel argument; ``t[idx] = True`` copies it from pageable host memory, which waits for the GPU.)"""
        idx = self.h2d(slots)
        self.done.index_fill_(0, idx, True)
        self.block_table.index_fill_(0, idx, self.layout.sink_block)

    # ------------------------------------------------------------------ prefill
    @torch.no_grad()
    def prefill(
        self,
        chosen: list[Pending],
        blocks: list[list[int]],
        tail_copies: list[tuple[int, int]],
        max_prefill_tokens: int,
    ) -> None:
        """Prefill the admitted entries (right-padded, one batch; ``blocks[i]`` are the blocks of
        entry ``i``'s first sample, whose K/V the prefill writes) and sample each slot's first token.

        A batch wider than ``max_prefill_tokens`` (one long prompt) runs in chunks of columns, each
        attending to the keys the earlier chunks cached (chunked prefill). Then each (source,
        destination) block pair of ``tail_copies`` is copied: the other samples of an entry get the
        prompt's last, partial block (prefix sharing).
        """
        dev, bs, sink = self.device, self.layout.block_size, self.layout.sink_block
        P, T = len(chosen), max(len(p.prompt_ids) for p in chosen)
        ids = torch.zeros(P, T, dtype=torch.long)
        lens = torch.tensor([len(p.prompt_ids) for p in chosen])
        blk = torch.full((P, T), sink, dtype=torch.long)
        for i, (pend, b0) in enumerate(zip(chosen, blocks)):
            ids[i, : lens[i]] = torch.tensor(pend.prompt_ids)
            span = min(T, len(b0) * bs)
            blk[i, :span] = torch.tensor(b0).repeat_interleave(bs)[:span]
        slots = [s for p in chosen for s in p.slots]
        ids, lens_d, blk = self.h2d(ids), self.h2d(lens), self.h2d(blk)
        off = (torch.arange(T, device=dev) % bs).expand(P, T)
        if self.ring_table is not None:  # the first sample's ring: logical block p // bs of its slot
            ring_blk = self.ring_table[self.h2d([p.slots[0] for p in chosen])][
                :, torch.arange(T, device=dev) // bs
            ].long()
            ring_len = self.layout.ring_blocks * bs
        width = max(1, max_prefill_tokens // P)
        last = last_routes = None
        for a in range(0, T, width):
            b = min(T, a + width)
            ctx = PrefillContext(self, blk[:, a:b], off[:, a:b], blk[:, :a] if a else None, off[:, :a] if a else None)
            if self.ring_table is not None:  # a chunk writes its last ring_len positions (no two to one place)
                pos = torch.arange(a, b, device=dev)[None, :]
                end = lens_d.clamp(max=b)[:, None]
                keep = (pos < end) & (pos >= end - ring_len)
                ctx.set_ring(torch.where(keep, ring_blk[:, a:b], self.ring_sink), ring_blk[:, :a] if a else None)
            if self.linear is not None:
                ctx.linear_state = self.linear.prefill(a, lens_d)
            pos = torch.arange(a, b, device=dev).expand(P, b - a)
            routing = self._routing()
            hidden = self.model.forward_hidden(ids[:, a:b], pos, ctx, routing)
            rows, cols = torch.arange(P, device=dev), (lens_d - 1 - a).clamp(0, b - a - 1)
            here = hidden[rows, cols]
            ends = ((lens_d - 1 >= a) & (lens_d - 1 < b))[:, None]
            last = here if last is None else torch.where(ends, here, last)
            if routing is not None:  # the experts at the last prompt position (predicts the first token)
                r = self._routes(routing).view(P, b - a, *self.out_routes.shape[2:])[rows, cols]
                last_routes = r if last_routes is None else torch.where(ends[:, :, None], r, last_routes)
        logits = self.model.lm_head(last).float()
        if self.linear is not None:
            self.linear.commit(self.h2d(slots), self.h2d([len(p.slots) for p in chosen]))
        if self.ring_table is not None:  # each further sample: a copy of the first sample's ring
            R = self.layout.ring_blocks
            pairs = [(p.slots[0], s) for p in chosen for s in p.slots[1:]]
            if pairs:
                src = self.h2d([s0 * R + j for s0, _ in pairs for j in range(R)])
                dst = self.h2d([s * R + j for _, s in pairs for j in range(R)])
                for ring in (self.k_ring, self.v_ring):
                    cache_copy(ring, (slice(None), dst), (slice(None), src))
        if tail_copies:
            src = self.h2d([a for a, _ in tail_copies])
            dst = self.h2d([b for _, b in tail_copies])
            r = min(T, bs)
            for cache in {id(c): c for c in (self.k_pool, self.v_pool)}.values():
                cache_copy(
                    cache,
                    (slice(None), dst, slice(None), slice(None, r)),
                    (slice(None), src, slice(None), slice(None, r)),
                )
        self._start_slots(chosen, slots, logits, last_routes)

    def _start_slots(
        self, chosen: list[Pending], slots: list[int], logits: torch.Tensor, routes: torch.Tensor | None = None
    ) -> None:
        """Per-slot state of the admitted samples, and their first tokens sampled from ``logits``
        (one row per entry, repeated for its samples; ``routes`` [entries, num_moe_layers, k] likewise)."""
        reps = self.h2d([len(p.slots) for p in chosen])
        params = [p.group.request.params for p in chosen for _ in p.slots]
        slot_t = self.h2d(slots)

        def put(buf, values, dtype):
            buf[slot_t] = self.h2d(values, dtype)

        put(self.seq_lens, [len(p.prompt_ids) for p in chosen for _ in p.slots], torch.long)
        put(self.max_new, [p.max_new_tokens for p in chosen for _ in p.slots], torch.long)
        put(self.temperature, [p.temperature for p in params], torch.float32)
        put(self.top_k, [p.top_k for p in params], torch.long)
        put(self.top_p, [p.top_p for p in params], torch.float32)
        stop = torch.full((len(slots), MAX_STOP_IDS), -1, dtype=torch.long)
        for i, p in enumerate(params):
            if not p.ignore_eos and p.stop_token_ids:
                stop[i, : len(p.stop_token_ids)] = torch.tensor(p.stop_token_ids)
        self.stop_ids[slot_t] = self.h2d(stop)
        filt = any(p.top_k > 0 or p.top_p < 1.0 for p in params)
        rep_logits = logits.repeat_interleave(reps, dim=0, output_size=len(slots))  # (no host sync)
        tok, lp = sample_tokens(
            rep_logits,
            self.temperature[slot_t],
            self.top_k[slot_t] if filt else None,
            self.top_p[slot_t] if filt else None,
            self.generator,
        )
        self.out_tokens[slot_t, 0] = tok
        self.out_logprobs[slot_t, 0] = lp
        if routes is not None:
            self.out_routes[slot_t, 0] = routes.repeat_interleave(reps, dim=0, output_size=len(slots))
        self.gen_lens.index_fill_(0, slot_t, 1)  # (no host scalar copy: see release)
        self.last_token[slot_t] = tok
        is_stop = (tok[:, None] == self.stop_ids[slot_t]).any(-1)
        hit_len = self.max_new[slot_t] <= 1
        self.finish_code[slot_t] = torch.where(is_stop, STOP, torch.where(hit_len, LENGTH, 0)).to(torch.int8)
        self.done[slot_t] = is_stop | hit_len

    # ------------------------------------------------------------------ decode
    def decode(self, B: int, Lk: int, filters: bool) -> None:
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
        active = ~self.done[:B]
        ctx = self.Decode(self, B, Lk, pos, active)
        if self.linear is not None:
            ctx.linear_state = self.linear.decode(B)
        routing = self._routing()
        hidden = self.model.forward_hidden(self.last_token[:B, None], pos[:, None], ctx, routing)
        logits = self.model.lm_head(hidden[:, 0])
        if self.kernels and not filters:
            tok, lp = sample_tokens_fused(logits, self.temperature[:B], self._philox)
            self._philox += 1
        else:
            tok, lp = sample_tokens(
                logits.float(),
                self.temperature[:B],
                self.top_k[:B] if filters else None,
                self.top_p[:B] if filters else None,
                self.generator,
            )
        if self.kernels and routing is None:  # one kernel instead of ~30 (slot_state.py)
            advance_slots_fused(tok, lp, self.slot_state, self.max_model_len)
            return
        routes = self._routes(routing) if routing is not None else None
        active, w = advance_slots(tok, lp, self.slot_state, self.max_model_len)
        if routes is not None:  # the experts at this step's input token (they predicted tok)
            rows = self.arange[:B]
            self.out_routes[rows, w] = torch.where(active[:, None, None], routes, self.out_routes[rows, w])
