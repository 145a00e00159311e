"""Data parallelism for the trainer: the process group, FSDP2 sharding and rank-balanced work.

Rule that keeps ranks from hanging: every rank issues the same collectives in the same order
whatever its data. Work is split by :func:`partition_by_tokens`; the number of micro-batches
is made equal across ranks (:meth:`ParallelContext.max_int`), ranks with fewer run dummy
micro-batches whose loss weight is 0; metrics are summed across ranks.
"""

from __future__ import annotations

import datetime
import heapq
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


@dataclass
class ParallelContext:
    """This process's place among the trainer processes (rank 0 of 1 when not distributed)."""

    rank: int = 0
    world_size: int = 1

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @classmethod
    def init(cls, rank: int, world_size: int, master_addr: str, master_port: int, device: torch.device,
             timeout_s: float = 1800) -> "ParallelContext":
        """Join the trainers' default process group (NCCL on GPUs, gloo on CPU)."""
        if world_size > 1 and not dist.is_initialized():
            os.environ.setdefault("MASTER_ADDR", master_addr)
            os.environ.setdefault("MASTER_PORT", str(master_port))
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world_size,
                                    init_method=f"tcp://{master_addr}:{master_port}",
                                    timeout=datetime.timedelta(seconds=timeout_s),
                                    **({"device_id": device} if device.type == "cuda" else {}))
        return cls(rank, world_size)

    def _device(self) -> torch.device:
        if dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def max_int(self, value: int) -> int:
        if not self.distributed:
            return value
        t = torch.tensor([value], dtype=torch.long, device=self._device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def sum_floats(self, values: dict[str, float]) -> dict[str, float]:
        """Element-wise sum of a dict of floats over ranks (same keys on every rank)."""
        if not self.distributed or not values:
            return values
        keys = sorted(values)
        t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=self._device())
        dist.all_reduce(t)
        return dict(zip(keys, t.tolist()))

    def gather_objects(self, obj: Any) -> list[Any]:
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()


def partition_by_tokens(lengths: list[int], parts: int) -> list[list[int]]:
    """Split indices into ``parts`` lists with nearly equal token sums (longest-first greedy:
    each sample goes to the lightest part). Deterministic, so every rank computes the same
    split; a part may be empty when there are fewer samples than parts."""
    heap = [(0, p) for p in range(parts)]
    out: list[list[int]] = [[] for _ in range(parts)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        load, p = heapq.heappop(heap)
        out[p].append(i)
        heapq.heappush(heap, (load + lengths[i], p))
    return [sorted(p) for p in out]


def shard_model(model: nn.Module, device: torch.device, mixed_precision: bool, cpu_offload: bool) -> nn.Module:
    """Apply FSDP2 (``fully_shard``): one unit per decoder layer, the rest in the root unit.

    On CUDA with ``mixed_precision`` the unit all-gathers bf16 parameters and reduces
    gradients in fp32 (``MixedPrecisionPolicy``); ``cpu_offload`` keeps parameters, gradients
    and optimizer state on the CPU between uses (``CPUOffloadPolicy``).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    kwargs: dict[str, Any] = {"mesh": mesh}
    if mixed_precision:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    layers = _decoder_layers(model)
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    for path in ("model.layers", "backbone.model.layers", "model.model.layers"):
        obj: Any = model
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        return list(obj)
    raise ValueError(f"cannot find the decoder layers of {type(model).__name__} to shard")


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a (possibly FSDP-sharded) parameter; a collective when sharded."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t
