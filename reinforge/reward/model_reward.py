"""``reward.type: model``: samples scored by a trained reward model, in batches."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import torch

from ..models.reward_model import build_reward_model
from ..records import Sample
from ..utils.device import resolve_device

log = logging.getLogger(__name__)


class ModelReward:
    """A reward model (``reward.model_path``) on its own device, scoring prompt + response tokens.

    Samples are sorted by length and scored ``batch_size`` at a time (right-padded, the reward read
    at each sequence's last token); bf16 on CUDA, fp32 on CPU.

    Args:
        path: a reward-model folder (``*ForSequenceClassification``; `reinforge offline` with
            ``offline.method: rm`` writes one in each checkpoint's ``model/``), or a run / checkpoint
            directory of such a run (its newest checkpoint's ``model/``).
        device: ``auto`` (CUDA when available) or a torch device name.
        batch_size: sequences per forward pass.
        pad_id: padding token id.
    """

    def __init__(self, path: str, device: str = "auto", batch_size: int = 64, pad_id: int = 0):
        if not (Path(path) / "config.json").is_file():  # a run or checkpoint directory: its model/
            from ..checkpoint import resolve_checkpoint

            path = str(resolve_checkpoint(path) / "model")
        self.device = resolve_device(device)
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.model = build_reward_model(path, dtype, self.device).eval().requires_grad_(False)
        self.batch_size = batch_size
        self.pad_id = self.model.pad_token_id if self.model.pad_token_id is not None else pad_id

    @torch.no_grad()
    def __call__(self, samples: list[Sample]) -> list[float]:
        """Rewards (floats) of ``samples``, in order."""
        out = [math.nan] * len(samples)
        lengths = [len(s.tokens) for s in samples]
        order = sorted(range(len(samples)), key=lambda i: -lengths[i])  # little padding per batch
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            ids = torch.full((len(idx), lengths[idx[0]]), self.pad_id, dtype=torch.long)
            for row, i in enumerate(idx):
                ids[row, : lengths[i]] = torch.tensor(samples[i].tokens)
            rewards = self.model(ids.to(self.device))
            for i, r in zip(idx, rewards.float().cpu().tolist()):
                out[i] = r
        return out
