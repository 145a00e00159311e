"""Rollout backends: the registry of engines and the one place an engine is built.

``engine.backend`` names an entry of :data:`BACKENDS`; its factory receives an
:class:`EngineSpec` (built from the config by :func:`engine_spec`, nowhere else) and returns a
:class:`~reinforge.records.RolloutEngine`. Each backend's module is imported only when it
is chosen (verl's ``_ROLLOUT_REGISTRY``), so vLLM or SGLang need not be installed to use the
others.

Adding a backend (docs/design.md has a worked example): write ``rollout/my_engine.py`` with a
class implementing ``RolloutEngine`` and a factory ``from_spec(spec: EngineSpec) -> engine``,
then register it here::

    BACKENDS.register("my_engine", "reinforge.rollout.my_engine:from_spec")

Registration properties: ``tensor_parallel`` (one engine may span several GPUs,
``cluster.rollout_num_gpus_per_engine > 1``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from ..utils.registry import Registry
from ..records import RolloutEngine

if TYPE_CHECKING:
    from ..config import Config, EngineConfig

BACKENDS: Registry[Callable[["EngineSpec"], RolloutEngine]] = Registry("rollout backend", "engine.backend")
BACKENDS.register("embedded", "reinforge.rollout.embedded:from_spec")
BACKENDS.register("hf", "reinforge.rollout.hf_engine:from_spec")
BACKENDS.register("vllm", "reinforge.rollout.vllm_engine:from_spec", tensor_parallel=True)
BACKENDS.register("sglang", "reinforge.rollout.sglang_engine:from_spec", tensor_parallel=True)


@dataclass
class EngineSpec:
    """What a backend needs to build one engine.

    Attributes:
        engine: the ``engine`` config section (backend, sizes, KV cache, scheduling, server options).
        model_path: Hugging Face folder of the policy (the engine's own copy is built from it;
            the loop syncs the trainer's weights into it before the first rollout).
        tokenizer: the policy's tokenizer (stop strings).
        device: where the engine runs.
        dtype: weights and KV cache dtype (:func:`engine_dtype`).
        max_model_len: longest prompt + response, in tokens.
        seed: sampling seed of this engine (``rollout.seed`` + engine index).
        index: engine index (0 in local mode).
        tensor_parallel_size: GPUs of this engine (``cluster.rollout_num_gpus_per_engine``).
        num_engines: engines this process should start (launched-server backends in local mode).
        colocate: the engine shares its GPU with a trainer (sleep mode needed).
        bucket_bytes: weight-sync bucket size (``cluster.weight_sync_bucket_mb``).
        log_dir: where launched servers write their logs.
        random_init, init_seed: ``model.random_init`` and the seed of that initialisation.
    """

    engine: "EngineConfig"
    model_path: Path
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype
    max_model_len: int
    seed: int
    index: int = 0
    tensor_parallel_size: int = 1
    num_engines: int = 1
    colocate: bool = False
    bucket_bytes: int = 256 << 20
    log_dir: Path = Path("runs/default")
    random_init: bool = False
    init_seed: int = 0


def engine_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``engine.dtype``: ``auto`` is bf16 on CUDA and fp32 elsewhere."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return torch.bfloat16 if dtype == "bf16" else torch.float32


def engine_spec(cfg: "Config", model_path: Path, tokenizer: Any, device: torch.device, max_model_len: int,
                index: int = 0) -> EngineSpec:
    """The :class:`EngineSpec` of engine ``index`` of a run."""
    e, c = cfg.engine, cfg.cluster
    return EngineSpec(
        engine=e, model_path=Path(model_path), tokenizer=tokenizer, device=device,
        dtype=engine_dtype(e.dtype, device), max_model_len=max_model_len, seed=cfg.rollout.seed + index, index=index,
        tensor_parallel_size=c.rollout_num_gpus_per_engine,
        num_engines=1 if c.mode == "ray" else max(1, c.rollout_num_gpus // c.rollout_num_gpus_per_engine),
        colocate=c.colocate, bucket_bytes=c.weight_sync_bucket_mb << 20, log_dir=Path(cfg.run.output_dir),
        random_init=cfg.model.random_init, init_seed=cfg.train.seed)


def build_engine(spec: EngineSpec) -> RolloutEngine:
    """Build the engine ``spec.engine.backend`` names (importing its module now).

    Raises:
        KeyError: the backend is not registered (the message lists those that are).
        ImportError: the backend's library is not installed (the message says what to install).
    """
    return BACKENDS.get(spec.engine.backend)(spec)
