"""The engine's scheduler: host-only decisions about which sequences run, where, and with which blocks.

It never touches a device tensor. It keeps the waiting queue, the slot of every running sequence
(its owner, admission number and upper bounds of its lengths), each slot's KV blocks and the block
allocator, and decides:

* **admission** (:meth:`Scheduler.admissible`): waiting entries in order while slots are free for
  all their samples, the padded prefill stays within ``max_prefill_tokens`` and (paged) their prompt
  blocks fit with one interval of growth left for every running sequence;
* **block grants** (:meth:`Scheduler.grow`): the blocks each running sequence fills in the next
  ``sync_interval`` steps, oldest sequences first;
* **preemption choice**: when the pool runs dry the newest sequence gives its slot and blocks back
  and is queued first, to be prefilled again with its prompt plus the tokens it has so far (vLLM's
  recompute preemption; :meth:`Scheduler.requeue`).

The engine (:mod:`.engine`) carries the decisions out on the device through the runner (:mod:`.runner`).
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
from collections.abc import Callable
from typing import Any

from ..records import GenerateRequest, GenerateResult
from .kv_cache import BlockAllocator, KVLayout

log = logging.getLogger(__name__)


class Group:
    """A request and the results of its ``n`` samples (filled in as they finish)."""

    __slots__ = ("request", "results")

    def __init__(self, request: GenerateRequest):
        self.request = request
        self.results: list[GenerateResult | None] = [None] * request.n


class Pending:
    """Samples of a request waiting to be prefilled together: all ``n`` of a new request, or one
    preempted sample, whose prompt then ends with the tokens it had generated (``carried``; with
    their recorded expert routes [len(carried_ids), num_moe_layers, k] when the engine records them:
    the recomputed prefill records only the route of its last position, for the next token)."""

    __slots__ = ("group", "samples", "prompt_ids", "carried_ids", "carried_logprobs", "carried_routes", "slots")

    def __init__(
        self,
        group: Group,
        samples: list[int],
        prompt_ids: list[int],
        carried_ids: list[int] | None = None,
        carried_logprobs: list[float] | None = None,
        carried_routes: Any = None,
    ):
        self.group, self.samples, self.prompt_ids = group, samples, prompt_ids
        self.carried_ids: list[int] = carried_ids or []
        self.carried_logprobs: list[float] = carried_logprobs or []
        self.carried_routes = carried_routes
        self.slots: list[int] = []

    @property
    def max_new_tokens(self) -> int:
        return self.group.request.params.max_new_tokens - len(self.carried_ids)


class Scheduler:
    """Slots, blocks and the waiting queue of one engine (see the module docstring).

    Per occupied slot ``s``: ``owner[s]`` = (pending entry, index of the sample in it);
    ``admitted[s]`` its admission number (preemption picks the highest, a snapshot entry is valid
    only while it is unchanged); ``len_bound[s]`` / ``gen_bound[s]`` upper bounds of its total and
    generated lengths (exact without overlap scheduling; with it, the device may have stopped the
    sequence earlier); ``max_new[s]`` its token budget (at ``gen_bound >= max_new`` it is surely
    done); ``filters[s]`` whether it samples with top-k / top-p.
    """

    def __init__(self, layout: KVLayout, max_prefill_tokens: int, sync_interval: int):
        S = layout.num_slots
        self.layout = layout
        self.max_prefill_tokens, self.sync_interval = max_prefill_tokens, sync_interval
        self.allocator = BlockAllocator(layout.num_blocks, layout.block_size)
        self.waiting: collections.deque[Pending] = collections.deque()
        self.blocks: list[list[int]] = [[] for _ in range(S)]
        self.free = list(range(S))
        heapq.heapify(self.free)
        self.owner: list[tuple[Pending, int] | None] = [None] * S
        self.admitted = [0] * S
        self._admissions = itertools.count()
        self.len_bound = [0] * S
        self.gen_bound = [0] * S
        self.max_new = [0] * S
        self.filters = [False] * S
        self.num_preemptions = 0

    # ------------------------------------------------------------------ queries
    def has_unfinished(self) -> bool:
        return bool(self.waiting) or any(o is not None for o in self.owner)

    def occupied(self) -> list[int]:
        """Slots that hold a sequence (running, or finished and not read back yet)."""
        return [s for s, o in enumerate(self.owner) if o is not None]

    def live(self) -> list[int]:
        """Occupied slots whose sequence may still be running (not surely at its token budget)."""
        return [s for s in self.occupied() if self.gen_bound[s] < self.max_new[s]]

    def request_slots(self, request_ids: set) -> list[int]:
        """Occupied slots of the requests ``request_ids``."""
        return [s for s, o in enumerate(self.owner) if o is not None and o[0].group.request.request_id in request_ids]

    def table_rows(self, slots: list[int]) -> list[list[int]]:
        """Block-table rows of ``slots``: their blocks, then the sink block."""
        w, sink = self.layout.blocks_per_seq, self.layout.sink_block
        return [self.blocks[s] + [sink] * (w - len(self.blocks[s])) for s in slots]

    # ------------------------------------------------------------------ admission
    def _prompt_blocks(self, prompt_len: int, n: int) -> int:
        """Blocks ``n`` samples of a prompt take at admission: its full blocks once, its last
        partial block once per sample."""
        bs = self.layout.block_size
        return prompt_len // bs + n * (prompt_len % bs != 0)

    def admissible(self) -> list[Pending]:
        """Pop the waiting entries admitted now: slots free for all their samples, the padded
        prefill within ``max_prefill_tokens``, and blocks for their prompts with one interval of
        growth left for every running sequence (anything fits when nothing runs: progress). An entry
        too big for the free blocks on its own is split: fewer of its samples are admitted."""
        chosen: list[Pending] = []
        budget, longest = self.max_prefill_tokens, 0
        free_slots, free_blocks = len(self.free), self.allocator.num_free
        running = sum(o is not None for o in self.owner)
        growth = self.allocator.blocks_for(self.sync_interval)
        while self.waiting:
            pend = self.waiting[0]
            n, P = len(pend.samples), len(pend.prompt_ids)
            longest_if = max(longest, P)
            if n > free_slots or (chosen and longest_if * (len(chosen) + 1) > budget):
                break
            if self.layout.paged:
                need = self._prompt_blocks(P, n)
                if need + (running + n) * growth > free_blocks and (running or chosen):
                    break
                while need > free_blocks and n > 1:  # alone and too big: admit fewer of its samples
                    n -= 1
                    need = self._prompt_blocks(P, n)
                if need > free_blocks:
                    break
                if n < len(pend.samples):
                    rest = Pending(pend.group, pend.samples[n:], pend.prompt_ids)
                    pend.samples = pend.samples[:n]
                    self.waiting.insert(1, rest)
                free_blocks -= need
            self.waiting.popleft()
            chosen.append(pend)
            longest = longest_if
            free_slots -= n
            running += n
        return chosen

    def place(self, pend: Pending) -> None:
        """Slots and blocks for the samples of an admitted entry (``pend.slots``): shared full prompt
        blocks, one own block each for the prompt's partial last block (sample 0's blocks get the
        prefill); each slot's bookkeeping starts with the token sampled from the prefill."""
        P, bs = len(pend.prompt_ids), self.layout.block_size
        pend.slots = [heapq.heappop(self.free) for _ in pend.samples]
        if not self.layout.paged:  # block s belongs to slot s
            for s in pend.slots:
                self.blocks[s] = [s]
        else:
            shared = self.allocator.allocate(P // bs)
            for k, s in enumerate(pend.slots):
                own = self.allocator.allocate(1) if P % bs else []
                self.blocks[s] = (shared if k == 0 else self.allocator.share(shared)) + own
        params = pend.group.request.params
        for k, s in enumerate(pend.slots):
            self.owner[s] = (pend, k)
            self.admitted[s] = next(self._admissions)
            self.len_bound[s] = P
            self.gen_bound[s] = 1  # the token sampled from the prefill
            self.max_new[s] = pend.max_new_tokens
            self.filters[s] = params.top_k > 0 or params.top_p < 1.0

    # ------------------------------------------------------------------ growth and preemption
    def _need(self, s: int, steps: int) -> int:
        want = min(self.allocator.blocks_for(self.len_bound[s] + steps), self.layout.blocks_per_seq)
        return want - len(self.blocks[s])

    def short_of_blocks(self, running: list[int], steps: int) -> bool:
        """Whether the next ``steps`` tokens of ``running`` need more blocks than are free."""
        if not self.layout.paged:
            return False
        return sum(max(0, self._need(s, steps)) for s in running) > self.allocator.num_free

    def grow(self, running: list[int], steps: int, preempt: Callable[[int], None]) -> tuple[list[int], list[int]]:
        """Give each running slot the blocks its next ``steps`` tokens need, oldest sequences first;
        when the pool runs dry, ``preempt(slot)`` the newest (it must call :meth:`requeue`).

        Returns:
            (slots still running, sorted; slots whose block lists changed).
        """
        if not self.layout.paged or not running:
            return running, []
        order = collections.deque(sorted(running, key=lambda s: self.admitted[s]))
        kept, changed = [], []
        while order:
            s = order.popleft()
            need_s = self._need(s, steps)
            while need_s > self.allocator.num_free and order:
                preempt(order.pop())
            if need_s > self.allocator.num_free:
                preempt(s)
                continue
            if need_s > 0:
                self.blocks[s] += self.allocator.allocate(need_s)
                changed.append(s)
            kept.append(s)
        return sorted(kept), changed

    def advance(self, running: list[int], steps: int) -> None:
        """``steps`` decode steps were launched for ``running``."""
        for s in running:
            self.len_bound[s] += steps
            self.gen_bound[s] += steps

    def requeue(self, slot: int, token_ids: list[int], log_probs: list[float], routes: Any = None) -> None:
        """Preempt ``slot``'s sequence, which has generated ``token_ids`` (with ``log_probs``) since
        its admission: free its slot and blocks and queue it first, its prompt extended by them.
        ``routes``: the recorded expert routes of all its tokens so far, carried ones included (the
        engine's, opaque here), or None."""
        owner = self.owner[slot]
        assert owner is not None, f"slot {slot} holds no sequence"
        pend, k = owner
        ids, lps = pend.carried_ids + token_ids, pend.carried_logprobs + log_probs
        again = Pending(pend.group, [pend.samples[k]], list(pend.group.request.prompt_ids) + ids, ids, lps, routes)
        self.release([slot])
        self.waiting.appendleft(again)
        self.num_preemptions += 1
        log.debug("preempted slot %d after %d tokens (%d free blocks)", slot, len(ids), self.allocator.num_free)

    def release(self, slots: list[int]) -> None:
        """Slots and their blocks back to the pools."""
        for s in slots:
            if self.layout.paged:
                self.allocator.free(self.blocks[s])
            self.blocks[s] = []
            self.owner[s] = None
            heapq.heappush(self.free, s)
