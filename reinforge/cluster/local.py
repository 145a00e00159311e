"""Local placement: one trainer worker in the driver process, the engine beside it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..config import Config
from ..rollout.types import RolloutEngine
from ..train.worker import TrainWorker


class LocalTrainGroup:
    """A trainer group of one in-process :class:`TrainWorker` (no process group, no sharding).

    Every trainer group offers ``call(method, *args)`` (run a worker method on every rank,
    return rank 0's result), ``sync_weights(engine, version)``, ``save(dir)``, ``load(dir)``
    and ``shutdown()``.
    """

    def __init__(self, cfg: Config, base_path: Path, critic_path: Path | None, pad_id: int):
        self.worker = TrainWorker(cfg, base_path, critic_path, pad_id=pad_id)
        self.has_reference = self.worker.has_reference
        self.has_critic = self.worker.critic is not None

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.worker, method)(*args, **kwargs)

    def sync_weights(self, engine: RolloutEngine, version: int) -> dict[str, float]:
        t = time.perf_counter()
        engine.update_weights(self.worker.named_weights(), version)
        return {"time/sync": time.perf_counter() - t}

    def save(self, directory: Path) -> None:
        self.worker.save(str(directory))

    def load(self, directory: Path) -> None:
        self.worker.load(str(directory))

    def shutdown(self) -> None:
        pass
