"""The trainer processes' communication: this process's place among them and its collectives
(:class:`ParallelContext`, over the device mesh of :mod:`.mesh`), the split of a rollout's samples over the
data-parallel ranks (:func:`partition_by_tokens`) and a sharded parameter's whole tensor
(:func:`full_tensor`). Placing a model on the mesh is :mod:`.parallelize`'s.

Rule that keeps ranks from hanging: every rank issues the same collectives in the same order
whatever its data. Work is split over the data-parallel ranks by :func:`partition_by_tokens`
(the ranks of one tensor x context parallel group get the same samples); the number of
micro-batches is made equal across ranks (:meth:`ParallelContext.max_int`), ranks with fewer run
dummy micro-batches whose loss weight is 0; metrics are summed over the data-parallel ranks. Each
collective is a ``collective`` activity of the stall doctor (:func:`_collective`).
"""

from __future__ import annotations

import datetime
import heapq
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..utils import stall
from .mesh import Layout, TrainMesh
from .offload import join_single_rank_group


@dataclass
class ParallelContext:
    """This process's place among the trainer processes (rank 0 of 1 when not distributed) and,
    with several, the device mesh (:class:`~reinforge.train.mesh.TrainMesh`)."""

    rank: int = 0
    world_size: int = 1
    mesh: TrainMesh | None = None
    owns_group: bool = False  # this process made the default process group (init): close() ends it

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def layout(self) -> Layout:
        return self.mesh.layout if self.mesh is not None else Layout(self.world_size)

    @property
    def dp_rank(self) -> int:
        """Which share of the samples this rank takes (ranks of one tp x cp group share it)."""
        return self.mesh.coordinate("dp") if self.mesh is not None else self.rank

    @property
    def dp_size(self) -> int:
        return self.layout.dp

    @property
    def pp_rank(self) -> int:
        """This rank's place in its pipeline (0 without pipeline parallelism)."""
        return self.mesh.coordinate("pp") if self.mesh is not None and self.layout.pp > 1 else 0

    @property
    def pp_group(self) -> dist.ProcessGroup | None:
        """The ranks of this rank's pipeline, None when ``pipeline_model_parallel_size`` is 1."""
        return self.mesh.group("pp") if self.mesh is not None and self.layout.pp > 1 else None

    @property
    def dp_group(self) -> dist.ProcessGroup | None:
        """The data-parallel ranks' group (None: the default group, every rank, without a mesh)."""
        return self.mesh.group("dp") if self.mesh is not None else None

    @property
    def reports(self) -> bool:
        """Whether this rank speaks for its model replica's samples (one per data-parallel rank): the
        last pipeline stage (it computes the losses), tensor and context coordinate 0."""
        if self.mesh is None:
            return True
        lay, m = self.layout, self.mesh
        return (
            (lay.pp == 1 or self.pp_rank == lay.pp - 1)
            and (lay.tp == 1 or m.coordinate("tp") == 0)
            and (lay.cp == 1 or m.coordinate("cp") == 0)
        )

    @property
    def cp_group(self) -> dist.ProcessGroup | None:
        """The context-parallel group, None when ``context_parallel_size`` is 1."""
        return self.mesh.group("cp") if self.mesh is not None and self.layout.cp > 1 else None

    @classmethod
    def init(
        cls,
        rank: int,
        world_size: int,
        master_addr: str,
        master_port: int,
        device: torch.device,
        timeout_s: float = 1800,
        *,
        layout: Layout | None = None,
        single_rank_fsdp: bool = False,
    ) -> ParallelContext:
        """Join the trainers' default process group (NCCL on GPUs, gloo on CPU) and build the mesh
        of ``layout`` (:meth:`Layout.of_train` of the run's ``train`` section; default: every rank
        data parallel). ``single_rank_fsdp`` (``train.fsdp_cpu_offload`` on one rank): a process group
        and mesh of one rank, so that FSDP2 can offload (:func:`~reinforge.train.offload.join_single_rank_group`).

        Raises:
            ValueError: ``layout`` is for another number of ranks than ``world_size``.
        """
        layout = layout or Layout(world_size)
        if layout.world_size != world_size:
            raise ValueError(f"the layout {layout.words()} does not match the {world_size} trainer rank(s)")
        owns_group = not dist.is_initialized() and (world_size > 1 or single_rank_fsdp)
        if world_size > 1 and not dist.is_initialized():
            os.environ.setdefault("MASTER_ADDR", master_addr)
            os.environ.setdefault("MASTER_PORT", str(master_port))
            dist.init_process_group(
                "nccl" if device.type == "cuda" else "gloo",
                rank=rank,
                world_size=world_size,
                init_method=f"tcp://{master_addr}:{master_port}",
                timeout=datetime.timedelta(seconds=timeout_s),
                **({"device_id": device} if device.type == "cuda" else {}),
            )
        if world_size > 1:  # its stacks and collectives in the stall doctor's report (run.stall_timeout_s)
            stall.join(f"rank {rank}", rank=rank)
        if world_size == 1 and single_rank_fsdp:
            join_single_rank_group(device)
        mesh = TrainMesh.build(layout, device.type) if world_size > 1 or single_rank_fsdp else None
        return cls(rank, world_size, mesh, owns_group)

    def close(self) -> None:
        """End the default process group if :meth:`init` made it (a later run in this process
        starts from none)."""
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()
        self.owns_group = False

    def _device(self) -> torch.device:
        if dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def max_int(self, value: int) -> int:
        if not self.distributed:
            return value
        t = torch.tensor([value], dtype=torch.long, device=self._device())
        with _collective("all_reduce (max_int)"):
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def sum_floats(self, values: dict[str, float]) -> dict[str, float]:
        """Element-wise sum of a dict of floats over the data-parallel ranks (same keys on every
        rank; the ranks of one tensor / context parallel group hold the same values, counted once)."""
        if not self.distributed:
            return values
        return _all_reduce_floats(values, self.dp_group, self._device())

    def sum_tensor(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` summed element-wise over the data-parallel ranks (a collective, in float64), in its
        own dtype and device; ``t`` itself when not distributed. The ranks of one tensor / context
        parallel group or pipeline hold the same samples: counted once, as :meth:`sum_floats`."""
        if not self.distributed:
            return t
        total = t.detach().to(self._device(), torch.float64)
        with _collective("all_reduce (sum_tensor)"):
            dist.all_reduce(total, group=self.dp_group)
        return total.to(t.device, t.dtype)

    def all_to_all(self, t: torch.Tensor, send_sizes: list[int], recv_sizes: list[int]) -> torch.Tensor:
        """Rows of ``t`` to the data-parallel ranks (a collective over the ``dp`` group): the first
        ``send_sizes[0]`` rows to dp rank 0, the next ``send_sizes[1]`` to rank 1, ...; returns the
        rows received, ``recv_sizes[r]`` from rank r in rank order (each rank must know what it
        receives). ``t``: [sum(send_sizes), ...] float; the result on ``t``'s device and dtype."""
        if not self.distributed:
            return t
        out = torch.empty((sum(recv_sizes), *t.shape[1:]), dtype=t.dtype, device=self._device())
        with _collective("all_to_all"):
            dist.all_to_all_single(out, t.to(self._device()).contiguous(), recv_sizes, send_sizes, group=self.dp_group)
        return out.to(t.device)

    def sum_over_pipeline(self, values: dict[str, float]) -> dict[str, float]:
        """Element-wise sum of a dict of floats over this rank's pipeline (the last stage's sums reach
        every stage; the others hold zeros); ``values`` unchanged without pipeline parallelism."""
        group = self.pp_group
        return values if group is None else _all_reduce_floats(values, group, self._device())

    def gather_objects(self, obj: Any, dp_only: bool = False, pipeline_only: bool = False) -> list[Any]:
        """Every rank's ``obj`` (a collective); ``dp_only``: one per data-parallel rank (the ranks of
        one tensor / context parallel group hold the same samples: counted once); ``pipeline_only``:
        the ranks of this rank's pipeline (only ``[obj]`` without pipeline parallelism)."""
        if not self.distributed or (pipeline_only and self.pp_group is None):
            return [obj]
        group = self.dp_group if dp_only else None
        group = self.pp_group if pipeline_only else group
        out: list[Any] = [None] * (dist.get_world_size(group) if group is not None else self.world_size)
        with _collective("all_gather_object"):
            dist.all_gather_object(out, obj, group=group)
        return out

    def barrier(self) -> None:
        if self.distributed:
            with _collective("barrier"):
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


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a (possibly FSDP- or tensor-parallel-sharded: a DTensor) parameter; a
    collective when sharded (not on a mesh of one rank: the local tensor is the whole)."""
    if not hasattr(t, "full_tensor"):
        return t
    return t.to_local() if t.device_mesh.size() == 1 else t.full_tensor()


def _all_reduce_floats(values: dict[str, float], group: Any, device: torch.device) -> dict[str, float]:
    """``values`` summed element-wise over ``group`` (None: every rank), in float64."""
    if not values:
        return values
    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=device)
    with _collective("all_reduce (floats)"):
        dist.all_reduce(t, group=group)
    return dict(zip(keys, t.tolist()))


def _collective(op: str) -> stall.Activity:
    """``with _collective("barrier"): dist.barrier()``: this rank waits in ``op`` (the stall doctor's
    ``collective`` activity: "rank 3 waits in barrier for 600 s")."""
    return stall.busy("collective", op, rank=dist.get_rank(), world_size=dist.get_world_size())
