"""Local placement: one trainer worker in the driver process, the engine beside it."""

from __future__ import annotations

from pathlib import Path

import torch

from ..config import Config
from ..records import Sample
from ..rollout.backends import build_engine, engine_spec
from ..train.rollout_share import RolloutBatch
from ..train.worker import TrainWorker
from ..utils.device import resolve_device
from ..weights.tensor import first_difference, sync_in_process
from .base import ClusterSpec
from .resources import check_placement, machine_resources


class LocalCluster:
    """Implements :class:`~reinforge.cluster.base.Cluster` with one in-process
    :class:`TrainWorker` (no process group, no sharding) and one engine; weight sync copies the
    policy's tensors into the engine in place."""

    def __init__(self, cfg: Config, spec: ClusterSpec):
        check_placement(cfg, machine_resources(), spec.base_path, spec.max_model_len)
        self.worker = TrainWorker(cfg, spec.base_path, spec.critic_path, pad_id=spec.pad_id)
        self.engine = build_engine(
            engine_spec(cfg, spec.base_path, spec.tokenizer, resolve_device(cfg.train.device), spec.max_model_len)
        )
        self.cluster_cfg = cfg.cluster
        self.offload_rollout = cfg.cluster.offload_rollout is True  # (`auto` unresolved: off, its unplanned value)
        self.offload_engine_weights = cfg.cluster.offload_engine_weights
        self.has_reference = self.worker.has_reference
        self.has_critic = self.worker.critic is not None

    def score(self, batch: RolloutBatch) -> dict[str, float]:
        """The worker scores the rollout in place (one process: nothing is copied)."""
        return self.worker.score(batch)

    def train(self, rollout_id: int) -> dict[str, float]:
        return self.worker.train(rollout_id)

    def before_train(self) -> None:
        """With ``cluster.offload_rollout`` the engine frees its KV cache (and its weights go to the CPU
        with ``cluster.offload_engine_weights``); otherwise the cache stays allocated."""
        if self.offload_rollout:
            self.engine.sleep(offload_weights=self.offload_engine_weights)

    def after_train(self) -> None:
        if self.offload_rollout:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # the trainer's cached blocks back to the driver for the KV cache
            self.engine.wake_up()

    def sync_weights(self, version: int) -> dict[str, float]:
        c = self.cluster_cfg
        return sync_in_process(
            self.worker.named_weights(), self.engine, version, c.weight_sync_bucket_mb << 20, c.verify_weight_sync
        )

    weight_transport = "in-process tensor"

    def probe_log_probs(self, samples: list[Sample]) -> list[torch.Tensor]:
        """The policy's log-probs of the samples' response tokens (the sync probe, :mod:`reinforge.weights.probe`)."""
        return self.worker.probe_log_probs(samples)

    def diagnose_weights(self) -> str | None:
        """The first tensor the engine holds differently from the policy's current weights (one
        phrase), or None (:func:`reinforge.weights.tensor.first_difference`)."""
        return first_difference(self.worker.named_weights(), self.engine, self.cluster_cfg.weight_sync_bucket_mb << 20)

    def save(self, directory: Path, optimizer: bool = True) -> None:
        self.worker.save(str(directory), optimizer)

    def load(self, directory: Path) -> list[str]:
        return self.worker.load(str(directory))

    def shutdown(self) -> None:
        self.engine.shutdown()
        self.worker.parallel.close()  # train.fsdp_cpu_offload's process group of one
