"""Runs a reward function over samples: concurrently, with a per-sample timeout, never crashing
on one bad sample, and stopping the run when the function fails on everything. User functions
(``reward.function_path``) run in worker processes (:mod:`reinforge.reward.workers`) unless
``reward.isolation: thread``; built-in rewards run in threads of the trainer."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import math
import os
import threading
from collections.abc import Callable
from typing import Any

from ..config import JudgeConfig, RewardConfig
from ..records import Sample
from ..rollout.infra_guard import mark_failed
from ..utils.imports import load_function
from .functions import exact_match_reward, math_reward, reasoning_gym_reward
from .judge import JudgeFailure
from .threads import DaemonWorkers, InSequence, Job

log = logging.getLogger(__name__)

REWARD_KEYS = ("reward", "score")  # where a reward dict holds the scalar: ours, verl's compute_score


class RewardExit(Exception):
    """A reward function tried to end the process (``os._exit``, ``sys.exit``); it is counted as
    a reward error of that sample instead."""

    @classmethod
    def raised(cls, name: str, e: BaseException) -> RewardExit:
        """The error of reward function ``name`` raising ``e`` (a ``BaseException``: ``sys.exit``...)."""
        return cls(f"reward function {name} raised {type(e).__name__}({e})")


class RewardFunctionFailing(RuntimeError):
    """The reward function failed on every sample of ``RewardManager.ALL_FAILED_LIMIT``
    consecutive batches, or on every sample of a whole run: the run stops with this one-line
    message (training on all-zero rewards teaches nothing)."""


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


def reward_info_metrics(samples: list[Sample], prefix: str = "reward_info/") -> dict[str, float]:
    """``reward_info/<key>``: the mean of each number (or bool) a reward function returned beside its
    reward (``{"score": 1.0, "format_ok": 1}``), over the samples that hold the key."""
    sums: dict[str, list[float]] = {}
    for s in samples:
        for k, v in s.reward_info.items():
            if isinstance(v, (bool, int, float)) and math.isfinite(v):
                acc = sums.setdefault(k, [0.0, 0.0])
                acc[0] += float(v)
                acc[1] += 1
    return {f"{prefix}{k}": total / n for k, (total, n) in sorted(sums.items())}


def describe_sample(sample: Sample) -> str:
    """``sample 3 (prompt 'What is 2 + 2?...')``: which sample a message is about."""
    p = sample.prompt
    if isinstance(p, list):  # chat messages: the last one's content
        p = p[-1].get("content", "") if p and isinstance(p[-1], dict) else str(p)
    text = " ".join(str(p).split())
    return f"sample {sample.index} (prompt {text[:60] + ('...' if len(text) > 60 else '')!r})"


def _metric(kind: str) -> str:
    """The ``reward/<name>`` count of a failure kind (``timeout`` -> ``timeouts``)."""
    return {"timeout": "timeouts", "error": "errors"}.get(kind, kind)


class RewardManager:
    """Scores samples in place (``sample.reward``, ``sample.reward_info``).

    The reward function is chosen by ``reward.type``: ``auto`` uses the reasoning-gym scorer
    for prompts from a reasoning-gym source and math-verify otherwise; ``model`` scores with a
    trained reward model in batches (:class:`~reinforge.reward.model_reward.ModelReward`); ``judge`` asks an
    LLM judge at an OpenAI-compatible endpoint, or run by the embedded engine with its own model (one batched
    call per :meth:`score`, :mod:`~reinforge.reward.judge_engine`; ``run``: the run's whole config, which
    places it; ``judge``: the ``judge`` section, default the one of ``run``)
    (:class:`~reinforge.reward.judge.JudgeReward`: a judge that fails (a timeout included: never
    ``reward/timeouts``) or answers without a score is counted in
    ``reward/judge_errors`` / ``reward/judge_unparseable`` and ``reward/errors``, and the sample is left
    out of its group's statistics and of the loss, status ``failed``); ``custom`` loads
    ``reward.function_path`` = ``"module:function"``, a function ``fn(sample) -> float | dict``
    (plain or ``async``; a dict holds the scalar under ``"reward"`` or ``"score"``, verl's key, not
    both; other keys are kept in ``sample.reward_info`` and averaged into the metrics when numeric).

    A custom function runs in worker processes (``reward.isolation: process``, the default;
    :class:`~reinforge.reward.workers.RewardProcessPool`): one that calls ``os._exit`` (however it
    reaches it), crashes or hangs ends or loses only its worker, which is replaced; a call past
    ``reward.timeout`` is ended by stopping its worker. Changes the function makes to
    ``sample.reward_info`` come back; other changes to the sample stay in the worker.

    A function that raises, returns something that is not a finite number, tries to end the
    process or runs past ``reward.timeout`` seconds gives reward 0 and is counted
    (``reward/errors``, ``reward/timeouts``); the first failure of each kind is logged in one line
    naming the function, the sample and the exception. The built-in rewards run one after another on
    one daemon worker thread (:meth:`_score_in_sequence`; in :meth:`ascore`, as below). Otherwise at
    most ``reward.concurrency`` calls run at once. In threads (``reward.isolation: thread``) each
    plain call runs on a daemon worker thread that no other call shares while it runs
    (:class:`~.threads.DaemonWorkers`). A call that times out stops counting against the concurrency:
    its thread is left to finish, counted in ``reward/abandoned_threads``. ``async`` functions run on a separate
    event loop (:class:`_AsyncRunner`), so one that blocks still times out. When every sample of
    ``ALL_FAILED_LIMIT`` consecutive :meth:`score` calls (one per rollout) failed,
    :class:`RewardFunctionFailing` stops the run; :meth:`check_run` raises it at the end of a
    shorter run whose every reward failed.

    Raises:
        ValueError: (constructor) ``reward.function_path`` cannot be imported or is not a function; a judge
            reward without ``judge`` or ``run``.
    """

    ALL_FAILED_LIMIT = 3

    def __init__(self, cfg: RewardConfig, pad_id: int = 0, run: Any = None, judge: JudgeConfig | None = None):
        self.cfg = cfg
        if judge is None and run is None and cfg.properties.get("judge"):
            raise ValueError(
                f"RewardManager: reward.type={cfg.type} is scored by the judge section: pass judge=cfg.judge or run=cfg"
            )
        self.judge_cfg = judge or (run.judge if run is not None else JudgeConfig())
        self.custom: Callable[..., Any] | None = None
        self.pool = None
        if cfg.function_path and cfg.isolation == "process":
            from .workers import RewardProcessPool

            self.pool = RewardProcessPool(
                cfg.function_path, cfg.concurrency, cfg.timeout, max_memory_mb=cfg.worker_max_memory_mb
            )
            self.pool.start()  # import errors now, in words, before the first rollout
        elif cfg.function_path:
            self.custom = load_function(cfg.function_path, "reward.function_path")
        self.model = None
        if cfg.type == "model":
            from .model_reward import ModelReward

            self.model = ModelReward(cfg.model_path, cfg.model_device, cfg.model_batch_size, pad_id)
        self.judge = None
        if cfg.type == "judge":
            from .judge import judge_from_config

            engine = None
            if self.judge_cfg.model_path:  # the embedded engine, placed by the run's config
                from .judge_engine import build_engine_judge

                engine = build_engine_judge(self.judge_cfg, run)
            self.judge = judge_from_config(self.judge_cfg, cfg.timeout, engine)
        self._logged: set[str] = set()
        self._workers = DaemonWorkers()
        self._abandoned: list[Job] = []  # calls that timed out, still running on their workers
        self._runner: _AsyncRunner | None = None
        self._all_failed_streak = 0
        self.num_scored = 0  # samples scored by this manager, and how many of them failed
        self.num_failed = 0
        self.first_failure = ""
        if self.pool is None:
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
        if t == "judge" and self.judge is not None:
            return self.judge
        raise ValueError(f"reward.type={t!r} needs reward.function_path")

    def _name(self, fn: Callable[..., Any] | None = None) -> str:
        if self.cfg.function_path and (self.custom is not None or self.pool is not None):
            return self.cfg.function_path
        if self.model is not None:
            return f"reward model {self.cfg.model_path}"
        if self.judge is not None:
            return self.judge.name
        fn = getattr(fn, "func", fn)  # functools.partial
        return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"

    def score(self, samples: list[Sample]) -> dict[str, float]:
        """Score ``samples`` in place; returns counts (``reward/errors``, ``reward/timeouts``,
        ``reward/abandoned_threads``: timed-out calls still running in threads).

        Raises:
            RewardFunctionFailing: every sample failed in ``ALL_FAILED_LIMIT`` consecutive calls.
            RuntimeError: called inside a running event loop (use :meth:`ascore`).
        """
        if self.model is not None:  # one batched pass over all samples
            for s, r in zip(samples, self.model(samples)):
                self._apply(s, r)
            self.num_scored += len(samples)
            return {"reward/errors": 0.0, "reward/timeouts": 0.0}
        if self.pool is not None:
            return self._score_in_processes(samples)
        if self.judge is not None and self.judge.batched:
            return self._score_judged(samples)
        try:
            asyncio.get_running_loop()
            inside = True
        except RuntimeError:
            inside = False
        if inside:
            raise RuntimeError("RewardManager.score() called inside an event loop: await ascore() instead")
        if self.custom is None and self.judge is None:
            return self._score_in_sequence(samples)
        return asyncio.run(self.ascore(samples))  # outside the except block: a failure has no chained context

    def _score_in_sequence(self, samples: list[Sample]) -> dict[str, float]:
        """The built-in rewards (reasoning-gym, math, exact match: local Python, which threads would only
        run by turns on the GIL) one after another on one worker thread (:class:`~.threads.InSequence`):
        one handoff instead of an asyncio task and a thread handoff per sample (256 reasoning-gym samples:
        15 -> 1.2 ms on two cores). A call that runs past ``reward.timeout`` counts as a timeout and is left
        to its worker (``reward/abandoned_threads`` while it runs); the samples after it go on on another."""
        fns = [self.function_for(s) for s in samples]
        counts = {"errors": 0, "timeouts": 0}
        first: list[str] = []

        def wrap(fn: Callable[..., Any], e: BaseException) -> Exception:
            return RewardExit.raised(self._name(fn), e)

        start = 0
        while start < len(samples):
            run = InSequence(
                self._workers, samples[start:], fns[start:], wrap, before=lambda fn: _IN_REWARD.set(self._name(fn))
            )
            stuck = run.wait(self.cfg.timeout)
            for sample, fn, (ok, value) in zip(samples[start:], fns[start:], run.outcomes):
                try:
                    if not ok:
                        raise value
                    self._apply(sample, value)
                except Exception as e:  # a reward bug must not kill a training run
                    counts["errors"] += 1
                    first.append(self._fail(sample, "error", f"{type(e).__name__}: {e}", fn))
            if stuck is None:
                break
            i = start + stuck
            counts["timeouts"] += 1
            first.append(self._fail(samples[i], "timeout", f"ran past reward.timeout={self.cfg.timeout:g}s", fns[i]))
            self._abandoned.append(run.job)
            start = i + 1
        return self._finish_in_threads(len(samples), counts, first)

    def _score_in_processes(self, samples: list[Sample]) -> dict[str, float]:
        counts = {"errors": 0, "timeouts": 0}
        first: list[str] = []
        for sample, o in zip(samples, self.pool.run(samples)):
            kind, msg = ("timeout" if o.kind == "timeout" else "error"), o.message
            if o.kind == "ok":
                try:
                    self._apply(sample, o.value)
                    sample.reward_info.update({k: v for k, v in (o.info or {}).items() if k not in sample.reward_info})
                    continue
                except ValueError as e:
                    msg = f"{type(e).__name__}: {e}"
            counts[kind + "s"] += 1
            first.append(self._fail(sample, kind, msg))
        out = self._finish(len(samples), counts, first)
        out["reward/abandoned_threads"] = 0.0  # a stuck call's worker is stopped: nothing is left running
        return out

    def _score_judged(self, samples: list[Sample]) -> dict[str, float]:
        """The embedded judge: every sample in one batched call (:meth:`JudgeReward.judge_many`); its
        failures are counted and left out as an endpoint's are."""
        counts = {"errors": 0, "timeouts": 0, "judge_errors": 0, "judge_unparseable": 0}
        first: list[str] = []
        for sample, result in zip(samples, self.judge.judge_many(samples)):
            if isinstance(result, JudgeFailure):
                counts["errors"] += 1
                counts[result.kind] += 1
                first.append(self._fail(sample, result.kind, str(result), self.judge, left_out=True))
                self._leave_out(sample)
            else:
                self._apply(sample, result)
        out = self._finish(len(samples), counts, first)
        out["reward/abandoned_threads"] = 0.0
        return out

    async def ascore(self, samples: list[Sample]) -> dict[str, float]:
        """:meth:`score` in a running event loop."""
        if self.pool is not None:
            return await asyncio.to_thread(self._score_in_processes, samples)
        if self.judge is not None and self.judge.batched:
            return await asyncio.to_thread(self._score_judged, samples)
        sem = asyncio.Semaphore(self.cfg.concurrency)
        counts = {"errors": 0, "timeouts": 0}
        if self.judge is not None:
            counts.update(judge_errors=0, judge_unparseable=0)
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
                    if fn is self.judge:  # the judge's every try ran out: a judge error, left out
                        per_try = f"reward.timeout={self.cfg.timeout:g} s per try"
                        budget = f"no answer within {self.judge.budget():g} s ({per_try})"
                        counts["errors"] += 1
                        counts["judge_errors"] += 1
                        first.append(self._fail(sample, "judge_errors", budget, fn, left_out=True))
                        self._leave_out(sample)
                    else:
                        counts["timeouts"] += 1
                        why = f"ran past reward.timeout={self.cfg.timeout:g}s"
                        first.append(self._fail(sample, "timeout", why, fn))
                except JudgeFailure as e:  # the judge's fault, not the model's: counted and left out
                    counts["errors"] += 1
                    counts[e.kind] += 1
                    first.append(self._fail(sample, e.kind, str(e), fn, left_out=True))
                    self._leave_out(sample)
                except Exception as e:  # a reward bug must not kill a training run
                    counts["errors"] += 1
                    first.append(self._fail(sample, "error", f"{type(e).__name__}: {e}", fn))

        await asyncio.gather(*(one(s) for s in samples))
        return self._finish_in_threads(len(samples), counts, first)

    def _finish_in_threads(self, n: int, counts: dict[str, int], first: list[str]) -> dict[str, float]:
        """:meth:`_finish`, and ``reward/abandoned_threads``: the timed-out calls still running."""
        self._abandoned = [j for j in self._abandoned if not j.finished.is_set()]
        out = self._finish(n, counts, first)
        out["reward/abandoned_threads"] = float(len(self._abandoned))
        return out

    def _finish(self, n: int, counts: dict[str, int], first: list[str]) -> dict[str, float]:
        self.num_scored += n
        self.num_failed += counts["errors"] + counts["timeouts"]
        if first and not self.first_failure:
            self.first_failure = first[0]
        out = {f"reward/{k}": float(v) for k, v in counts.items()}
        self._check_all_failed(n, counts, first[0] if first else "")
        return out

    def _instead(self) -> str:
        """What the run would train on: a judge's failures are left out, other rewards' score 0."""
        return "nothing (every sample left out)" if self.judge is not None else "all-zero rewards"

    def _hint(self, example: str) -> str:
        if self.judge is not None:
            where = self.judge_cfg.url or self.judge_cfg.model_path
            return f"check the judge ({where}: judge.url / judge.model, or judge.model_path)"
        if "reward.timeout" in example:
            return "make the function faster or raise reward.timeout"
        if self.cfg.function_path:
            return f"fix {self.cfg.function_path}"
        return "check reward.type against the data (docs/data.md)"

    def _check_all_failed(self, n: int, counts: dict[str, int], example: str) -> None:
        if not n:
            return
        if counts["errors"] + counts["timeouts"] < n:
            self._all_failed_streak = 0
            return
        self._all_failed_streak += 1
        log.error(
            "reward: all %d samples failed (%s) (%d of %d such batches in a row stop the run); e.g. %s",
            n,
            "left out of training" if self.judge is not None else "scored 0",
            self._all_failed_streak,
            self.ALL_FAILED_LIMIT,
            example,
        )
        if self._all_failed_streak >= self.ALL_FAILED_LIMIT:
            which = self.cfg.function_path or f"reward.type={self.cfg.type}"
            raise RewardFunctionFailing(
                f"the reward function ({which}) failed on every sample of "
                f"{self._all_failed_streak} consecutive batches (the last: {n} samples, {counts['errors']} errors, "
                f"{counts['timeouts']} timeouts); e.g. {example}. Stopping instead of training on {self._instead()}: "
                f"{self._hint(example)}, then resume with run.recover=auto"
            )

    def check_run(self) -> None:
        """Raise when every sample this manager scored failed (a run too short for
        ``ALL_FAILED_LIMIT`` batches still must not end as a success).

        Raises:
            RewardFunctionFailing: at least one sample was scored and none succeeded.
        """
        if self.num_scored and self.num_failed == self.num_scored:
            which = self.cfg.function_path or f"reward.type={self.cfg.type}"
            what = "left out of training" if self.judge is not None else "scored 0"
            raise RewardFunctionFailing(
                f"every reward of this run failed ({self.num_scored} samples {what} by {which}); e.g. "
                f"{self.first_failure}. Nothing was learned from them: {self._hint(self.first_failure)}"
            )

    @staticmethod
    def _leave_out(sample: Sample) -> None:
        """A sample whose judge failed: status ``failed`` (left out of its group's statistics, advantage 0)
        and no loss, an infrastructure failure of kind ``judge`` (:func:`~reinforge.rollout.infra_guard.mark_failed`);
        its reward 0 is a placeholder."""
        mark_failed(sample, "judge", sample.reward_info.get("reward_failure", "judge failed"))

    async def _call_in_thread(self, fn: Callable[..., Any], sample: Sample) -> Any:
        """``fn(sample)`` on a daemon worker thread (:class:`~.threads.DaemonWorkers`), awaited for at most
        ``reward.timeout`` s (a judge: every try of its request, :meth:`JudgeReward.budget`)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        name = self._name(fn)

        def settle(ok: bool, value: Any) -> None:
            if not fut.done():
                fut.set_result(value) if ok else fut.set_exception(value)

        outcome: list[tuple[bool, Any]] = []

        def target() -> None:
            _IN_REWARD.set(name)
            try:
                outcome.append((True, fn(sample)))
            except Exception as e:  # noqa: BLE001 - handed to the awaiting task
                outcome.append((False, e))
            except BaseException as e:  # sys.exit, KeyboardInterrupt raised inside the function
                outcome.append((False, RewardExit.raised(name, e)))

        def report() -> None:  # after the worker is free again
            try:
                loop.call_soon_threadsafe(settle, *outcome[0])
            except RuntimeError:  # the scoring loop is gone (the call had timed out)
                pass

        job = self._workers.submit(target, report)
        try:
            return await asyncio.wait_for(fut, self.judge.budget() if fn is self.judge else self.cfg.timeout)
        except TimeoutError:
            self._abandoned.append(job)
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
                raise RewardExit.raised(name, e) from None

        cf = asyncio.run_coroutine_threadsafe(call(), runner.loop)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(cf), self.cfg.timeout)
        except TimeoutError:
            cf.cancel()
            if self._runner is runner and not await runner.alive():
                log.warning(
                    "reward function %s blocks its event loop (an async function that does not await): "
                    "later calls run on a fresh loop",
                    name,
                )
                self._runner = _AsyncRunner()
            raise

    @staticmethod
    def _apply(sample: Sample, result: Any) -> None:
        info: dict[str, Any] = {}
        if isinstance(result, dict):
            keys = [k for k in REWARD_KEYS if k in result]
            if len(keys) != 1:
                raise ValueError(
                    f"a reward dict holds the scalar under 'reward' or 'score' (exactly one of them); "
                    f"got keys {sorted(result)}"
                )
            info = {k: v for k, v in result.items() if k != keys[0]}
            result = result[keys[0]]
        if isinstance(result, bool):
            result = float(result)
        if not isinstance(result, (int, float)) or not math.isfinite(result):
            raise ValueError(f"reward must be a finite number, got {result!r}")
        sample.reward = float(result)
        sample.reward_info.update(info)

    def _fail(
        self, sample: Sample, kind: str, message: str, fn: Callable[..., Any] | None = None, left_out: bool = False
    ) -> str:
        """Give ``sample`` reward 0 and return the one-line account of it (logged for the first of each
        kind). ``left_out``: the sample is an infrastructure failure (a judge's), left out of training, its
        0 a placeholder; otherwise the 0 is its score."""
        sample.reward = 0.0
        sample.reward_info["reward_failure"] = message
        line = f"reward function {self._name(fn)} failed on {describe_sample(sample)}: {message}"
        if kind not in self._logged:
            self._logged.add(kind)
            what = "left out of training: the judge's failure, not the model's score" if left_out else "scored 0"
            log.warning("%s (%s; further %s failures are only counted in reward/%s)", line, what, kind, _metric(kind))
        return line

    def close(self) -> None:
        self._workers.close()
        if self.pool is not None:
            self.pool.close()
        if self.judge is not None:
            self.judge.close()
        if self._runner is not None:
            self._runner.stop()
            self._runner = None
