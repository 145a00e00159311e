"""Offload for one GPU: AdamW's state off the GPU (``train.optimizer_offload``) and FSDP2's CPU
offload on a single trainer rank (``train.fsdp_cpu_offload`` in local mode).

``train.optimizer_offload`` (verl's name): :class:`OffloadedAdamW` keeps the two moments of every
parameter in the CPU's memory, page-locked (:class:`HostBuffers`: a moment of 1 MiB or more is an
anonymous mapping of its own registered with ``cudaHostRegister``, so a 192 MB moment takes 192 MB
and not the next power of two, as torch's pinned allocator rounds; smaller ones come from that
allocator),
and runs the step on the GPU a chunk of parameters at a time: the chunk's moments are copied in
on a side stream while the previous chunk is updated, updated by the same (fused) AdamW kernel,
and copied back. The GPU holds the fp32 parameters and gradients and one or two chunks of
moments (``CHUNK_BYTES`` of parameters each); the update is element-wise, so it is bit-for-bit
the step of the plain optimizer. For an 8B model: 64 GB of parameters and gradients on the GPU,
64 GB of moments on the host, about 130 GB over PCIe per step. The step counters (scalars) stay on
the parameters' device.

``train.fsdp_cpu_offload`` with one trainer rank: FSDP2 needs a device mesh, so the one process
joins a process group of its own (world size 1, an in-memory store, NCCL on a GPU and gloo on
the CPU) and the model is wrapped by ``fully_shard`` over that one-rank mesh with
``CPUOffloadPolicy``: parameters, gradients and AdamW's state live on the CPU and each decoder
layer's parameters visit the GPU for its forward and backward; the step runs on the CPU.
"""

from __future__ import annotations

import logging
import math
import mmap
import weakref
from collections.abc import Hashable
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 30  # parameters per step chunk (their two fp32 moments: twice that on the GPU at a time)
OWN_MAPPING_BYTES = 1 << 20  # a host buffer at least this large gets an exactly sized mapping of its own


def join_single_rank_group(device: torch.device) -> None:
    """Make this process a process group of one (FSDP2 on one rank); a no-op when one exists."""
    if dist.is_initialized():
        return
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"  # offloaded grads are normed on the CPU
    kwargs: dict[str, Any] = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, **kwargs)
    log.info("train.fsdp_cpu_offload: one trainer rank in a process group of its own (%s)", backend)


def offload_policy():
    """FSDP2's ``CPUOffloadPolicy`` (its CPU copies page-locked where CUDA is available)."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    return CPUOffloadPolicy(pin_memory=torch.cuda.is_available())


class HostBuffers:
    """Page-locked CPU tensors that live as long as this object.

    With CUDA, a buffer of at least :data:`OWN_MAPPING_BYTES` is an anonymous ``mmap`` of exactly its
    size (page-aligned, sharing no page with another allocation, which ``cudaHostRegister`` refuses:
    "already mapped") registered with CUDA, and unregistered when replaced or when this object goes
    (before its mapping is unmapped); smaller ones come from torch's pinned allocator. Without CUDA
    they are plain CPU tensors. A registration that fails is logged once and the buffer stays
    unpinned (slower copies, the same values)."""

    def __init__(self) -> None:
        self._tensors: dict[Hashable, torch.Tensor] = {}
        self._maps: dict[Hashable, tuple[mmap.mmap, int]] = {}  # key -> (mapping, registered address or 0)
        self._registered: set[int] = set()  # shared with the finalizer (it must not hold self)
        self._warned = False
        weakref.finalize(self, _unregister_all, self._registered)

    def get(self, key: Hashable, like: torch.Tensor) -> torch.Tensor:
        """The buffer ``key``, shaped and typed like ``like`` (made, or remade, on demand)."""
        t = self._tensors.get(key)
        if t is not None and t.shape == like.shape and t.dtype == like.dtype:
            return t
        self._drop(key)
        t = self._tensors[key] = self._make(key, like.shape, like.dtype)
        return t

    def _make(self, key: Hashable, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if not torch.cuda.is_available() or nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        if nbytes < OWN_MAPPING_BYTES:
            return torch.empty(shape, dtype=dtype, pin_memory=True)
        m = mmap.mmap(-1, nbytes)
        t = torch.frombuffer(m, dtype=dtype).view(shape)
        cudart = torch.cuda.cudart()
        err = cudart.cudaHostRegister(t.data_ptr(), nbytes, 0)
        ptr = t.data_ptr() if int(err) == 0 else 0
        if ptr:
            self._registered.add(ptr)
        else:
            cudart.cudaGetLastError()  # clear it: torch's next CUDA call would raise it
            if not self._warned:
                log.warning("train.optimizer_offload: cudaHostRegister failed (%s): unpinned copies are slower", err)
                self._warned = True
        self._maps[key] = (m, ptr)
        return t

    def _drop(self, key: Hashable) -> None:
        self._tensors.pop(key, None)
        m, ptr = self._maps.pop(key, (None, 0))
        if ptr:
            self._registered.discard(ptr)
            torch.cuda.cudart().cudaHostUnregister(ptr)


def _unregister_all(registered: set[int]) -> None:
    if registered and torch.cuda.is_available():
        cudart = torch.cuda.cudart()
        for ptr in registered:
            cudart.cudaHostUnregister(ptr)
        registered.clear()


def _is_moment(key: Hashable, value: Any) -> bool:
    return key != "step" and isinstance(value, torch.Tensor) and value.dim() > 0


class OffloadedAdamW(torch.optim.AdamW):
    """AdamW whose moments live in page-locked CPU memory and visit the GPU chunk by chunk for the
    step (see the module doc). Its ``state_dict`` / ``load_state_dict`` are AdamW's (checkpoints
    are interchangeable with the plain optimizer's); loaded moments stay on the CPU."""

    def __init__(self, params, chunk_bytes: int = CHUNK_BYTES, **kwargs):
        super().__init__(params, **kwargs)
        self.chunk_bytes = chunk_bytes
        self._streams: tuple[torch.cuda.Stream, torch.cuda.Stream] | None = None
        self._host = HostBuffers()
        self.register_load_state_dict_post_hook(lambda opt: opt._adopt_loaded())

    def _chunks(self) -> list[list[torch.nn.Parameter]]:
        """The parameters with gradients in consecutive groups of about ``chunk_bytes``."""
        out: list[list[torch.nn.Parameter]] = [[]]
        size = 0
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if size >= self.chunk_bytes:
                    out.append([])
                    size = 0
                out[-1].append(p)
                size += p.numel() * p.element_size()
        return [c for c in out if c]

    @torch.no_grad()
    def step(self, closure=None):
        """One AdamW step, a chunk of parameters at a time with its moments on their device: the
        next chunk's moments are copied in (one side stream) and the last one's copied out
        (another) while the chunk is updated; at most three chunks are on the GPU."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        groups = [g["params"] for g in self.param_groups]
        chunks = self._chunks()
        streams = self._cuda_streams() if any(p.is_cuda for c in chunks for p in c) else None
        stored: list[torch.cuda.Event] = []
        try:
            pending = self._fetch(chunks[0], streams) if chunks else None
            for i, chunk in enumerate(chunks):
                on_device, ready = pending
                if ready is not None:
                    torch.cuda.current_stream().wait_event(ready)
                if stored:
                    stored[-1].synchronize()  # the chunk before: copied out, its GPU memory free again
                pending = self._fetch(chunks[i + 1], streams) if i + 1 < len(chunks) else None
                members = set(chunk)
                for group, params in zip(self.param_groups, groups):
                    group["params"] = [p for p in params if p in members]
                for p, state in on_device.items():
                    self.state[p] = state
                super().step()
                ev = self._store(chunk, streams)
                if ev is not None:
                    stored.append(ev)
        finally:
            for group, params in zip(self.param_groups, groups):
                group["params"] = params
        if streams is not None:
            streams[1].synchronize()
        return loss

    def _cuda_streams(self) -> tuple[torch.cuda.Stream, torch.cuda.Stream]:
        """(copies in, copies out)."""
        if self._streams is None:
            self._streams = (torch.cuda.Stream(), torch.cuda.Stream())
        return self._streams

    def _fetch(self, chunk: list[torch.nn.Parameter], streams):
        """The chunk's states with the moments copied to the parameters' device (on the copy-in
        stream), and the event that marks the copies done (None on the CPU)."""
        if streams is None:
            return {p: self.state[p] for p in chunk if p in self.state}, None
        main, copy_in = torch.cuda.current_stream(), streams[0]
        out: dict[torch.nn.Parameter, dict[Hashable, Any]] = {}
        with torch.cuda.stream(copy_in):
            for p in chunk:
                if p not in self.state:
                    continue  # the first step: AdamW creates the moments on the device
                state = dict(self.state[p])
                for k, v in state.items():
                    if _is_moment(k, v) and v.device != p.device:
                        g = v.to(p.device, non_blocking=True)
                        g.record_stream(main)
                        state[k] = g
                out[p] = state
        return out, copy_in.record_event()

    def _store(self, chunk: list[torch.nn.Parameter], streams) -> torch.cuda.Event | None:
        """Copy the chunk's updated moments back into their page-locked CPU buffers (on the
        copy-out stream, after the update); returns the event that marks them done."""
        copy_out = streams[1] if streams is not None else None
        if copy_out is not None:
            copy_out.wait_stream(torch.cuda.current_stream())
        for p in chunk:
            state = self.state[p]
            for k, v in list(state.items()):
                if not (_is_moment(k, v) and v.device.type != "cpu"):
                    continue
                host = self._buffer(p, k, v)
                if copy_out is not None:
                    with torch.cuda.stream(copy_out):
                        host.copy_(v, non_blocking=True)
                    v.record_stream(copy_out)
                else:
                    host.copy_(v)
                state[k] = host
        return copy_out.record_event() if copy_out is not None else None

    def _buffer(self, p: torch.nn.Parameter, key: Hashable, like: torch.Tensor) -> torch.Tensor:
        """The page-locked CPU buffer of ``p``'s moment ``key`` (made on first use)."""
        return self._host.get((id(p), key), like)

    def _adopt_loaded(self) -> None:
        """After ``load_state_dict``: every moment into its page-locked CPU buffer (a checkpoint
        loaded in place into the buffers needs no copy)."""
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state.get(p)
                for k, v in list((state or {}).items()):
                    if _is_moment(k, v):
                        host = self._buffer(p, k, v)
                        if host.data_ptr() != v.data_ptr():
                            host.copy_(v)
                        state[k] = host

    @staticmethod
    def _process_value_according_to_param_policy(
        param: torch.Tensor,
        value: torch.Tensor,
        param_id: int,
        param_groups: list[dict[Any, Any]],
        key: Hashable = None,
    ) -> torch.Tensor:
        """Loading a state dict: the moments stay on the CPU (the plain optimizer moves them to the
        parameter's device, all at once); the step counter as AdamW places it."""
        if key != "step" and value.dim() > 0 and param.is_floating_point():
            return value.to(dtype=param.dtype, device="cpu")
        return torch.optim.Optimizer._process_value_according_to_param_policy(param, value, param_id, param_groups, key)


def build_adamw(
    params: list[torch.nn.Parameter], device: torch.device, offload: bool, fused: bool | None = None, **kwargs
) -> torch.optim.AdamW:
    """The trainer's AdamW: fused (``fused`` None: on CUDA); ``offload``: :class:`OffloadedAdamW`.

    Sharded (DTensor) and plain parameters go in two parameter groups: a fused or foreach step runs
    one kernel over a group's tensors and torch refuses to mix the two kinds in one (a pipeline x
    tensor-parallel layout without data parallelism leaves the norms unsharded).

    Raises:
        ValueError: ``offload`` with sharded (DTensor) parameters: several trainer ranks (``torchrun``)
            offload with ``train.fsdp_cpu_offload``.
    """
    if offload and any(hasattr(p, "device_mesh") for p in params):
        raise ValueError(
            "train.optimizer_offload works on one unsharded trainer rank; with several ranks (FSDP) set "
            "train.fsdp_cpu_offload=true instead"
        )
    if device.type == "cuda" if fused is None else fused:
        kwargs["fused"] = True
    sharded = [p for p in params if hasattr(p, "device_mesh")]
    groups: list[Any] = params
    if 0 < len(sharded) < len(params):
        groups = [{"params": sharded}, {"params": [p for p in params if not hasattr(p, "device_mesh")]}]
    return OffloadedAdamW(groups, **kwargs) if offload else torch.optim.AdamW(groups, **kwargs)
