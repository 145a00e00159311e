"""Many coroutines, one engine: an ``async`` front end that batches concurrent requests.

Multi-turn rollouts run one coroutine per sample; each awaits the engine once per turn, at a
moment that depends on its tool calls. :class:`AsyncEngine` turns those scattered calls into
engine batches:

* an engine with ``add_request(request) -> handle`` / ``step()`` / ``has_unfinished()`` (the
  embedded engine) is driven by **continuous batching**: requests that arrive are added between
  steps, the engine steps while any request is pending, and each request's future resolves as
  soon as its group finishes (its handle's ``results`` hold no ``None``), while the others go on;
* any other :class:`~reinforge.records.RolloutEngine` (vLLM, SGLang, transformers, the Ray
  ``EnginePool``: only ``generate(requests)``) gets, at each scheduling tick, one
  ``generate(batch)`` call with every request pending at that moment.

Engine calls run in one dedicated worker thread (so the event loop keeps running tools while the
engine computes) and never overlap. Batches depend on when coroutines arrive, so sampled results
are not reproducible bit for bit across runs whose tools take different times; a greedy request
gets exactly what ``engine.generate([request])`` returns.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..records import GenerateRequest, GenerateResult, RolloutEngine


def is_continuous(engine: Any) -> bool:
    """Whether ``engine`` exposes ``add_request`` / ``step`` / ``has_unfinished``."""
    return all(callable(getattr(engine, m, None)) for m in ("add_request", "step", "has_unfinished"))


class AsyncEngine:
    """``await AsyncEngine(engine).generate(request)`` from any number of coroutines.

    One event loop at a time may use it (a later ``asyncio.run`` may use it again once the
    previous loop's requests have finished). Counters: ``engine_calls`` (``step()`` or
    ``generate()`` calls made) and ``requests`` (requests served).
    """

    def __init__(self, engine: RolloutEngine):
        self.engine = engine
        self.continuous = is_continuous(engine)
        self.engine_calls = 0
        self.requests = 0
        self._queue: list[tuple[GenerateRequest, asyncio.Future]] = []
        self._driver: asyncio.Task | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")

    async def generate(self, request: GenerateRequest) -> list[GenerateResult]:
        """``request.n`` results for ``request``, as ``engine.generate([request])[0]`` would give.

        Raises:
            whatever the engine raised for this request (a bad request) or for its batch.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        self._queue.append((request, future))
        if self._driver is None or self._driver.done():
            self._driver = loop.create_task(self._drive_continuous() if self.continuous else self._drive_batches())
        elif self._driver.get_loop() is not loop:
            raise RuntimeError("AsyncEngine is in use by another event loop")
        return await future

    def close(self) -> None:
        self._thread.shutdown(wait=True)

    async def _run(self, fn: Any, *args: Any) -> Any:
        self.engine_calls += 1
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def _take(self) -> list[tuple[GenerateRequest, asyncio.Future]]:
        batch = [(r, f) for r, f in self._queue if not f.done()]  # a cancelled caller is dropped
        self._queue.clear()
        return batch

    async def _drive_continuous(self) -> None:
        engine = self.engine
        running: list[tuple[Any, asyncio.Future]] = []
        try:
            while True:
                await asyncio.sleep(0)  # one tick: coroutines that are ready submit first
                for request, future in self._take():
                    try:
                        running.append((engine.add_request(request), future))  # engine idle: no step running
                    except Exception as e:
                        future.set_exception(e)
                if not running:
                    return
                await self._run(engine.step)
                still = []
                for handle, future in running:
                    if all(r is not None for r in handle.results):
                        self.requests += 1
                        if not future.done():
                            future.set_result(list(handle.results))
                    else:
                        still.append((handle, future))
                running = still
        except BaseException as e:  # the callers get the error; only a cancellation propagates
            self._fail([f for _, f in running] + [f for _, f in self._queue], e)
            if isinstance(e, asyncio.CancelledError):
                raise

    async def _drive_batches(self) -> None:
        batch: list[tuple[GenerateRequest, asyncio.Future]] = []
        try:
            while True:
                await asyncio.sleep(0)
                batch = self._take()
                if not batch:
                    return
                results = await self._run(self.engine.generate, [r for r, _ in batch])
                for (_, future), res in zip(batch, results):
                    self.requests += 1
                    if not future.done():
                        future.set_result(res)
        except BaseException as e:
            self._fail([f for _, f in batch] + [f for _, f in self._queue], e)
            if isinstance(e, asyncio.CancelledError):
                raise

    def _fail(self, futures: list[asyncio.Future], error: BaseException) -> None:
        self._queue.clear()
        for f in futures:
            if not f.done():
                if isinstance(error, asyncio.CancelledError):
                    f.cancel()
                else:
                    f.set_exception(error)
