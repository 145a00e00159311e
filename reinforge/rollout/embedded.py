"""The embedded rollout engine: continuous batching over a preallocated per-slot KV cache.

Design (docs/design.md; measurements in docs/benchmarks.md):

* **Slots and a paged KV cache.** A sequence owns a slot (a row of the per-sequence state) from
  admission to finish. Its keys and values live in blocks of ``kv_block_size`` tokens of a
  shared pool, ``[layers, blocks, kv_heads, block_size, head_dim]``, listed in its row of a block
  table (:mod:`.kv_cache`): memory follows the tokens actually held. Before each run of decode
  steps every running sequence gets the blocks it will fill; when the pool runs dry the most
  recently admitted sequence is preempted (its blocks freed, and it is queued again to be
  re-prefilled with its prompt plus the tokens it has so far: vLLM's recompute preemption).
  On a GPU a Triton kernel attends over each sequence's own blocks (:mod:`.paged_attention`).
  Without Triton (CPU) the default block is ``max_model_len`` long: one block per slot, the
  padded layout whose attention is a plain batched matmul (fastest there).
* **Continuous batching.** Each ``step()`` admits waiting requests into free slots (one
  batched prefill), runs ``sync_interval`` decode steps over the occupied slot range, then
  reads back which slots finished and frees them for the next admissions.
* **Overlap scheduling** (GPU, ``overlap_schedule``). The read-back of a run of decode steps
  (done flags, lengths, finish codes) is copied to pinned memory behind the steps; ``step()``
  launches the next run before it waits for the previous run's copy, so the host's work (finished
  sequences, block grants, admissions) runs while the GPU decodes. The host knows an upper bound of
  every sequence's length, so a sequence that must have hit ``max_new_tokens`` is not decoded
  again; one that stopped early is decoded (as an idle row) one run longer. Host-to-device copies
  go through pinned memory (no sync); the rare paths that read a running sequence's state
  (preemption, abort) first drain the pipeline.
* **Prefix sharing.** The ``n`` samples of a request prefill the prompt once; they share its
  full blocks (reference-counted) and each gets a copy of its last, partial block.
* **Device-side state.** Sampling parameters, lengths, finish flags and outputs live in
  per-slot device tensors; a decode step is a fixed sequence of tensor ops over static
  buffers (no per-token Python work), which is what makes it capturable as a CUDA graph.
* **Same model code as the trainer** (:class:`reinforge.models.transformer.CausalLM`), so
  log-probs agree with the trainer's up to floating-point reassociation.
"""

from __future__ import annotations

import collections
import contextlib
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
from .kv_cache import BlockAllocator
from .paged_attention import gather_blocks, masked_decode_attention, paged_decode_attention_triton
from .sampling import sample_tokens, sample_tokens_fused
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
    ``max_prefill_tokens`` bounds the padded tokens of one prefill batch; a prompt longer than it is
    prefilled alone in chunks of ``max_prefill_tokens`` tokens (chunked prefill: each chunk attends
    to the keys the earlier ones cached).
    ``sync_interval`` is the number of decode steps between host reads of finished slots;
    ``overlap_schedule`` (CUDA only) launches the next ones before that read.
    ``kv_block_size`` is the tokens per KV-cache block; 0 picks 16 where the Triton kernel runs
    (CUDA) and ``max_model_len`` (one block per sequence) elsewhere. ``num_kv_blocks`` caps the
    block pool (0: no cap); at least one sequence of ``max_model_len`` must fit.
    Defaults are the ``rollout`` config section's (one default per knob).
    """

    max_num_seqs: int = RolloutConfig.max_num_seqs
    max_model_len: int = 1024
    max_prefill_tokens: int = RolloutConfig.max_prefill_tokens
    kv_cache_memory_fraction: float = RolloutConfig.kv_cache_memory_fraction
    sync_interval: int = RolloutConfig.sync_interval
    overlap_schedule: bool = RolloutConfig.overlap_schedule
    cuda_graph: bool = RolloutConfig.cuda_graph
    kv_block_size: int = RolloutConfig.kv_block_size
    num_kv_blocks: int = RolloutConfig.num_kv_blocks
    seed: int = 0

    @classmethod
    def from_rollout(cls, r: RolloutConfig, max_model_len: int, seed: int) -> "EngineConfig":
        """The engine's settings from the ``rollout`` config section."""
        return cls(max_num_seqs=r.max_num_seqs, max_model_len=max_model_len, max_prefill_tokens=r.max_prefill_tokens,
                   kv_cache_memory_fraction=r.kv_cache_memory_fraction, sync_interval=r.sync_interval,
                   overlap_schedule=r.overlap_schedule, cuda_graph=r.cuda_graph, kv_block_size=r.kv_block_size,
                   num_kv_blocks=r.num_kv_blocks, seed=seed)


class _Group:
    """A request and the results of its ``n`` samples (filled in as they finish)."""

    __slots__ = ("request", "results")

    def __init__(self, request: GenerateRequest):
        self.request = request
        self.results: list[GenerateResult | None] = [None] * request.n


class _Pending:
    """Samples of a request waiting to be prefilled together: all ``n`` of a new request, or one
    preempted sample, whose prompt then ends with the tokens it had generated (``carried``)."""

    __slots__ = ("group", "samples", "prompt_ids", "carried_ids", "carried_logprobs", "slots")

    def __init__(self, group: _Group, samples: list[int], prompt_ids: list[int],
                 carried_ids: list[int] | None = None, carried_logprobs: list[float] | None = None):
        self.group, self.samples, self.prompt_ids = group, samples, prompt_ids
        self.carried_ids, self.carried_logprobs = carried_ids or [], carried_logprobs or []
        self.slots: list[int] = []

    @property
    def max_new_tokens(self) -> int:
        return self.group.request.params.max_new_tokens - len(self.carried_ids)


class _PrefillCtx:
    """Causal attention over a chunk of a right-padded prompt batch, positions ``[start, start + T)``;
    writes the chunk's K/V into each prompt's blocks. With ``start > 0`` (chunked prefill) the chunk
    also attends to the keys of positions ``[0, start)``, read back from the cache.

    ``blk``, ``off``: [P, T] block id and offset of each (prompt, chunk position); the sink block
    for padding positions that have no block. ``prefix_blk``, ``prefix_off``: [P, start], the same
    for the earlier positions.
    """

    def __init__(self, engine: "EmbeddedEngine", blk: torch.Tensor, off: torch.Tensor,
                 prefix_blk: torch.Tensor | None = None, prefix_off: torch.Tensor | None = None):
        self.e, self.blk, self.off = engine, blk.flatten(), off.flatten()
        self.start = 0 if prefix_blk is None else prefix_blk.shape[1]
        self.prefix = (prefix_blk.flatten(), prefix_off.flatten()) if self.start else None
        if self.start:  # query i (position start + i) sees keys [0, start + i]
            T = blk.shape[1]
            keys = torch.arange(self.start + T, device=blk.device)
            self.mask = keys[None, :] <= self.start + torch.arange(T, device=blk.device)[:, None]

    def attend(self, layer, q, k, v):
        P, T, KVH, D = k.shape
        kc, vc = self.e.k_cache[layer], self.e.v_cache[layer]
        kc[self.blk, :, self.off] = k.reshape(P * T, KVH, D)
        vc[self.blk, :, self.off] = v.reshape(P * T, KVH, D)
        mask = None
        if self.start:
            pb, po = self.prefix
            k = torch.cat([kc[pb, :, po].view(P, self.start, KVH, D), k], dim=1)
            v = torch.cat([vc[pb, :, po].view(P, self.start, KVH, D), v], dim=1)
            mask = self.mask
        kt, vt = k.transpose(1, 2), v.transpose(1, 2)  # [P, KVH, keys, D]
        o = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), kt, vt, attn_mask=mask, is_causal=mask is None, enable_gqa=kt.shape[1] != q.shape[2])
        return o.transpose(1, 2)


class _Snapshot:
    """The done flags, generated lengths and finish codes of slots ``[0, max(slots)]`` as they are
    after the work queued so far, copied to pinned host memory behind that work (no host sync until
    :meth:`read`). ``slots`` are the occupied slots it is read for, ``admitted`` their admission
    numbers: a slot finished or re-admitted meanwhile is skipped."""

    __slots__ = ("slots", "admitted", "host", "event")

    def __init__(self, engine: "EmbeddedEngine", slots: list[int]):
        self.slots, self.admitted = slots, [engine._admitted[s] for s in slots]
        B = max(slots) + 1
        state = torch.stack([engine.done[:B].long(), engine.gen_lens[:B], engine.finish_code[:B].long()])
        self.event = None
        if state.device.type == "cuda":
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


class _DecodeCtx:
    """One new token per slot in ``[0, B)``: write its K/V at ``pos``, attend to keys ``[0, pos]``.

    ``Lk`` bounds the key range of the torch paths (a multiple of the block size); the Triton
    kernel reads each sequence's own length. Idle rows write into the sink block.
    """

    def __init__(self, engine: "EmbeddedEngine", B: int, Lk: int, pos: torch.Tensor, active: torch.Tensor):
        e = engine
        self.e, self.B, self.Lk = e, B, Lk
        bs = e.block_size
        page = (pos // bs).clamp(max=e.blocks_per_seq - 1)
        blk = e.block_table[:B].gather(1, page[:, None])[:, 0].long()
        self.w_blk = torch.where(active, blk, e.sink_block)
        self.w_off = pos % bs
        if e.use_kernel:
            self.lens = torch.where(active, pos + 1, 1)
        else:
            visible = e._arange[:Lk][None, :] <= pos[:, None]
            self.bias = torch.zeros(B, 1, 1, Lk, device=pos.device, dtype=torch.float32).masked_fill_(
                ~visible[:, None, None, :], float("-inf"))

    def attend(self, layer, q, k, v):
        e, B, Lk = self.e, self.B, self.Lk
        kc, vc = e.k_cache[layer], e.v_cache[layer]  # [blocks, KVH, BS, D]
        if e.use_kernel:  # writes the new K/V itself
            return paged_decode_attention_triton(q[:, 0], k[:, 0], v[:, 0], kc, vc, e.block_table, self.lens,
                                                 self.w_blk, self.w_off)[:, None]
        kc[self.w_blk, :, self.w_off] = k[:, 0]
        vc[self.w_blk, :, self.w_off] = v[:, 0]
        if e.blocks_per_seq == 1:  # block s belongs to slot s: views, no copy
            o = masked_decode_attention(q[:, 0], kc[:B, :, :Lk], vc[:B, :, :Lk], self.bias)
        else:
            nb = Lk // e.block_size
            table = e.block_table[:B]
            o = masked_decode_attention(q[:, 0], gather_blocks(kc, table, nb), gather_blocks(vc, table, nb), self.bias)
        return o[:, None]


class EmbeddedEngine:
    """Continuous-batching generation with :class:`CausalLM`; implements ``RolloutEngine``.

    Args:
        model: the engine's own copy of the policy, already in the inference dtype and on the
            target device (weight sync copies into it in place). On CUDA the engine turns on the
            model's fused inference kernels (``CausalLM.use_fused_kernels``, ``fused_residual_add``,
            ``fuse_projections``: its q/k/v and gate/up weights become views into fused matrices),
            so do not share this object with a trainer.
        config: sizing and scheduling (:class:`EngineConfig`).
        tokenizer: needed only for requests with stop strings.
    """

    def __init__(self, model: CausalLM, config: EngineConfig | None = None, tokenizer: Any = None):
        if not isinstance(model, CausalLM):
            raise TypeError("EmbeddedEngine needs a reinforge CausalLM; use HFEngine for other models")
        self.model = model.eval().requires_grad_(False)
        # Triton on this device: fused RMSNorm / RoPE in the model, the fused sampler, paged attention
        self._fused = self.model.use_fused_kernels(True)
        # and fewer kernels per layer: residual adds inside the norms, one matmul for q/k/v and one for gate/up
        self.model.fused_residual_add = self._fused
        self.model.fuse_projections(self._fused)
        self.config = config or EngineConfig()
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.weight_version = 0
        self.generator = torch.Generator(device=self.device).manual_seed(self.config.seed)
        # the fused sampler's Philox key: seed in the high 32 bits, decode steps in the low ones
        self._philox = torch.tensor([_philox_base(self.config.seed)], dtype=torch.long, device=self.device)
        self._graphs: dict[tuple[int, int, bool], Any] = {}
        self._graph_pool = None
        self._use_graphs = self.device.type == "cuda" and self.config.cuda_graph
        # launch the next decode steps before reading back the last ones (no gain without an
        # asynchronous device; tests turn it on on a CPU to exercise the same bookkeeping)
        self._overlap = self.device.type == "cuda" and self.config.overlap_schedule
        self._side_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._request_ids = itertools.count()
        self._waiting: collections.deque[_Pending] = collections.deque()
        self._allocated = False
        self._sleeping_weights_device: torch.device | None = None
        self._interrupted = False
        self._allocate()

    # ------------------------------------------------------------------ memory
    def _block_size(self) -> int:
        L, bs = self.config.max_model_len, self.config.kv_block_size
        if bs <= 0:
            bs = 16 if self._fused else L
        return min(bs, L)

    def _bytes_per_block(self, block_size: int) -> int:
        a = self.model.args
        elem = torch.tensor([], dtype=self.dtype).element_size()
        return 2 * a.num_layers * a.num_kv_heads * a.head_dim * block_size * elem

    def _pool_size(self, block_size: int, blocks_per_seq: int) -> tuple[int, int]:
        """(slots, blocks): ``max_num_seqs`` slots; blocks for all of them at ``max_model_len``,
        fewer on CUDA where ``kv_cache_memory_fraction`` of the free memory holds fewer."""
        slots = self.config.max_num_seqs
        blocks = slots * blocks_per_seq
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            fit = int(free * self.config.kv_cache_memory_fraction) // self._bytes_per_block(block_size) - 1
            if fit < blocks_per_seq:
                need = self._bytes_per_block(block_size) * blocks_per_seq
                raise MemoryError(
                    f"the KV cache for one sequence of max_model_len={self.config.max_model_len} needs "
                    f"{need / 2**20:.0f} MiB but only {free / 2**20:.0f} MiB are free: lower "
                    f"rollout.max_model_len or raise rollout.kv_cache_memory_fraction")
            blocks = min(blocks, fit)
        if self.config.num_kv_blocks:
            if self.config.num_kv_blocks < blocks_per_seq:
                raise ValueError(f"rollout.num_kv_blocks={self.config.num_kv_blocks} holds less than one sequence "
                                 f"of max_model_len={self.config.max_model_len} ({blocks_per_seq} blocks)")
            blocks = min(blocks, self.config.num_kv_blocks)
        if blocks_per_seq == 1:  # one block per slot
            slots = blocks
        return slots, blocks

    def _allocate(self) -> None:
        a, c = self.model.args, self.config
        L = c.max_model_len
        self.block_size = bs = self._block_size()
        self.blocks_per_seq = -(-L // bs)
        S, NB = self._pool_size(bs, self.blocks_per_seq)
        self.use_kernel = self._fused and self.blocks_per_seq > 1
        dev = self.device
        shape = (a.num_layers, NB + 1, a.num_kv_heads, bs, a.head_dim)  # + the sink block
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=dev)
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=dev)
        self.sink_block = NB
        self.allocator = BlockAllocator(NB, bs)
        self.block_table = torch.full((S, self.blocks_per_seq), NB, dtype=torch.int32, device=dev)
        self._blocks: list[list[int]] = [[] for _ in range(S)]
        self.num_slots = S
        self.num_preemptions = 0
        self.max_new_cap = L
        z = dict(device=dev)
        self._arange = torch.arange(max(S, L, bs * self.blocks_per_seq), **z)
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
        self._owner: list[tuple[_Pending, int] | None] = [None] * S
        self._admitted = [0] * S  # admission order of the slot's sequence (preemption picks the newest)
        self._admissions = itertools.count()
        self._len_bound = [0] * S  # host-side upper bound of seq_lens per occupied slot
        self._gen_bound = [0] * S  # host-side upper bound of gen_lens per occupied slot
        self._max_new_host = [0] * S  # the slot's max_new: at _gen_bound >= it, it is surely done
        self._pending: _Snapshot | None = None  # read-back of the last decode steps, not processed yet
        self._filters = [False] * S  # slot uses top-k / top-p
        self._allocated = True
        log.info("embedded engine: %d slots, KV cache of %d blocks x %d tokens (%.1f MiB)%s", S, NB, bs,
                 2 * self.k_cache.numel() * self.k_cache.element_size() / 2**20,
                 ", Triton paged attention" if self.use_kernel else "")

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
        self._waiting.append(_Pending(group, list(range(request.n)), list(request.prompt_ids)))
        return group

    def abort(self, request_id: Any) -> None:
        """Stop a queued or running request; its unfinished samples end with ``FinishReason.ABORT``."""
        for pend in list(self._waiting):
            if pend.group.request.request_id == request_id:
                self._waiting.remove(pend)
                for j in pend.samples:
                    pend.group.results[j] = GenerateResult(list(pend.carried_ids), list(pend.carried_logprobs),
                                                           FinishReason.ABORT, self.weight_version)
        def owned():
            return [s for s, o in enumerate(self._owner)
                    if o is not None and o[0].group.request.request_id == request_id]

        if owned():
            self._drain()  # samples that finished meanwhile end normally
            slots = owned()
            if slots:
                self._process(_Snapshot(self, slots), abort=True)

    def has_unfinished(self) -> bool:
        return bool(self._waiting) or any(o is not None for o in self._owner)

    def _occupied(self) -> list[int]:
        """Slots that hold a sequence (running, or finished and not read back yet)."""
        return [s for s, o in enumerate(self._owner) if o is not None]

    def reseed(self, seed: int) -> None:
        """Restart the sampling random stream (the loop reseeds per rollout: resumable runs)."""
        self.generator.manual_seed(seed)
        self._philox.fill_(_philox_base(seed))

    def step(self) -> None:
        """Admit waiting requests, give the running sequences the KV blocks of the next
        ``sync_interval`` tokens (preempting if the pool runs dry), launch the decode steps, and
        collect the finished sequences: those of this run, or with ``overlap_schedule`` those of
        the previous run (read back while this one decodes)."""
        self._admit()
        steps = self.config.sync_interval
        live = [s for s in self._occupied() if self._gen_bound[s] < self._max_new_host[s]]
        running = self._grow(live, steps)
        if running:
            B = _bucket(max(running) + 1, self.num_slots)
            Lk = 0  # the kernel reads each sequence's own length; the torch paths need a key range
            if not self.use_kernel:
                Lk = _bucket(max(self._len_bound[s] for s in running) + steps,
                             self.block_size * self.blocks_per_seq, quantum=64)
                if self.blocks_per_seq > 1:  # whole blocks are gathered
                    Lk = -(-Lk // self.block_size) * self.block_size
            filters = any(self._filters[s] for s in running)
            for _ in range(steps):
                self._decode_step(B, Lk, filters)
            for s in running:
                self._len_bound[s] += steps
                self._gen_bound[s] += steps
        owned = self._occupied()
        previous, self._pending = self._pending, _Snapshot(self, owned) if owned else None
        if previous is not None:
            self._process(previous)
        if self._pending is not None and not (running and self._overlap):
            snap, self._pending = self._pending, None
            self._process(snap)

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
        self._pending = None
        self._graphs.clear()  # they point into the buffers freed below
        self._graph_pool = None
        for name in ("k_cache", "v_cache", "block_table", "out_tokens", "out_logprobs"):
            setattr(self, name, None)
        if offload_weights and self.device.type != "cpu":
            self._sleeping_weights_device = self.device
            self.model.fuse_projections(False)  # .to copies each view on its own: drop the fused matrices
            self.model.to("cpu")
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def wake_up(self) -> None:
        if self._sleeping_weights_device is not None:
            self.model.to(self._sleeping_weights_device)
            self.model.fuse_projections(self._fused)
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
    def _prompt_blocks(self, prompt_len: int, n: int) -> int:
        """Blocks ``n`` samples of a prompt take at admission: its full blocks once, its last
        partial block once per sample."""
        bs = self.block_size
        return prompt_len // bs + n * (prompt_len % bs != 0)

    def _admissible(self) -> list[_Pending]:
        """Pop the waiting entries admitted now: slots free for all their samples, the padded
        prefill within ``max_prefill_tokens``, and blocks for their prompts with one interval of
        growth left for every running sequence (anything fits when nothing runs: progress)."""
        chosen: list[_Pending] = []
        budget, longest = self.config.max_prefill_tokens, 0
        free_slots, free_blocks = len(self._free), self.allocator.num_free
        running = sum(o is not None for o in self._owner)
        growth = self.allocator.blocks_for(self.config.sync_interval)
        paged = self.blocks_per_seq > 1
        while self._waiting:
            pend = self._waiting[0]
            n, P = len(pend.samples), len(pend.prompt_ids)
            longest_if = max(longest, P)
            if n > free_slots or (chosen and longest_if * (len(chosen) + 1) > budget):
                break
            if paged:
                need = self._prompt_blocks(P, n)
                if need + (running + n) * growth > free_blocks and (running or chosen):
                    break
                while need > free_blocks and n > 1:  # alone and too big: admit fewer of its samples
                    n -= 1
                    need = self._prompt_blocks(P, n)
                if need > free_blocks:
                    break
                if n < len(pend.samples):
                    rest = _Pending(pend.group, pend.samples[n:], pend.prompt_ids)
                    pend.samples = pend.samples[:n]
                    self._waiting.insert(1, rest)
                free_blocks -= need
            self._waiting.popleft()
            chosen.append(pend)
            longest = longest_if
            free_slots -= n
            running += n
        return chosen

    def _take_blocks(self, pend: _Pending) -> None:
        """Slots and blocks for the samples of an admitted entry: shared full prompt blocks, one
        own block each for the prompt's partial last block; sample 0's blocks get the prefill."""
        P, bs = len(pend.prompt_ids), self.block_size
        pend.slots = [heapq.heappop(self._free) for _ in pend.samples]
        if self.blocks_per_seq == 1:  # block s belongs to slot s
            for s in pend.slots:
                self._blocks[s] = [s]
            return
        shared = self.allocator.allocate(P // bs)
        for k, s in enumerate(pend.slots):
            own = self.allocator.allocate(1) if P % bs else []
            self._blocks[s] = (shared if k == 0 else self.allocator.share(shared)) + own

    def _h2d(self, values: Any, dtype: torch.dtype = torch.long) -> torch.Tensor:
        """A host list (or CPU tensor) on the engine's device. On CUDA through pinned memory with a
        non-blocking copy: a plain copy from pageable memory waits for all queued GPU work, which
        would stall the overlap scheduler (the caching host allocator keeps the pinned buffer alive
        until the copy is done)."""
        t = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
        if self.device.type != "cuda":
            return t.to(self.device)
        return t.pin_memory().to(self.device, non_blocking=True)

    def _set_table_rows(self, slots: list[int]) -> None:
        """Copy the host block lists of ``slots`` into the device block table (sink elsewhere)."""
        w, sink = self.blocks_per_seq, self.sink_block
        rows = torch.tensor([self._blocks[s] + [sink] * (w - len(self._blocks[s])) for s in slots], dtype=torch.int32)
        self.block_table[self._h2d(slots)] = self._h2d(rows)

    @torch.no_grad()
    def _admit(self) -> None:
        chosen = self._admissible()
        if not chosen:
            return
        dev, bs = self.device, self.block_size
        P, T = len(chosen), max(len(p.prompt_ids) for p in chosen)
        ids = torch.zeros(P, T, dtype=torch.long)
        lens = torch.tensor([len(p.prompt_ids) for p in chosen])
        blk = torch.full((P, T), self.sink_block, dtype=torch.long)
        for i, pend in enumerate(chosen):
            ids[i, : lens[i]] = torch.tensor(pend.prompt_ids)
            self._take_blocks(pend)
            b0 = self._blocks[pend.slots[0]]
            span = min(T, len(b0) * bs)
            blk[i, :span] = torch.tensor(b0).repeat_interleave(bs)[:span]
            for k, s in enumerate(pend.slots):
                self._owner[s] = (pend, k)
                self._admitted[s] = next(self._admissions)
                self._len_bound[s] = int(lens[i])
                self._gen_bound[s] = 1  # the token sampled from the prefill
                self._max_new_host[s] = pend.max_new_tokens
                p = pend.group.request.params
                self._filters[s] = p.top_k > 0 or p.top_p < 1.0
        slots = [s for p in chosen for s in p.slots]
        self._set_table_rows(slots)
        ids, lens_d, blk = self._h2d(ids), self._h2d(lens), self._h2d(blk)
        off = (torch.arange(T, device=dev) % bs).expand(P, T)
        # chunked prefill: a batch over max_prefill_tokens (one prompt longer than the budget) runs
        # in chunks of columns, each attending to the K/V the earlier chunks cached
        width = max(1, self.config.max_prefill_tokens // P)
        last = None
        for a in range(0, T, width):
            b = min(T, a + width)
            ctx = _PrefillCtx(self, blk[:, a:b], off[:, a:b], blk[:, :a] if a else None, off[:, :a] if a else None)
            pos = torch.arange(a, b, device=dev).expand(P, b - a)
            hidden = self.model.forward_hidden(ids[:, a:b], pos, ctx)
            here = hidden[torch.arange(P, device=dev), (lens_d - 1 - a).clamp(0, b - a - 1)]
            ends = ((lens_d - 1 >= a) & (lens_d - 1 < b))[:, None]
            last = here if last is None else torch.where(ends, here, last)
        logits = self.model.lm_head(last).float()
        # prefix sharing: the other samples get a copy of the prompt's last, partial block
        pairs = [(self._blocks[p.slots[0]][-1], self._blocks[s][-1]) for p in chosen if len(p.prompt_ids) % bs
                 for s in p.slots[1:]]
        if pairs:
            src = self._h2d([a for a, _ in pairs])
            dst = self._h2d([b for _, b in pairs])
            r = min(T, bs)
            self.k_cache[:, dst, :, :r] = self.k_cache[:, src, :, :r]
            self.v_cache[:, dst, :, :r] = self.v_cache[:, src, :, :r]
        # per-slot state
        reps = self._h2d([len(p.slots) for p in chosen])
        params = [p.group.request.params for p in chosen for _ in p.slots]
        slot_t = self._h2d(slots)

        def put(buf, values, dtype):
            buf[slot_t] = self._h2d(values, dtype)

        put(self.seq_lens, [len(p.prompt_ids) for p in chosen for _ in p.slots], torch.long)
        put(self.max_new, [p.max_new_tokens for p in chosen for _ in p.slots], torch.long)
        put(self.temperature, [p.temperature for p in params], torch.float32)
        put(self.top_k, [p.top_k for p in params], torch.long)
        put(self.top_p, [p.top_p for p in params], torch.float32)
        stop = torch.full((len(slots), MAX_STOP_IDS), -1, dtype=torch.long)
        for i, p in enumerate(params):
            if not p.ignore_eos and p.stop_token_ids:
                stop[i, : len(p.stop_token_ids)] = torch.tensor(p.stop_token_ids)
        self.stop_ids[slot_t] = self._h2d(stop)
        filt = any(self._filters[s] for s in slots)
        rep_logits = logits.repeat_interleave(reps, dim=0, output_size=len(slots))  # (no host sync)
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

    def _grow(self, running: list[int], steps: int) -> list[int]:
        """Give each running slot the blocks its next ``steps`` tokens need, oldest sequences
        first; when the pool runs dry, preempt the newest. Returns the slots still running."""
        if self.blocks_per_seq == 1 or not running:
            return running

        def need(s: int) -> int:
            want = min(self.allocator.blocks_for(self._len_bound[s] + steps), self.blocks_per_seq)
            return want - len(self._blocks[s])

        if sum(max(0, need(s)) for s in running) > self.allocator.num_free:
            # preemption reads a running sequence's state: finish what has finished first (frees blocks)
            self._drain()
            running = [s for s in running if self._owner[s] is not None]
        order = collections.deque(sorted(running, key=lambda s: self._admitted[s]))
        kept, changed = [], []
        while order:
            s = order.popleft()
            need_s = need(s)
            while need_s > self.allocator.num_free and order:
                self._preempt(order.pop())
            if need_s > self.allocator.num_free:
                self._preempt(s)
                continue
            if need_s > 0:
                self._blocks[s] += self.allocator.allocate(need_s)
                changed.append(s)
            kept.append(s)
        if changed:
            self._set_table_rows(changed)
        return sorted(kept)

    def _preempt(self, slot: int) -> None:
        """Free a running sequence's slot and blocks and queue it first, to be prefilled again
        with its prompt and the tokens it has so far (recompute preemption). Call after
        :meth:`_drain` (it reads the sequence's device state)."""
        pend, k = self._owner[slot]
        n = int(self.gen_lens[slot])
        ids = pend.carried_ids + self.out_tokens[slot, :n].tolist()
        lps = pend.carried_logprobs + self.out_logprobs[slot, :n].tolist()
        again = _Pending(pend.group, [pend.samples[k]], list(pend.group.request.prompt_ids) + ids, ids, lps)
        self._release([slot])
        self._waiting.appendleft(again)
        self.num_preemptions += 1
        log.debug("preempted slot %d after %d tokens (%d free blocks)", slot, len(ids), self.allocator.num_free)

    def _release(self, slots: list[int]) -> None:
        """Slots and their blocks back to the pools; the slots' rows become idle."""
        for s in slots:
            if self.blocks_per_seq > 1:
                self.allocator.free(self._blocks[s])
            self._blocks[s] = []
            self._owner[s] = None
            heapq.heappush(self._free, s)
        idx = self._h2d(slots)
        self.done[idx] = True
        self.block_table[idx] = self.sink_block

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
        active = ~self.done[:B]
        ctx = _DecodeCtx(self, B, Lk, pos, active)
        hidden = self.model.forward_hidden(self.last_token[:B, None], pos[:, None], ctx)
        logits = self.model.lm_head(hidden[:, 0])
        if self._fused and not filters:
            tok, lp = sample_tokens_fused(logits, self.temperature[:B], self._philox)
            self._philox += 1
        else:
            tok, lp = sample_tokens(logits.float(), self.temperature[:B], self.top_k[:B] if filters else None,
                                    self.top_p[:B] if filters else None, self.generator)
        rows = self._arange[:B]
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

    def _drain(self) -> None:
        """Process every outstanding read-back now (waits for the queued decode steps): afterwards
        no occupied slot holds a finished sequence and the device state is current."""
        owned = self._occupied()
        previous, self._pending = self._pending, None
        if previous is not None:
            self._process(previous)
        if owned:
            self._process(_Snapshot(self, owned))

    def _read_outputs(self, slots: list[int], width: int) -> tuple[list[list[int]], list[list[float]]]:
        """The first ``width`` output tokens and log-probs of ``slots`` (host lists). On CUDA on a side
        stream: the decode steps queued meanwhile on the main stream leave these entries unchanged
        (finished rows are idle; running rows write past their read lengths), so the read need not
        wait for them."""
        side = torch.cuda.stream(self._side_stream) if self._side_stream is not None else contextlib.nullcontext()
        with side:
            idx = self._h2d(slots)
            toks, lps = self.out_tokens[idx, :width].cpu(), self.out_logprobs[idx, :width].cpu()
        return toks.tolist(), lps.tolist()

    def _process(self, snap: _Snapshot, abort: bool = False) -> None:
        """Finish the slots that ``snap`` shows done (all of its slots with ``abort``), and those whose
        text now contains a stop string; hand back their results and free them. Slots finished or
        re-admitted since the snapshot are skipped. Waits for the snapshot's copy (and only for it)."""
        done, lens, codes = snap.read()
        finished, check = [], []
        for s, admitted in zip(snap.slots, snap.admitted):
            owner = self._owner[s]
            if owner is None or self._admitted[s] != admitted:
                continue
            if done[s] or abort:
                finished.append(s)
            elif owner[0].group.request.params.stop:
                check.append(s)
        rows, check = finished + check, set(check)
        if not rows:
            return
        toks, lps = self._read_outputs(rows, max(lens[s] for s in rows))
        ended = []
        for i, s in enumerate(rows):
            pend, k = self._owner[s]
            n, code = lens[s], codes[s]
            if s in check:  # still running: did it just complete a stop string?
                carried = pend.carried_ids
                cut = _stop_string_cut(self.tokenizer, carried + toks[i][:n], pend.group.request.params.stop)
                if cut is None:
                    continue
                n, code = max(cut - len(carried), 0), _STOP
            if code == _STOP:
                reason = FinishReason.STOP
            elif code == _LENGTH:
                reason = FinishReason.LENGTH
            else:
                reason = FinishReason.ABORT if abort else FinishReason.LENGTH
            t, lp = pend.carried_ids + toks[i][:n], pend.carried_logprobs + lps[i][:n]
            params = pend.group.request.params
            if params.stop and reason == FinishReason.STOP:
                cut = _stop_string_cut(self.tokenizer, t, params.stop)
                if cut is not None:
                    t, lp = t[:cut], lp[:cut]
            pend.group.results[pend.samples[k]] = GenerateResult(t, lp, reason, self.weight_version)
            ended.append(s)
        if ended:
            self._release(ended)


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


def _philox_base(seed: int) -> int:
    """The fused sampler's first Philox key for ``seed`` (decode steps count up from it)."""
    return (seed & 0x7FFFFFFF) << 32


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
