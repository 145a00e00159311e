"""The planner (issue 37): memory and time of every phase of a run from the model's shape, the GPU,
the lengths and the layout; ``auto`` keys chosen within memory; training settings that cannot fit
refused at start. :mod:`.hardware` (GPU table), :mod:`.model` (the pure model, its formulas and their
calibration), :mod:`.planner` (from a config: choices, refusals, the table). docs/planner.md."""

from .hardware import GPU, GPUS, detect, lookup, named
from .model import Arch, Breakdown, Workload, memory_plan, times
from .planner import (
    AUTO,
    AUTO_KEYS,
    Plan,
    TrainingOutOfMemory,
    auto_keys,
    format_plan,
    out_of_memory,
    resolve_config,
    training_problems,
)

__all__ = [
    "GPU",
    "GPUS",
    "detect",
    "lookup",
    "named",
    "Arch",
    "Breakdown",
    "Workload",
    "memory_plan",
    "times",
    "AUTO",
    "AUTO_KEYS",
    "Plan",
    "TrainingOutOfMemory",
    "auto_keys",
    "format_plan",
    "out_of_memory",
    "resolve_config",
    "training_problems",
]
