"""The engine's host-only scheduler (reinforge/engine/scheduler.py) without a model or a device:
admission (slots, the prefill budget, prompt blocks with room to grow, splitting), block accounting
(shared prompt blocks, own partial blocks, the sink), growth with preemption and requeueing (the
sequence comes back first, its prompt extended by what it had generated), and finishing (slots and
blocks back to their pools). A fake decode loop drives it to the end and checks that every block is
accounted for after every step and that preempted samples finish with the tokens they would have had."""

import pytest

from reinforge.engine.kv_cache import KVLayout
from reinforge.engine.scheduler import Group, Pending, Scheduler
from reinforge.records import FinishReason, GenerateRequest, GenerateResult, SamplingParams


def request(prompt_len: int, n: int = 1, max_new: int = 8, rid: int = 0, **params) -> GenerateRequest:
    return GenerateRequest(list(range(prompt_len)), SamplingParams(max_new_tokens=max_new, **params), n, rid)


def enqueue(sched: Scheduler, *requests: GenerateRequest) -> list[Group]:
    groups = [Group(r) for r in requests]
    for g in groups:
        sched.waiting.append(Pending(g, list(range(g.request.n)), list(g.request.prompt_ids)))
    return groups


def paged(num_blocks: int, slots: int = 4, block_size: int = 4, blocks_per_seq: int = 8, **kw) -> Scheduler:
    return Scheduler(
        KVLayout(block_size, blocks_per_seq, slots, num_blocks), kw.get("budget", 1 << 20), kw.get("sync", 2)
    )


def held(sched: Scheduler) -> int:
    return sched.allocator.num_blocks - sched.allocator.num_free


# ----------------------------------------------------------------------------- admission


def test_admission_waits_for_free_slots_for_every_sample():
    sched = Scheduler(KVLayout(16, 1, 4, 4), 1 << 20, 2)  # the one-block layout: block s is slot s's
    enqueue(sched, request(5, n=3, rid="a"), request(5, n=2, rid="b"))
    (first,) = sched.admissible()
    assert first.group.request.request_id == "a" and len(sched.waiting) == 1
    sched.place(first)
    assert first.slots == [0, 1, 2] and [sched.blocks[s] for s in first.slots] == [[0], [1], [2]]
    assert sched.admissible() == []  # b needs 2 slots, 1 is free: it waits, never split over slots
    sched.release(first.slots)
    assert [p.group.request.request_id for p in sched.admissible()] == ["b"]


def test_admission_keeps_the_padded_prefill_within_its_budget():
    sched = paged(64, budget=10)
    enqueue(sched, request(6, rid="a"), request(3, rid="b"))
    assert [p.group.request.request_id for p in sched.admissible()] == ["a"]  # 2 rows x 6 > 10
    sched = paged(64, budget=10)
    enqueue(sched, request(4, rid="a"), request(5, rid="b"), request(1, rid="c"))
    assert [p.group.request.request_id for p in sched.admissible()] == ["a", "b"]  # 2 x 5 = 10; 3 x 5 > 10
    sched = paged(64, budget=3)
    enqueue(sched, request(9, rid="long"))
    assert len(sched.admissible()) == 1  # alone, a prompt over the budget still runs (progress)


def test_admission_leaves_one_interval_of_growth_for_every_running_sequence():
    sched = paged(6, sync=2)  # growth = blocks for 2 tokens = 1 block per sequence
    enqueue(sched, request(6, n=2, rid="a"), request(4, rid="b"))
    (a,) = sched.admissible()  # b: 1 prompt block + 3 sequences x 1 > 6 - 3 free
    sched.place(a)
    assert held(sched) == 3 and len(sched.waiting) == 1
    assert sched.admissible() == []
    sched.release(a.slots)
    assert held(sched) == 0 and len(sched.admissible()) == 1


def test_an_entry_too_big_for_the_free_blocks_alone_is_split():
    sched = paged(3)
    enqueue(sched, request(6, n=4, rid="a"), request(2, rid="b"))
    (first,) = sched.admissible()  # 1 shared + 1 own block each: 2 samples fit in 3 blocks
    assert first.samples == [0, 1]
    rest = sched.waiting[0]
    assert rest.group is first.group and rest.samples == [2, 3] and sched.waiting[1].group.request.request_id == "b"
    sched.place(first)
    assert sched.allocator.num_free == 0 and sched.admissible() == []


# ----------------------------------------------------------------------------- blocks


def test_samples_share_full_prompt_blocks_and_own_their_partial_last_block():
    sched = paged(16, slots=4, block_size=4, blocks_per_seq=8)
    enqueue(sched, request(10, n=3, top_p=0.9))  # 2 full blocks + 2 tokens
    (pend,) = sched.admissible()
    sched.place(pend)
    rows = [sched.blocks[s] for s in pend.slots]
    assert rows[0][:2] == rows[1][:2] == rows[2][:2]  # the full prompt blocks, prefilled once
    assert len({r[2] for r in rows}) == 3  # the partial block: one each
    assert held(sched) == 2 + 3
    assert all(sched.len_bound[s] == 10 and sched.gen_bound[s] == 1 and sched.max_new[s] == 8 for s in pend.slots)
    assert all(sched.filters[s] for s in pend.slots)
    assert sched.table_rows(pend.slots[:1]) == [rows[0] + [sched.layout.sink_block] * 5]
    sched.release(pend.slots[:2])
    assert held(sched) == 2 + 1  # the shared blocks stay while one sample holds them
    sched.release(pend.slots[2:])
    assert held(sched) == 0 and sorted(sched.free) == [0, 1, 2, 3] and not sched.has_unfinished()


def test_grow_gives_blocks_oldest_first_and_preempts_the_newest_when_dry():
    sched = paged(4, slots=2, block_size=4, blocks_per_seq=4)
    enqueue(sched, request(4, rid="old"), request(4, rid="new"))
    chosen = sched.admissible()
    for p in chosen:
        sched.place(p)
    old, new = chosen[0].slots[0], chosen[1].slots[0]
    generated = {old: [100], new: [200]}  # the token sampled from each prefill

    def preempt(slot):
        sched.requeue(slot, generated[slot], [-0.5] * len(generated[slot]))

    running, changed = sched.grow([old, new], 2, preempt)  # 4 + 2 tokens: one more block each
    assert running == sorted([old, new]) and sorted(changed) == sorted([old, new]) and sched.allocator.num_free == 0
    sched.advance(running, 2)
    generated[old] += [101, 102]
    generated[new] += [201, 202]
    assert sched.grow(running, 2, preempt) == (running, [])  # 8 tokens: still two blocks
    sched.advance(running, 2)
    generated[old] += [103, 104]
    generated[new] += [204, 205]
    running, changed = sched.grow(running, 2, preempt)  # 10 tokens need a third block: none free
    assert running == [old] and changed == [old] and sched.num_preemptions == 1
    assert sched.owner[new] is None and sched.blocks[new] == [] and new in sched.free
    again = sched.waiting[0]  # first in the queue, its prompt extended by its tokens
    assert again.group.request.request_id == "new" and again.samples == [0]
    assert again.prompt_ids == [0, 1, 2, 3, 200, 201, 202, 204, 205]
    assert again.carried_ids == [200, 201, 202, 204, 205] and again.carried_logprobs == [-0.5] * 5
    assert again.max_new_tokens == 8 - 5


def test_a_lone_sequence_without_blocks_preempts_itself():
    sched = paged(2, slots=1, block_size=4, blocks_per_seq=4)
    enqueue(sched, request(8))
    (p,) = sched.admissible()
    sched.place(p)
    (slot,) = p.slots
    running, changed = sched.grow([slot], 2, lambda s: sched.requeue(s, [7], [0.0]))
    assert running == [] and changed == [] and held(sched) == 0 and sched.waiting[0].carried_ids == [7]


def test_the_one_block_layout_never_runs_short():
    sched = Scheduler(KVLayout(64, 1, 2, 2), 1 << 20, 4)
    enqueue(sched, request(60))
    (p,) = sched.admissible()
    sched.place(p)
    assert not sched.short_of_blocks(p.slots, 100)
    assert sched.grow(p.slots, 100, lambda s: pytest.fail("preempted")) == (p.slots, [])


# ----------------------------------------------------------------------------- a fake decode loop


def token(rid: int, sample: int, position: int) -> int:
    return rid * 1000 + sample * 100 + position


def drive(sched: Scheduler, requests: list[GenerateRequest], steps: int) -> list[Group]:
    """Run ``requests`` to their ``max_new_tokens`` as the engine would, with a fake decode that
    writes token ``token(request, sample, position)``; checks the block accounting after each step."""
    groups = enqueue(sched, *requests)
    generated: dict[int, list[int]] = {}  # slot -> tokens since its admission
    prompt_len: dict[int, int] = {}

    def preempt(slot):
        sched.requeue(slot, generated.pop(slot), [0.0] * sched.gen_bound[slot])

    def next_token(slot):
        pend, k = sched.owner[slot]
        return token(pend.group.request.request_id, pend.samples[k], len(pend.carried_ids) + len(generated[slot]))

    for _ in range(10_000):
        if not sched.has_unfinished():
            break
        for pend in sched.admissible():
            sched.place(pend)
            for s in pend.slots:
                generated[s], prompt_len[s] = [], len(pend.prompt_ids)
                generated[s].append(next_token(s))  # sampled from the prefill
        running, _ = sched.grow(sched.live(), steps, preempt)
        bs, cap = sched.layout.block_size, sched.layout.blocks_per_seq
        for s in running:  # blocks for the tokens about to be written
            assert len(sched.blocks[s]) >= min(sched.allocator.blocks_for(sched.len_bound[s] + steps), cap)
        for s in running:
            for _ in range(min(steps, sched.max_new[s] - len(generated[s]))):
                generated[s].append(next_token(s))
        sched.advance(running, steps)
        done = [s for s in sched.occupied() if sched.gen_bound[s] >= sched.max_new[s]]
        for s in done:
            pend, k = sched.owner[s]
            ids = pend.carried_ids + generated.pop(s)
            pend.group.results[pend.samples[k]] = GenerateResult(ids, [0.0] * len(ids), FinishReason.LENGTH)
        sched.release(done)
        # every block is free or held; blocks past a slot's shared prompt blocks are its own
        occupied = sched.occupied()
        refs = {}
        for s in occupied:
            for b in sched.blocks[s]:
                refs[b] = refs.get(b, 0) + 1
        assert len(refs) + sched.allocator.num_free == sched.allocator.num_blocks
        assert all(sched.allocator._refs[b] == n for b, n in refs.items())
        for s in occupied:
            own = sched.blocks[s][prompt_len[s] // bs :]
            assert not any(b in sched.blocks[t] for t in occupied if t != s for b in own)
    else:
        pytest.fail("the loop did not finish")
    assert held(sched) == 0 and sorted(sched.free) == list(range(sched.layout.num_slots))
    return groups


@pytest.mark.parametrize("num_blocks,preempted", [(64, False), (9, True)])
def test_every_sample_finishes_with_its_tokens_and_every_block_comes_back(num_blocks, preempted):
    requests = [request(4 + 3 * i, n=1 + i % 3, max_new=8 + i, rid=i) for i in range(6)]  # each within 32 tokens
    sched = paged(num_blocks, slots=4, block_size=4, blocks_per_seq=8, budget=32, sync=3)
    groups = drive(sched, requests, steps=3)
    assert (sched.num_preemptions > 0) == preempted
    for g in groups:
        r = g.request
        assert [res.token_ids for res in g.results] == [
            [token(r.request_id, k, i) for i in range(r.params.max_new_tokens)] for k in range(r.n)
        ]
    assert sched.allocator.peak_used <= num_blocks
