"""AsyncEngine: concurrent coroutines share one engine in batches, with the synchronous path's results."""

import asyncio

import pytest
import torch

from reinforge.config import EngineConfig
from reinforge.engine import EmbeddedEngine
from reinforge.models.loading import build_model
from reinforge.records import FinishReason, GenerateRequest, GenerateResult, SamplingParams
from reinforge.rollout.async_client import AsyncEngine, is_continuous

GREEDY = SamplingParams(max_new_tokens=10, temperature=0.0)


@pytest.fixture()
def engine(tiny_model_path):
    return EmbeddedEngine(
        build_model(tiny_model_path, torch.float32), EngineConfig(max_num_seqs=16, sync_interval=2), max_model_len=64
    )


def prompts(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(10, 40000, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n)
    ]


class CountingEngine:
    """Wraps the embedded engine: records how many requests each step() serves."""

    def __init__(self, engine):
        self.e = engine
        self.step_loads: list[int] = []  # requests in the engine during each step
        self.added: list[int] = []  # step count when each request was added

    def add_request(self, request):
        self.added.append(len(self.step_loads))
        return self.e.add_request(request)

    def step(self):
        running = {id(o[0]) for o in self.e.scheduler.owner if o is not None}
        self.step_loads.append(len(running | {id(g) for g in self.e.scheduler.waiting}))
        self.e.step()

    def has_unfinished(self):
        return self.e.has_unfinished()


class BatchOnlyEngine:
    """An engine with only generate(requests) (like vLLM / SGLang / the Ray pool): echoes the prompt."""

    weight_version = 7

    def __init__(self):
        self.batches: list[int] = []

    def generate(self, requests):
        self.batches.append(len(requests))
        return [
            [GenerateResult(list(r.prompt_ids[:2]), [-0.1, -0.2], FinishReason.STOP, self.weight_version)] * r.n
            for r in requests
        ]


def test_greedy_results_equal_the_synchronous_path(engine):
    ps = prompts(6)
    sync = [engine.generate([GenerateRequest(p, GREEDY, n=2)])[0] for p in ps]
    client = AsyncEngine(engine)
    assert client.continuous

    async def one(p, delay):
        await asyncio.sleep(delay)  # staggered arrivals: requests join while others decode
        return await client.generate(GenerateRequest(p, GREEDY, n=2))

    async def main():
        return await asyncio.gather(*(one(p, 0.01 * i) for i, p in enumerate(ps)))

    got = asyncio.run(main())
    for a, b in zip(sync, got):
        assert [r.token_ids for r in a] == [r.token_ids for r in b]
        assert [r.finish_reason for r in a] == [r.finish_reason for r in b]
        torch.testing.assert_close(torch.tensor([r.log_probs for r in a]), torch.tensor([r.log_probs for r in b]))
    assert not engine.has_unfinished()


def test_concurrent_coroutines_share_engine_steps(engine):
    counting = CountingEngine(engine)
    assert is_continuous(counting)
    client = AsyncEngine(counting)

    async def main():
        return await asyncio.gather(*(client.generate(GenerateRequest(p, GREEDY)) for p in prompts(8)))

    results = asyncio.run(main())
    assert len(results) == 8 and all(len(r) == 1 and len(r[0].token_ids) == 10 for r in results)
    assert counting.step_loads[0] == 8  # the first step serves all eight coroutines
    assert client.engine_calls == len(counting.step_loads) < 8 * 5  # 10 tokens / sync_interval 2 = 5 steps
    assert client.requests == 8


def test_late_requests_join_running_ones(engine):
    """Continuous batching: a request that arrives while others decode is added between steps and
    runs beside them (it does not wait for the batch to finish)."""
    counting = CountingEngine(engine)
    client = AsyncEngine(counting)
    long = SamplingParams(max_new_tokens=30, temperature=0.0)

    async def late(p):
        while len(counting.step_loads) < 2:
            await asyncio.sleep(0.001)
        return await client.generate(GenerateRequest(p, GREEDY))

    async def main():
        ps = prompts(3, seed=1)
        return await asyncio.gather(
            client.generate(GenerateRequest(ps[0], long)), client.generate(GenerateRequest(ps[1], long)), late(ps[2])
        )

    asyncio.run(main())
    assert counting.added[:2] == [0, 0] and counting.added[2] >= 2
    joined = counting.added[2]
    assert counting.step_loads[joined] == 3  # the late request ran together with the two long ones


def test_batch_only_engines_get_one_generate_per_tick():
    eng = BatchOnlyEngine()
    client = AsyncEngine(eng)
    assert not client.continuous

    async def main():
        first = await asyncio.gather(
            *(client.generate(GenerateRequest([i, i + 1, i + 2], GREEDY, n=2)) for i in range(5))
        )
        second = await client.generate(GenerateRequest([9, 9], GREEDY))
        return first, second

    first, second = asyncio.run(main())
    assert eng.batches == [5, 1]
    assert [r[0].token_ids for r in first] == [[i, i + 1] for i in range(5)] and all(len(r) == 2 for r in first)
    assert second[0].weight_version == 7


def test_a_bad_request_fails_alone_and_the_client_is_reusable(engine):
    client = AsyncEngine(engine)

    async def main():
        return await asyncio.gather(
            client.generate(GenerateRequest(list(range(1, 80)), GREEDY)),  # > max_model_len
            client.generate(GenerateRequest(prompts(1)[0], GREEDY)),
            return_exceptions=True,
        )

    bad, good = asyncio.run(main())
    assert isinstance(bad, ValueError) and "max_model_len" in str(bad)
    assert len(good[0].token_ids) == 10
    # a second event loop (the next rollout) uses the same client
    again = asyncio.run(client.generate(GenerateRequest(prompts(1)[0], GREEDY)))
    assert again[0].token_ids == good[0].token_ids


def test_engine_errors_reach_every_waiting_coroutine():
    class Broken(BatchOnlyEngine):
        def generate(self, requests):
            raise RuntimeError("engine died")

    client = AsyncEngine(Broken())

    async def main():
        return await asyncio.gather(
            *(client.generate(GenerateRequest([1, 2], GREEDY)) for _ in range(3)), return_exceptions=True
        )

    assert all(isinstance(r, RuntimeError) and "engine died" in str(r) for r in asyncio.run(main()))
