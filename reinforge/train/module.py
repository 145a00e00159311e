"""What the actor and the critic share: optimizer, LR schedule, precision, micro-batches, guarded steps."""

from __future__ import annotations

import contextlib
import logging
import math
from typing import Any

import torch
from torch import nn

from ..config import Config
from ..rollout.types import Sample
from .batching import MicroBatch, collate, split_by_token_budget
from .schedule import lr_multiplier

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class TrainModule:
    """A model with its AdamW optimizer and LR schedule.

    Precision: fp32 parameters and optimizer state; on CUDA the forward pass runs under
    bf16 autocast (``model.train_dtype: auto | bf16``), on CPU in fp32.
    """

    def __init__(self, cfg: Config, model: nn.Module, device: torch.device, *, lr: float, warmup: int,
                 clip_grad: float, weight_decay: float, name: str):
        self.cfg, self.model, self.device, self.name = cfg, model, device, name
        self.clip_grad = clip_grad
        t = cfg.train
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params, lr=lr, betas=(t.adam_beta1, t.adam_beta2), eps=t.adam_eps, weight_decay=weight_decay,
            **({"fused": True} if device.type == "cuda" else {}))
        total = t.num_rollout * t.num_steps_per_rollout
        min_ratio = t.min_lr / t.lr
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: lr_multiplier(step, warmup, total, t.lr_decay_style, min_ratio))
        self.pad_id = 0
        self.skipped_steps = 0

    def autocast_dtype(self) -> torch.dtype | None:
        mode = self.cfg.model.train_dtype
        if mode == "fp32" or (mode == "auto" and self.device.type != "cuda"):
            return None
        return torch.bfloat16

    def autocast(self):
        dtype = self.autocast_dtype()
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def micro_batches(self, samples: list[Sample], indices: list[int],
                      per_token: dict[str, list[torch.Tensor]] | None = None) -> list[MicroBatch]:
        """Token-budget micro-batches (``train.max_tokens_per_gpu``) of ``samples[indices]`` on the device."""
        tokens = [s.tokens for s in samples]
        groups = split_by_token_budget([len(tokens[i]) for i in indices], self.cfg.train.max_tokens_per_gpu)
        rlen = [s.response_length for s in samples]
        masks = [s.loss_mask for s in samples]
        return [collate(tokens, rlen, masks, [indices[j] for j in g], self.pad_id, per_token).to(self.device)
                for g in groups]

    def optimizer_step(self, loss_sum: float, had_batches: bool) -> tuple[float, bool]:
        """Clip, then apply the accumulated gradients unless the loss or gradient norm is
        NaN/Inf (then they are dropped and ``skipped_steps`` counts it). A step with no
        micro-batch (every advantage zero) applies a zero gradient, as a full pass would.

        Returns:
            (gradient norm before clipping, whether the step was applied).
        """
        if not had_batches:
            for p in self.model.parameters():
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad))
        applied = math.isfinite(grad_norm) and math.isfinite(loss_sum)
        if applied:
            self.optimizer.step()
            self.scheduler.step()
        else:
            self.skipped_steps += 1
            log.warning("%s: skipping an optimizer step: loss=%s grad_norm=%s (not finite)", self.name, loss_sum,
                        grad_norm)
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm, applied

    @staticmethod
    def to_grid(mb: MicroBatch, values: torch.Tensor) -> torch.Tensor:
        """Values at the N response positions -> [B, T - 1] grid (0 elsewhere)."""
        grid = torch.zeros(mb.response_mask.shape, dtype=values.dtype, device=values.device)
        grid[mb.response_mask] = values
        return grid

    @staticmethod
    def split_rows(mb: MicroBatch, grid: torch.Tensor, out: list[Any]) -> None:
        """Per-sample response vectors (fp32, CPU) from a grid, into ``out[sample index]``."""
        for row, i in enumerate(mb.indices):
            out[i] = grid[row][mb.response_mask[row]].detach().float().cpu()

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.skipped_steps = int(state.get("skipped_steps", 0))


def split_steps(indices: list[int], steps: int) -> list[list[int]]:
    """``steps`` nearly equal consecutive chunks of ``indices`` (all of them used)."""
    n = len(indices)
    bounds = [round(i * n / steps) for i in range(steps + 1)]
    return [indices[bounds[i]:bounds[i + 1]] for i in range(steps)]
