"""Wall time of each optimizer step of a transformers / TRL ``Trainer`` (for the TRL comparisons)."""

from __future__ import annotations

import time

import torch


def step_timer(times: list[float]):
    """A ``TrainerCallback`` that appends each step's seconds (``on_step_begin`` -> ``on_step_end``,
    after a CUDA synchronize) to ``times``."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times.append(time.perf_counter() - self.t)

    return StepTimer()
