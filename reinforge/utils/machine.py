"""What this machine offers: cores, CUDA devices, available memory."""

from __future__ import annotations

import os
from pathlib import Path


def machine_resources() -> dict[str, float]:
    """This machine: ``CPU`` (cores this process may use), ``GPU`` (CUDA devices), ``memory``
    (bytes available, /proc/meminfo's MemAvailable where it exists)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    gpus = 0
    try:
        import torch

        gpus = torch.cuda.device_count()
    except Exception:  # no usable CUDA: CPU mode
        gpus = 0
    memory = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                memory = float(line.split()[1]) * 1024
    except OSError:
        pass
    return {"CPU": float(cores), "GPU": float(gpus), "memory": memory}
