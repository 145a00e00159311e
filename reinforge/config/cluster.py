"""The ``cluster`` section: placement (local or Ray, colocated or not; slime's flag names) and weight-sync
checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .fields import ConfigError, Section, opt


@dataclass
class ClusterConfig(Section):
    """Placement; see [design.md](design.md#scale-out). Names as slime's flags. On machines without
    GPUs the "GPU" counts are processes (gloo instead of NCCL)."""

    name = "cluster"
    mode: Literal["local", "ray"] = opt(
        "local", "`local`: one trainer and one engine in this process; `ray`: trainer ranks and engines as Ray actors"
    )
    actor_num_nodes: int = opt(1, "nodes with trainer ranks", ge=1)
    actor_num_gpus_per_node: int = opt(1, "trainer ranks (FSDP2 data parallel) per node", ge=1)
    rollout_num_gpus: int = opt(1, "GPUs for rollout engines (with `colocate`: shared with the trainers)", ge=1)
    rollout_num_gpus_per_engine: int = opt(
        1, "GPUs per engine (1 for the embedded engine; tensor parallelism with vLLM)", ge=1
    )
    colocate: bool = opt(
        False, "engines on the trainers' GPUs (they sleep while the trainers train) instead of their own"
    )
    ray_address: str | None = opt(
        None, "address of an existing Ray cluster (`auto`, `ray://host:10001`); `null` starts a local one"
    )
    num_cpus_per_worker: float = opt(1.0, "CPUs reserved per trainer rank and per engine", gt=0)
    weight_sync_bucket_mb: int = opt(256, "weight sync sends the policy in buckets of about this many MB", ge=1)
    offload_engine_weights: bool = opt(
        False,
        "colocate (or `offload_rollout`): free the engine's weights while the trainers train; the weight sync "
        "after training writes them again (no copy is kept: vLLM's sleep level 2; with `engine.quantization` "
        "the embedded engine moves them to host memory instead)",
    )
    offload_rollout: bool | Literal["auto"] = opt(
        "auto",
        "local mode: the engine frees its KV cache while the trainer trains (slime's `--offload-rollout`), for the "
        "trainer's activations, at the cost of reallocating the cache and its CUDA graphs each rollout (Ray `colocate` "
        "engines always do); `auto`: on where the trainer keeps more or the cache grows ([planner.md](planner.md))",
        unplanned=False,
    )
    memory_check: Literal["error", "warn", "off"] = opt(
        "error",
        "CPU-mode Ray placements: an estimate of the memory every process needs (docs/reliability.md) "
        "against the available memory: `error` refuses to start, `warn` logs, `off` skips (local mode only warns)",
    )
    max_engine_restarts: int = opt(
        3,
        "Ray: a rollout engine actor that dies during generation is replaced (new "
        "actor in its bundle, current weights re-synced, its requests re-queued) up to "
        "this many times per run; 0: the run fails",
        ge=0,
    )
    verify_weight_sync: bool = opt(True, "compare trainer and engine checksums of every synced tensor (reliability.md)")
    weight_sync_probe_interval: int = opt(10, "syncs between log-prob probes, the first included (0: none)", ge=0)
    weight_sync_probe_tolerance: float | None = opt(None, "max `sync/probe_logprob_diff`; null: by dtype", gt=0)

    @property
    def num_trainers(self) -> int:
        return self.actor_num_nodes * self.actor_num_gpus_per_node

    def check(self) -> None:
        if self.rollout_num_gpus % self.rollout_num_gpus_per_engine:
            raise ConfigError(
                f"cluster.rollout_num_gpus={self.rollout_num_gpus} is not a multiple of "
                f"cluster.rollout_num_gpus_per_engine={self.rollout_num_gpus_per_engine}"
            )
        if self.mode == "ray" and self.colocate and self.rollout_num_gpus > self.num_trainers:
            raise ConfigError(
                f"cluster.colocate=true puts engines on the trainers' GPUs: cluster.rollout_num_gpus="
                f"{self.rollout_num_gpus} exceeds actor_num_nodes * actor_num_gpus_per_node = "
                f"{self.num_trainers}"
            )
        if self.mode == "local" and (self.num_trainers > 1 or self.rollout_num_gpus > 1):
            raise ConfigError(
                "cluster.mode=local runs one trainer and one engine: set cluster.mode=ray for several GPUs or nodes"
            )
