"""The weight-sync process group: trainer rank 0 (the sender, rank 0) and the engines.

It lives outside the trainers' default process group (which FSDP uses), created from a
``TCPStore`` the sender hosts, so engines in other processes, GPUs or nodes can join it
without joining the trainers' group (slime's and OpenRLHF's pattern).
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

TIMEOUT = datetime.timedelta(seconds=600)


def weight_sync_group(addr: str, port: int, rank: int, size: int, backend: str = "nccl"):
    """Join (``rank`` > 0) or host (``rank`` 0) a process group of ``size`` members.

    Args:
        addr, port: the ``TCPStore`` address, hosted by rank 0.
        backend: ``nccl`` (CUDA tensors) or ``gloo`` (CPU tensors).
    Returns:
        a ``ProcessGroupNCCL`` / ``ProcessGroupGloo`` usable with :func:`broadcast`.
    """
    store = dist.TCPStore(addr, port, size, rank == 0, timeout=TIMEOUT)
    if backend == "nccl":
        return dist.ProcessGroupNCCL(store, rank, size)
    return dist.ProcessGroupGloo(store, rank, size, TIMEOUT)


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def broadcast(group, tensor: torch.Tensor, root: int = 0) -> None:
    """Broadcast ``tensor`` in place from ``root`` to every member (blocks until done)."""
    opts = dist.BroadcastOptions()
    opts.rootRank = root
    group.broadcast([tensor], opts).wait()
