"""Rollout backends: the registry of engines and the one place an engine is built.

``rollout.backend`` names an entry of :data:`BACKENDS`; its factory receives an
:class:`EngineSpec` (built from the config by :func:`engine_spec`, nowhere else) and returns a
:class:`~reinforge.rollout.types.RolloutEngine`. Each backend's module is imported only when it
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
from .types import RolloutEngine

if TYPE_CHECKING:
    from ..config import Config, RolloutConfig

BACKENDS: Registry[Callable[["EngineSpec"], RolloutEngine]] = Registry("rollout backend", "rollout.backend")
BACKENDS.register("embedded", "reinforge.rollout.embedded:from_spec")
BACKENDS.register("hf", "reinforge.rollout.hf_engine:from_spec")
BACKENDS.register("vllm", "reinforge.rollout.vllm_engine:from_spec", tensor_parallel=True)
BACKENDS.register("sglang", "reinforge.rollout.sglang_engine:from_spec", tensor_parallel=True)


@dataclass
class EngineSpec:
    """What a backend needs to build one engine.

    Attributes:
        rollout: the ``rollout`` config section (sizes, sampling seed, backend options).
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

    rollout: "RolloutConfig"
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
    """``rollout.dtype``: ``auto`` is bf16 on CUDA and fp32 elsewhere."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return torch.bfloat16 if dtype == "bf16" else torch.float32


def engine_spec(cfg: "Config", model_path: Path, tokenizer: Any, device: torch.device, max_model_len: int,
                index: int = 0) -> EngineSpec:
    """The :class:`EngineSpec` of engine ``index`` of a run."""
    r, c = cfg.rollout, cfg.cluster
    return EngineSpec(
        rollout=r, model_path=Path(model_path), tokenizer=tokenizer, device=device,
        dtype=engine_dtype(r.dtype, device), max_model_len=max_model_len, seed=r.seed + index, index=index,
        tensor_parallel_size=c.rollout_num_gpus_per_engine,
        num_engines=1 if c.mode == "ray" else max(1, c.rollout_num_gpus // c.rollout_num_gpus_per_engine),
        colocate=c.colocate, bucket_bytes=c.weight_sync_bucket_mb << 20, log_dir=Path(cfg.run.output_dir),
        random_init=cfg.model.random_init, init_seed=cfg.train.seed)


def build_engine(spec: EngineSpec) -> RolloutEngine:
    """Build the engine ``spec.rollout.backend`` names (importing its module now).

    Raises:
        KeyError: the backend is not registered (the message lists those that are).
        ImportError: the backend's library is not installed (the message says what to install).
    """
    return BACKENDS.get(spec.rollout.backend)(spec)
