"""What the planner needs from a GPU: its memory, HBM bandwidth and dense bf16 FLOP/s.

Vendors' data sheets (dense figures, no structured sparsity), matched on the name
``torch.cuda.get_device_properties(...).name`` reports; the memory is the device's own
``total_memory`` where a device is present (79.18 GiB on an H100 80GB HBM3):

======================  ==========  ===============  ==================  ==========================
GPU                     memory      HBM bandwidth    bf16 dense FLOP/s   source
======================  ==========  ===============  ==================  ==========================
H100 SXM (80GB HBM3)    80 GB       3.35 TB/s        989 T               NVIDIA H100 data sheet
H100 PCIe               80 GB       2.0 TB/s         756 T               NVIDIA H100 data sheet
H100 NVL                94 GB       3.9 TB/s         835 T               NVIDIA H100 data sheet
H200                    141 GB      4.8 TB/s         989 T               NVIDIA H200 data sheet
A100 80GB (SXM)         80 GB       2.039 TB/s       312 T               NVIDIA A100 data sheet
A100 40GB               40 GB       1.555 TB/s       312 T               NVIDIA A100 data sheet
L40S                    48 GB       0.864 TB/s       362 T               NVIDIA L40S data sheet
RTX 4090                24 GB       1.008 TB/s       165 T               Ada whitepaper (FP32 accum.)
======================  ==========  ===============  ==================  ==========================

A GPU not in the table keeps its memory (from torch) but has no bandwidth or FLOP/s: the planner
then predicts memory, not time, and says so. No GPU (a CPU run) gives ``None``: the planner falls
back to today's defaults and says so.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

GB = 10**9


@dataclass(frozen=True)
class GPU:
    """One accelerator as the planner sees it.

    Attributes:
        name: the device's name (or the table's).
        memory: bytes of device memory.
        bandwidth: HBM bytes per second (None: unknown).
        bf16_flops: dense bf16 FLOP/s (None: unknown).
        source: where the figures come from (``table``, ``torch + table``, ``torch only``).
    """

    name: str
    memory: int
    bandwidth: float | None
    bf16_flops: float | None
    source: str = "table"

    @property
    def knows_speed(self) -> bool:
        return self.bandwidth is not None and self.bf16_flops is not None


# (keys matched in order against the lower-cased device name: the more specific first)
GPUS: dict[str, GPU] = {
    "h100 pcie": GPU("NVIDIA H100 PCIe", 80 * GB, 2.0e12, 756e12),
    "h100 nvl": GPU("NVIDIA H100 NVL", 94 * GB, 3.9e12, 835e12),
    "h100": GPU("NVIDIA H100 80GB HBM3", 85_029_158_912, 3.35e12, 989e12),
    "h200": GPU("NVIDIA H200", 143_771_000_000, 4.8e12, 989e12),
    "a100 80gb": GPU("NVIDIA A100 80GB", 85_097_971_712, 2.039e12, 312e12),
    "a100": GPU("NVIDIA A100 40GB", 42_505_273_344, 1.555e12, 312e12),
    "l40s": GPU("NVIDIA L40S", 48 * GB, 0.864e12, 362e12),
    "4090": GPU("NVIDIA GeForce RTX 4090", 24 * GB, 1.008e12, 165e12),
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
