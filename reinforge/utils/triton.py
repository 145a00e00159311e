"""The optional Triton import, in one place. Triton ships with CUDA builds of torch; on a CPU
build ``triton`` and ``tl`` are None and the callers use their torch paths."""

from __future__ import annotations

import functools

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = tl = None


@functools.cache
def triton_available(device_type: str) -> bool:
    """Whether Triton kernels can run on this device type (CUDA with Triton installed)."""
    return device_type == "cuda" and triton is not None and torch.cuda.is_available()


@functools.cache
def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 132 (an H100's) elsewhere (the Triton interpreter),
    for the grid sizes of kernels that aim at a few programs per SM."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132


@functools.cache
def liger_available() -> bool:
    """Whether Liger-Kernel (the trainer's fused kernels with backward passes) can be imported."""
    try:
        import liger_kernel.ops  # noqa: F401
    except ImportError:
        return False
    return True
