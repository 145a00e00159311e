"""Runs a reward function over samples: concurrently, with a per-sample timeout, never crashing
on one bad sample, and stopping the run when the function fails on everything."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import math
import os
import threading
from typing import Any, Callable

from ..config import RewardConfig
from ..records import Sample
from ..utils.imports import load_function
from .functions import exact_match_reward, math_reward, reasoning_gym_reward

log = logging.getLogger(__name__)

REWARD_KEYS = ("reward", "score")  # where a reward dict holds the scalar: ours, verl's compute_score


class RewardExit(Exception):
    """A reward function tried to end the process (``os._exit``, ``sys.exit``); it is counted as
    a reward error of that sample instead."""


class RewardFunctionFailing(RuntimeError):
    """The reward function failed on every sample of ``RewardManager.ALL_FAILED_LIMIT``
    consecutive batches: the run stops (training on all-zero rewards teaches nothing)."""


# The reward function running in this thread / task (a name), for the os._exit guard.
_IN_REWARD: contextvars.ContextVar[str | None] = contextvars.ContextVar("reinforge_in_reward", default=None)
_REAL_EXIT = os._exit
_GUARD_PID: int | None = None


def _guarded_exit(code: int) -> None:
    """``os._exit`` while the exit guard is installed: inside a reward function of this process
    it raises :class:`RewardExit`; anywhere else (other code, a forked child) it exits."""
    who = _IN_REWARD.get()
    if who is not None and os.getpid() == _GUARD_PID:
        raise RewardExit(f"reward function {who} called os._exit({code})")
    _REAL_EXIT(code)


def install_exit_guard() -> None:
    """Replace ``os._exit`` by :func:`_guarded_exit` (idempotent). ``os._exit`` skips every
    handler, so without this a reward that calls it ends the trainer without a word. Exits
    that bypass Python (a C library's ``exit`` / ``abort``, a segfault) cannot be caught in
    the process: the run dies and, with ``--max-restarts``, is relaunched."""
    global _GUARD_PID
    _GUARD_PID = os.getpid()
    os._exit = _guarded_exit


class _AsyncRunner:
    """An event loop in a daemon thread where ``async`` reward functions run: a coroutine that
    blocks (``time.sleep`` inside ``async def``) blocks this loop, not the caller's, so the
    caller's ``reward.timeout`` still fires; a blocked runner is replaced by a fresh one."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="reward-async", daemon=True)
        self.thread.start()

    async def alive(self, wait_s: float = 0.2) -> bool:
        probe = asyncio.run_coroutine_threadsafe(asyncio.sleep(0), self.loop)
        try:
            await asyncio.wait_for(asyncio.wrap_future(probe), wait_s)
            return True
        except TimeoutError:
            probe.cancel()
            return False

    def stop(self) -> None:
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)


class RewardManager:
    """Scores samples in place (``sample.reward``, ``sample.reward_info``).

    The reward function is chosen by ``reward.type``: ``auto`` uses the reasoning-gym scorer
    for prompts from a reasoning-gym source and math-verify otherwise; ``model`` scores with a
    trained reward model in batches (:class:`~reinforge.reward.model_reward.ModelReward`); ``custom`` loads
    ``reward.function_path`` = ``"module:function"``, a function ``fn(sample) -> float | dict``
    (plain or ``async``; a dict holds the scalar under ``"reward"`` or ``"score"``, verl's key, not
    both; other keys are kept in ``sample.reward_info`` and averaged into the metrics when numeric).

    A function that raises, returns something that is not a finite number, tries to end the
    process (``os._exit``, ``sys.exit``: :class:`RewardExit`) or runs past ``reward.timeout``
    seconds gives reward 0 and is counted (``reward/errors``, ``reward/timeouts``); the first
    failure of each kind is logged with its message. At most ``reward.concurrency`` calls run at
    once. Each plain call runs in a thread of its own: a call that times out stops counting
    against the concurrency (its thread is left to finish, counted in
    ``reward/abandoned_threads``), so hung calls cannot starve healthy samples. ``async``
    functions run on a separate event loop (:class:`_AsyncRunner`), so one that blocks still
    times out. When every sample of ``ALL_FAILED_LIMIT`` consecutive :meth:`score` calls (one
    per rollout) failed, :class:`RewardFunctionFailing` stops the run.
    """

    ALL_FAILED_LIMIT = 3

    def __init__(self, cfg: RewardConfig, pad_id: int = 0):
        self.cfg = cfg
        self.custom: Callable[..., Any] | None = None
        if cfg.function_path:
            self.custom = load_function(cfg.function_path, "reward.function_path")
        self.model = None
        if cfg.type == "model":
            from .model_reward import ModelReward

            self.model = ModelReward(cfg.model_path, cfg.model_device, cfg.model_batch_size, pad_id)
        self._logged: set[str] = set()
        self._abandoned: list[threading.Thread] = []
        self._runner: _AsyncRunner | None = None
        self._all_failed_streak = 0
        install_exit_guard()

    def function_for(self, sample: Sample) -> Callable[..., Any]:
        t, ex = self.cfg.type, self.cfg.answer_extraction
        if self.custom is not None:
            return self.custom
        if t == "auto":
            t = "reasoning_gym" if "reasoning_gym" in sample.metadata else "math"
        if t == "reasoning_gym":
            return functools.partial(reasoning_gym_reward, extraction=ex)
        if t == "math":
            return functools.partial(math_reward, extraction="none" if ex == "tag_or_last_number" else ex)
        if t == "exact_match":
            return functools.partial(exact_match_reward, extraction=ex)
        raise ValueError(f"reward.type={t!r} needs reward.function_path")

    def _name(self, fn: Callable[..., Any]) -> str:
        if self.custom is not None and self.cfg.function_path:
            return self.cfg.function_path
        fn = getattr(fn, "func", fn)  # functools.partial
        return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"

    def score(self, samples: list[Sample]) -> dict[str, float]:
        """Score ``samples`` in place; returns counts (``reward/errors``, ``reward/timeouts``,
        ``reward/abandoned_threads``: timed-out calls still running).

        Raises:
            RewardFunctionFailing: every sample failed in ``ALL_FAILED_LIMIT`` consecutive calls.
        """
        if self.model is not None:  # one batched pass over all samples
            for s, r in zip(samples, self.model(samples)):
                self._apply(s, r)
            return {"reward/errors": 0.0, "reward/timeouts": 0.0}
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.ascore(samples))
        raise RuntimeError("RewardManager.score() called inside an event loop: await ascore() instead")

    async def ascore(self, samples: list[Sample]) -> dict[str, float]:
        """:meth:`score` in a running event loop."""
        sem = asyncio.Semaphore(self.cfg.concurrency)
        counts = {"errors": 0, "timeouts": 0}
        first: list[str] = []

        async def one(sample: Sample) -> None:
            fn = self.function_for(sample)
            async with sem:  # released on timeout: an abandoned call no longer holds a slot
                try:
                    if inspect.iscoroutinefunction(fn):
                        result = await self._call_async(fn, sample)
                    else:
                        result = await self._call_in_thread(fn, sample)
                    self._apply(sample, result)
                except TimeoutError:
                    counts["timeouts"] += 1
                    msg = f"reward function ran past reward.timeout={self.cfg.timeout}s"
                    first.append(msg)
                    self._fail(sample, "timeout", msg)
                except Exception as e:  # a reward bug must not kill a training run
                    counts["errors"] += 1
                    msg = f"{type(e).__name__}: {e}"
                    first.append(msg)
                    self._fail(sample, "error", msg)

        await asyncio.gather(*(one(s) for s in samples))
        self._abandoned = [t for t in self._abandoned if t.is_alive()]
        out = {f"reward/{k}": float(v) for k, v in counts.items()}
        out["reward/abandoned_threads"] = float(len(self._abandoned))
        self._check_all_failed(len(samples), counts, first[0] if first else "")
        return out

    def _check_all_failed(self, n: int, counts: dict[str, int], example: str) -> None:
        if not n:
            return
        if counts["errors"] + counts["timeouts"] < n:
            self._all_failed_streak = 0
            return
        self._all_failed_streak += 1
        log.error("reward: all %d samples failed and scored 0 (e.g. %s); check reward.function_path / reward.type "
                  "(%d of %d such batches in a row stop the run)", n, example, self._all_failed_streak,
                  self.ALL_FAILED_LIMIT)
        if self._all_failed_streak >= self.ALL_FAILED_LIMIT:
            which = self.cfg.function_path or f"reward.type={self.cfg.type}"
            raise RewardFunctionFailing(
                f"the reward function ({which}) failed on every sample of "
                f"{self._all_failed_streak} consecutive batches (the last: {n} samples, {counts['errors']} errors, "
                f"{counts['timeouts']} timeouts; e.g. {example}): stopping instead of training on all-zero rewards. "
                f"Fix the function (or raise reward.timeout) and resume with run.recover=auto")

    async def _call_in_thread(self, fn: Callable[..., Any], sample: Sample) -> Any:
        """``fn(sample)`` in a new daemon thread, awaited for at most ``reward.timeout`` s."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        name = self._name(fn)

        def settle(ok: bool, value: Any) -> None:
            if not fut.done():
                fut.set_result(value) if ok else fut.set_exception(value)

        def target() -> None:
            _IN_REWARD.set(name)
            try:
                ok, value = True, fn(sample)
            except Exception as e:  # noqa: BLE001 - handed to the awaiting task
                ok, value = False, e
            except BaseException as e:  # sys.exit, KeyboardInterrupt raised inside the function
                ok, value = False, RewardExit(f"reward function {name} raised {type(e).__name__}({e})")
            try:
                loop.call_soon_threadsafe(settle, ok, value)
            except RuntimeError:  # the scoring loop is gone (the call had timed out)
                pass

        t = threading.Thread(target=target, name="reward", daemon=True)
        t.start()
        try:
            return await asyncio.wait_for(fut, self.cfg.timeout)
        except TimeoutError:
            self._abandoned.append(t)
            raise

    async def _call_async(self, fn: Callable[..., Any], sample: Sample) -> Any:
        """``await fn(sample)`` on the runner loop, awaited here for at most ``reward.timeout`` s;
        a runner blocked by the function is replaced for later calls."""
        if self._runner is None:
            self._runner = _AsyncRunner()
        runner, name = self._runner, self._name(fn)

        async def call() -> Any:
            _IN_REWARD.set(name)
            try:
                return await fn(sample)
            except Exception:
                raise
            except BaseException as e:  # sys.exit inside the coroutine
                raise RewardExit(f"reward function {name} raised {type(e).__name__}({e})") from None

        cf = asyncio.run_coroutine_threadsafe(call(), runner.loop)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(cf), self.cfg.timeout)
        except TimeoutError:
            cf.cancel()
            if self._runner is runner and not await runner.alive():
                log.warning("reward function %s blocks its event loop (an async function that does not await): "
                            "later calls run on a fresh loop", name)
                self._runner = _AsyncRunner()
            raise

    @staticmethod
    def _apply(sample: Sample, result: Any) -> None:
        info: dict[str, Any] = {}
        if isinstance(result, dict):
            keys = [k for k in REWARD_KEYS if k in result]
            if len(keys) != 1:
                raise ValueError(f"a reward dict holds the scalar under 'reward' or 'score' (exactly one of them); "
                                 f"got keys {sorted(result)}")
            info = {k: v for k, v in result.items() if k != keys[0]}
            result = result[keys[0]]
        if isinstance(result, bool):
            result = float(result)
        if not isinstance(result, (int, float)) or not math.isfinite(result):
            raise ValueError(f"reward must be a finite number, got {result!r}")
        sample.reward = float(result)
        sample.reward_info.update(info)

    def _fail(self, sample: Sample, kind: str, message: str) -> None:
        sample.reward = 0.0
        sample.reward_info["reward_failure"] = message
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning("reward %s (scored 0; further ones are only counted): %s", kind, message)

    def close(self) -> None:
        if self._runner is not None:
            self._runner.stop()
            self._runner = None
