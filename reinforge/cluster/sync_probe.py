"""The weight-sync probe of a run (:class:`reinforge.weights.probe.SyncProbe`), its tolerance
resolved from the engine's and trainer's precision."""

from __future__ import annotations

from typing import Any

import torch

from ..config import Config
from ..rollout.backends import engine_dtype
from ..train.model_trainer import autocast_dtype
from ..utils.device import resolve_device
from ..weights.probe import SyncProbe, probe_tolerance


def build_probe(cfg: Config, tokenizer: Any, cluster: Any) -> SyncProbe:
    """The probe on ``cluster.weight_sync_probe_interval``, with ``cluster.weight_sync_probe_tolerance``
    or the tolerance of the lowest precision in play (engine dtype, trainer autocast, fp8 weights or
    KV cache: :func:`~reinforge.weights.probe.probe_tolerance`)."""
    device = resolve_device(cfg.train.device)
    tolerance = probe_tolerance(
        cfg.cluster.weight_sync_probe_tolerance,
        engine_dtype(cfg.engine.dtype, device),
        autocast_dtype(cfg.model.train_dtype, device) == torch.bfloat16,
        bool(cfg.engine.quantization) or "fp8" in str(cfg.engine.kv_cache_dtype),
    )
    return SyncProbe(cfg, tokenizer, cluster, tolerance)
