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
``cluster.rollout_num_gpus_per_engine > 1``); ``routing_record`` (it records each generated
token's experts: ``algo.use_rollout_routing_replay``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...plan.sequences import run_max_seqs
from ...records import RolloutEngine
from ...utils.registry import Registry

if TYPE_CHECKING:  # torch is imported where an engine is built, not where the config checks engine.backend
    import torch

    from ...config import Config, EngineConfig

BACKENDS: Registry[Callable[[EngineSpec], RolloutEngine]] = Registry("rollout backend", "engine.backend")
BACKENDS.register("embedded", "reinforge.rollout.backends.embedded:from_spec", routing_record=True)
BACKENDS.register("hf", "reinforge.rollout.backends.hf:from_spec")
BACKENDS.register("vllm", "reinforge.rollout.backends.vllm:from_spec", tensor_parallel=True)
BACKENDS.register("sglang", "reinforge.rollout.backends.sglang:from_spec", tensor_parallel=True)


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
        record_routes: record each generated token's experts (a mixture-of-experts model;
            ``algo.use_rollout_routing_replay``); only backends registered with ``routing_record``.
    """

    engine: EngineConfig
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
    record_routes: bool = False

    def __post_init__(self) -> None:
        from ...config.fields import unplanned

        self.engine = unplanned(self.engine)  # `auto` keys no planner resolved: their unplanned values


def engine_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``engine.dtype``: ``auto`` is bf16 on CUDA and fp32 elsewhere."""
    import torch

    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return torch.bfloat16 if dtype == "bf16" else torch.float32


def engine_config_for(cfg: Config, max_seqs: int | None = None) -> EngineConfig:
    """The ``engine`` section an engine of this run is built with: ``engine.max_num_seqs`` lowered
    to ``max_seqs`` (default :func:`~reinforge.plan.sequences.run_max_seqs`) where that is smaller, so
    the embedded engine's
    KV cache (allocated whole when it is built: slots x ``max_model_len`` tokens on a CPU) holds
    what the run can use, not the configured ceiling. Never raises the slots; ``None`` (unknown)
    keeps them. The engine queues requests beyond its slots, so a lower cap costs speed, not
    correctness."""
    from ...config.fields import unplanned

    need = run_max_seqs(cfg) if max_seqs is None else max(1, max_seqs)
    e = unplanned(cfg.engine)  # `auto` keys no planner resolved (the run resolves them first: RLLoop, the CLI)
    if need is None or need >= e.max_num_seqs:
        return e
    return dataclasses.replace(e, max_num_seqs=need)


def engine_spec(
    cfg: Config,
    model_path: Path,
    tokenizer: Any,
    device: torch.device,
    max_model_len: int,
    index: int = 0,
    max_seqs: int | None = None,
) -> EngineSpec:
    """The :class:`EngineSpec` of engine ``index`` of a run; its ``engine.max_num_seqs`` is capped
    by :func:`engine_config_for` (``max_seqs``: the most sequences the caller will submit at once,
    default :func:`~reinforge.plan.sequences.run_max_seqs`)."""
    e, c = engine_config_for(cfg, max_seqs), cfg.cluster
    return EngineSpec(
        engine=e,
        model_path=Path(model_path),
        tokenizer=tokenizer,
        device=device,
        dtype=engine_dtype(e.dtype, device),
        max_model_len=max_model_len,
        seed=cfg.rollout.seed + index,
        index=index,
        tensor_parallel_size=c.rollout_num_gpus_per_engine,
        num_engines=1 if c.mode == "ray" else max(1, c.rollout_num_gpus // c.rollout_num_gpus_per_engine),
        colocate=c.colocate,
        bucket_bytes=c.weight_sync_bucket_mb << 20,
        log_dir=Path(cfg.run.output_dir),
        random_init=cfg.model.random_init,
        init_seed=cfg.train.seed,
        record_routes=cfg.algo.use_rollout_routing_replay,
    )


def build_engine(spec: EngineSpec) -> RolloutEngine:
    """Build the engine ``spec.engine.backend`` names (importing its module now).

    Raises:
        KeyError: the backend is not registered (the message lists those that are).
        ImportError: the backend's library is not installed (the message says what to install).
        ValueError: ``spec.record_routes`` with a backend that cannot record expert routes.
    """
    factory = BACKENDS.get(spec.engine.backend)
    if spec.record_routes and not BACKENDS.info(spec.engine.backend).get("routing_record"):
        raise ValueError(
            f"algo.use_rollout_routing_replay=true needs an engine that records expert routes; "
            f"engine.backend={spec.engine.backend} does not: use engine.backend=embedded or set "
            f"algo.use_rollout_routing_replay=false"
        )
    return factory(spec)
