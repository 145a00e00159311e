"""What the planner needs from a GPU: its memory, HBM bandwidth, dense bf16 FLOP/s and the link to its peers.

Vendors' data sheets (dense figures, no structured sparsity), matched on the name
``torch.cuda.get_device_properties(...).name`` reports; the memory is the device's own
``total_memory`` where a device is present (79.18 GiB on an H100 80GB HBM3):

======================  ==========  ===============  ==================  ============  ==========================
GPU                     memory      HBM bandwidth    bf16 dense FLOP/s   link to peers source
======================  ==========  ===============  ==================  ============  ==========================
H100 SXM (80GB HBM3)    80 GB       3.35 TB/s        989 T               450 GB/s      NVIDIA H100 data sheet
H100 PCIe               80 GB       2.0 TB/s         756 T               64 GB/s       NVIDIA H100 data sheet
H100 NVL                94 GB       3.9 TB/s         835 T               300 GB/s      NVIDIA H100 data sheet
H200                    141 GB      4.8 TB/s         989 T               450 GB/s      NVIDIA H200 data sheet
A100 80GB (SXM)         80 GB       2.039 TB/s       312 T               300 GB/s      NVIDIA A100 data sheet
A100 40GB               40 GB       1.555 TB/s       312 T               300 GB/s      NVIDIA A100 data sheet
L40S                    48 GB       0.864 TB/s       362 T               32 GB/s       NVIDIA L40S data sheet
RTX 4090                24 GB       1.008 TB/s       165 T               32 GB/s       Ada whitepaper (FP32 accum.)
======================  ==========  ===============  ==================  ============  ==========================

The link is one direction of a GPU's path to the other GPUs of its node: NVLink's total over two (900 GB/s on
an H100 SXM: 450 each way; 600 on an A100 and H100 NVL's bridge), PCIe (Gen5 x16 64 GB/s, Gen4 32 GB/s) for
cards without NVLink. Between nodes: :data:`NODE_LINK_BYTES_PER_S`.

A GPU not in the table keeps its memory (from torch) but has no bandwidth or FLOP/s: the planner
then predicts memory, not time, and says so. No GPU (a CPU run) gives ``None``: the planner falls
back to today's defaults and says so.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

GB = 10**9
# one GPU's share of the network between nodes: a 400 Gb/s InfiniBand port per GPU (DGX H100)
NODE_LINK_BYTES_PER_S = 50e9


@dataclass(frozen=True)
class GPU:
    """One accelerator as the planner sees it.

    Attributes:
        name: the device's name (or the table's).
        memory: bytes of device memory.
        bandwidth: HBM bytes per second (None: unknown).
        bf16_flops: dense bf16 FLOP/s (None: unknown).
        source: where the figures come from (``table``, ``torch + table``, ``torch only``).
        link: bytes per second one way to another GPU of the node (None: unknown; module doc).
    """

    name: str
    memory: int
    bandwidth: float | None
    bf16_flops: float | None
    source: str = "table"
    link: float | None = None

    @property
    def knows_speed(self) -> bool:
        return self.bandwidth is not None and self.bf16_flops is not None


# (keys matched in order against the lower-cased device name: the more specific first)
GPUS: dict[str, GPU] = {
    "h100 pcie": GPU("NVIDIA H100 PCIe", 80 * GB, 2.0e12, 756e12, link=64e9),
    "h100 nvl": GPU("NVIDIA H100 NVL", 94 * GB, 3.9e12, 835e12, link=300e9),
    "h100": GPU("NVIDIA H100 80GB HBM3", 85_029_158_912, 3.35e12, 989e12, link=450e9),
    "h200": GPU("NVIDIA H200", 143_771_000_000, 4.8e12, 989e12, link=450e9),
    "a100 80gb": GPU("NVIDIA A100 80GB", 85_097_971_712, 2.039e12, 312e12, link=300e9),
    "a100": GPU("NVIDIA A100 40GB", 42_505_273_344, 1.555e12, 312e12, link=300e9),
    "l40s": GPU("NVIDIA L40S", 48 * GB, 0.864e12, 362e12, link=32e9),
    "4090": GPU("NVIDIA GeForce RTX 4090", 24 * GB, 1.008e12, 165e12, link=32e9),
}


def lookup(name: str) -> GPU | None:
    """The table's entry whose key occurs in ``name`` (case-insensitive; ``h100``, ``NVIDIA H200``,
    ``rtx 4090``...); None when none does."""
    low = name.lower().replace("-", " ").replace("_", " ")
    for key, gpu in GPUS.items():
        if key in low:
            return gpu
    return None


def detect(device: torch.device | str | None = None) -> GPU | None:
    """The GPU of ``device`` (default: the current CUDA device), from ``torch.cuda.get_device_properties``
    and the table; None on a CPU (or when CUDA is not available)."""
    device = torch.device(device) if device is not None else None
    if (device is not None and device.type != "cuda") or not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(device or torch.cuda.current_device())
    known = lookup(props.name)
    if known is None:
        return GPU(props.name, int(props.total_memory), None, None, "torch only")
    return replace(known, name=props.name, memory=int(props.total_memory), source="torch + table")


def named(name: str) -> GPU:
    """The table's GPU for a name given by hand (``reinforge plan --gpu h100``).

    Raises:
        ValueError: no entry matches, listing the names known.
    """
    gpu = lookup(name)
    if gpu is None:
        raise ValueError(f"--gpu {name!r}: not a GPU the planner knows; known: {', '.join(GPUS)}")
    return gpu
