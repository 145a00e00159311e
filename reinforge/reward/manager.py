"""Runs a reward function over samples: concurrently, with a per-sample timeout, never crashing."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from ..config import RewardConfig
from ..records import Sample
from ..utils.imports import load_function
from .functions import exact_match_reward, math_reward, reasoning_gym_reward

log = logging.getLogger(__name__)

REWARD_KEYS = ("reward", "score")  # where a reward dict holds the scalar: ours, verl's compute_score


class RewardManager:
    """Scores samples in place (``sample.reward``, ``sample.reward_info``).

    The reward function is chosen by ``reward.type``: ``auto`` uses the reasoning-gym scorer
    for prompts from a reasoning-gym source and math-verify otherwise; ``model`` scores with a
    trained reward model in batches (:class:`~reinforge.reward.model_reward.ModelReward`); ``custom`` loads
    ``reward.function_path`` = ``"module:function"``, a function ``fn(sample) -> float | dict``
    (plain or ``async``; a dict holds the scalar under ``"reward"`` or ``"score"``, verl's key, not
    both; other keys are kept in ``sample.reward_info`` and averaged into the metrics when numeric).

    A function that raises, returns something that is not a finite number, or runs past
    ``reward.timeout`` seconds gives reward 0 and is counted (``reward/errors``,
    ``reward/timeouts``); the first failure of each kind is logged with its message, and a batch
    in which every sample failed is logged as an error (a broken reward function). Plain
    functions run in a thread pool of ``reward.concurrency`` workers; a timed-out call keeps
    its worker until it returns.
    """

    def __init__(self, cfg: RewardConfig, pad_id: int = 0):
        self.cfg = cfg
        self.custom: Callable[..., Any] | None = None
        if cfg.function_path:
            self.custom = load_function(cfg.function_path, "reward.function_path")
        self.model = None
        if cfg.type == "model":
            from .model_reward import ModelReward

            self.model = ModelReward(cfg.model_path, cfg.model_device, cfg.model_batch_size, pad_id)
        self._pool = ThreadPoolExecutor(max_workers=cfg.concurrency, thread_name_prefix="reward")
        self._logged: set[str] = set()

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

    def score(self, samples: list[Sample]) -> dict[str, float]:
        """Score ``samples`` in place; returns counts (``reward/errors``, ``reward/timeouts``)."""
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
        sem = asyncio.Semaphore(self.cfg.concurrency)
        counts = {"errors": 0, "timeouts": 0}
        loop = asyncio.get_running_loop()

        async def one(sample: Sample) -> None:
            fn = self.function_for(sample)
            async with sem:
                try:
                    if inspect.iscoroutinefunction(fn):
                        result = await asyncio.wait_for(fn(sample), self.cfg.timeout)
                    else:
                        result = await asyncio.wait_for(loop.run_in_executor(self._pool, fn, sample), self.cfg.timeout)
                    self._apply(sample, result)
                except TimeoutError:
                    counts["timeouts"] += 1
                    self._fail(sample, "timeout", f"reward function ran past reward.timeout={self.cfg.timeout}s")
                except Exception as e:  # a reward bug must not kill a training run
                    counts["errors"] += 1
                    self._fail(sample, "error", f"{type(e).__name__}: {e}")

        await asyncio.gather(*(one(s) for s in samples))
        failed = counts["errors"] + counts["timeouts"]
        if samples and failed == len(samples):
            log.error("reward: all %d samples failed and scored 0 (first: %s); check reward.function_path / "
                      "reward.type", failed, samples[0].reward_info.get("reward_failure"))
        return {f"reward/{k}": float(v) for k, v in counts.items()}

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
        self._pool.shutdown(wait=False, cancel_futures=True)
