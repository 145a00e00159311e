"""The policy on one device: log-prob computation and clipped policy-gradient updates."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..algo.losses import aggregate, entropy_from_logits, kl_penalty, ppo_clip_loss
from ..config import Config
from ..models.loading import build_model, is_native, named_weights
from ..rollout.types import Sample
from .batching import MicroBatch, collate, split_by_token_budget
from .schedule import lr_multiplier

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


@dataclass
class TrainData:
    """What one rollout hands to the trainer: the samples and a per-token advantage vector
    for each (``advantages[i]`` has ``samples[i].response_length`` entries)."""

    samples: list[Sample]
    advantages: list[torch.Tensor]


def response_logits(model: nn.Module, mb: MicroBatch) -> torch.Tensor:
    """Logits [N, V] at the N response positions of ``mb`` (row-major order)."""
    if is_native(model):
        hidden = model.forward_hidden(mb.input_ids)[:, :-1]
        return model.lm_head(hidden[mb.response_mask])
    out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False)
    return out.logits[:, :-1][mb.response_mask]


class Actor:
    """Policy model, optional frozen reference model, AdamW optimizer and LR schedule.

    Precision: fp32 parameters and optimizer state; on CUDA the forward pass runs under
    bf16 autocast (``model.train_dtype: auto | bf16``), on CPU in fp32.
    """

    def __init__(self, cfg: Config, model_path: str | Path, device: torch.device,
                 ref_path: str | Path | None = None):
        self.cfg = cfg
        self.device = device
        self.model_path = Path(model_path)
        t, m = cfg.train, cfg.model
        self.model = build_model(model_path, torch.float32, device, random_init=m.random_init,
                                 seed=t.seed)
        if m.gradient_checkpointing:
            if is_native(self.model):
                self.model.gradient_checkpointing = True
            else:
                self.model.gradient_checkpointing_enable()
        self.model.train()
        self.ref: nn.Module | None = None
        if cfg.algo.use_kl_loss:
            ref_dtype = torch.bfloat16 if self._autocast_dtype() is torch.bfloat16 else torch.float32
            self.ref = build_model(ref_path or model_path, ref_dtype, device, random_init=m.random_init,
                                   seed=t.seed).eval().requires_grad_(False)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params, lr=t.lr, betas=(t.adam_beta1, t.adam_beta2), eps=t.adam_eps, weight_decay=t.weight_decay,
            **({"fused": True} if device.type == "cuda" else {}))
        total_steps = t.num_rollout * t.num_steps_per_rollout
        min_ratio = t.min_lr / t.lr
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda step: lr_multiplier(step, t.lr_warmup_iters, total_steps, t.lr_decay_style, min_ratio))
        self.pad_id = 0
        self.skipped_steps = 0

    # ------------------------------------------------------------------ helpers
    def _autocast_dtype(self) -> torch.dtype | None:
        mode = self.cfg.model.train_dtype
        if mode == "fp32" or (mode == "auto" and self.device.type != "cuda"):
            return None
        return torch.bfloat16

    def _autocast(self):
        dtype = self._autocast_dtype()
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def named_weights(self):
        """(Hugging Face name, tensor) pairs of the current policy (for weight sync)."""
        return named_weights(self.model)

    def _micro_batches(self, samples: list[Sample], indices: list[int],
                       per_token: dict[str, list[torch.Tensor]] | None = None) -> list[MicroBatch]:
        tokens = [s.tokens for s in samples]
        lengths = [len(tokens[i]) for i in indices]
        groups = split_by_token_budget(lengths, self.cfg.train.max_tokens_per_gpu)
        rlen = [s.response_length for s in samples]
        masks = [s.loss_mask for s in samples]
        return [collate(tokens, rlen, masks, [indices[j] for j in g], self.pad_id, per_token).to(self.device)
                for g in groups]

    def _token_log_probs(self, model: nn.Module, mb: MicroBatch, with_entropy: bool
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """log pi(token) [N] and entropy [N] (or None) at response positions, at rollout temperature."""
        with self._autocast():
            logits = response_logits(model, mb)
        logits = logits.float() / self.cfg.rollout.rollout_temperature
        lp = torch.log_softmax(logits, dim=-1).gather(-1, mb.targets[mb.response_mask][:, None]).squeeze(-1)
        ent = None
        if with_entropy:
            ent = entropy_from_logits(logits) if self.cfg.algo.entropy_coef > 0 else None
            if ent is None:
                with torch.no_grad():
                    ent = entropy_from_logits(logits)
        return lp, ent

    @staticmethod
    def _to_grid(mb: MicroBatch, values: torch.Tensor) -> torch.Tensor:
        grid = torch.zeros(mb.response_mask.shape, dtype=values.dtype, device=values.device)
        grid[mb.response_mask] = values
        return grid

    @staticmethod
    def _split(mb: MicroBatch, grid: torch.Tensor, out: list[torch.Tensor | None]) -> None:
        for row, i in enumerate(mb.indices):
            out[i] = grid[row][mb.response_mask[row]].detach().float().cpu()

    # ------------------------------------------------------------------ public
    @torch.no_grad()
    def compute_log_probs(self, samples: list[Sample], reference: bool = False) -> list[torch.Tensor]:
        """Per-sample response log-probs (fp32, CPU) under the policy or the reference model."""
        model = self.ref if reference else self.model
        if model is None:
            raise RuntimeError("no reference model (algo.use_kl_loss is false)")
        was_training = model.training
        model.eval()
        out: list[torch.Tensor | None] = [None] * len(samples)
        for mb in self._micro_batches(samples, list(range(len(samples)))):
            lp, _ = self._token_log_probs(model, mb, with_entropy=False)
            self._split(mb, self._to_grid(mb, lp), out)
        model.train(was_training)
        return out  # type: ignore[return-value]

    def train(self, data: TrainData, rollout_id: int) -> dict[str, float]:
        """Run ``train.num_steps_per_rollout`` optimizer steps over the rollout's samples.

        Old log-probs are recomputed by the trainer before the first step; with one step per
        rollout they equal the log-probs of that step's forward pass (detached), which saves
        a forward pass. The importance weight ``exp(old - rollout)`` between trainer and
        engine is reported, and applied, truncated at ``algo.tis_clip``, when ``algo.use_tis``
        (truncated importance sampling, Yao et al. 2025, "Your Efficient RL Framework
        Secretly Brings You Off-Policy RL Training").

        Returns:
            metrics averaged over the optimizer steps (``train/...``).
        """
        cfg, a = self.cfg, self.cfg.algo
        samples = data.samples
        n = len(samples)
        per_token: dict[str, list[torch.Tensor]] = {
            "advantages": data.advantages,
            "rollout_log_probs": [torch.as_tensor(s.rollout_log_probs, dtype=torch.float32) for s in samples],
        }
        steps = cfg.train.num_steps_per_rollout
        t = time.perf_counter()
        if steps > 1:
            per_token["old_log_probs"] = self.compute_log_probs(samples)
        if self.ref is not None:
            per_token["ref_log_probs"] = self.compute_log_probs(samples, reference=True)
        logprob_time = time.perf_counter() - t
        gen = torch.Generator().manual_seed(cfg.train.seed * 1_000_003 + rollout_id)
        order = torch.randperm(n, generator=gen).tolist()
        size = n // steps
        totals: dict[str, float] = {}
        for step in range(steps):
            idx = order[step * size:(step + 1) * size]
            m = self._train_step(samples, idx, per_token)
            for k, v in m.items():
                totals[k] = totals.get(k, 0.0) + v / steps
        totals["time/logprob"] = logprob_time
        return totals

    def _train_step(self, samples: list[Sample], idx: list[int], per_token: dict[str, list[torch.Tensor]]
                    ) -> dict[str, float]:
        a = self.cfg.algo
        self.model.train()
        # Loss normalisers count every sample of the step ...
        num_tokens = float(sum(sum(samples[i].loss_mask) for i in idx))
        num_seqs = float(sum(any(samples[i].loss_mask) for i in idx))
        # ... but a sample whose advantages are all zero adds nothing to the policy-gradient
        # loss or its gradient, so without KL / entropy terms it is not run at all (early in
        # training most GRPO groups have equal rewards: this skips most of the compute).
        if self.ref is None and a.entropy_coef == 0:
            idx = [i for i in idx if bool(per_token["advantages"][i].any())]
        mbs = self._micro_batches(samples, idx, per_token)
        trained_tokens = float(sum(mb.loss_mask.sum().item() for mb in mbs))
        sums = {k: 0.0 for k in ("pg_loss", "kl", "entropy", "clipfrac", "ratio", "importance_weight",
                                 "tis_truncated", "approx_kl", "logprob_abs_diff", "loss")}
        for mb in mbs:
            lp, ent = self._token_log_probs(self.model, mb, with_entropy=True)
            lp_grid = self._to_grid(mb, lp)
            f = mb.fields
            old = f["old_log_probs"] if "old_log_probs" in f else lp_grid.detach()
            mask = mb.loss_mask
            pg, ratio, clipped = ppo_clip_loss(lp_grid, old, f["advantages"], a.eps_clip, a.eps_clip_high)
            iw = torch.exp(old - f["rollout_log_probs"])
            if a.use_tis:
                pg = pg * iw.clamp(max=a.tis_clip)
            total = pg
            kl = None
            if self.ref is not None:
                kl = kl_penalty(lp_grid, f["ref_log_probs"], a.kl_loss_type)
                total = total + a.kl_loss_coef * kl
            ent_grid = self._to_grid(mb, ent)
            if a.entropy_coef > 0:
                total = total - a.entropy_coef * ent_grid
            loss = aggregate(total, mask, a.loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs)
            loss.backward()

            def tok_sum(x: torch.Tensor) -> float:
                return float((x.detach().float() * mask).sum())

            sums["loss"] += float(loss.detach())
            sums["pg_loss"] += tok_sum(pg)
            sums["ratio"] += tok_sum(ratio)
            sums["clipfrac"] += tok_sum(clipped.float())
            sums["entropy"] += tok_sum(ent_grid)
            sums["importance_weight"] += tok_sum(iw)
            sums["tis_truncated"] += tok_sum((iw > a.tis_clip).float())
            sums["approx_kl"] += tok_sum(kl_penalty(lp_grid.detach(), old, "k3"))
            sums["logprob_abs_diff"] += tok_sum((old - f["rollout_log_probs"]).abs())
            if kl is not None:
                sums["kl"] += tok_sum(kl)
        if not mbs:  # every advantage was zero: the gradient is zero, and Adam still steps on it
            for p in self.model.parameters():
                p.grad = torch.zeros_like(p)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.train.clip_grad)
        finite = math.isfinite(float(grad_norm)) and math.isfinite(sums["loss"])
        metrics = {f"train/{k}": v / max(trained_tokens, 1.0) for k, v in sums.items() if k != "loss"}
        metrics["train/loss"] = sums["loss"]
        metrics["train/grad_norm"] = float(grad_norm)
        metrics["train/trained_token_fraction"] = trained_tokens / max(num_tokens, 1.0)
        metrics["train/lr"] = self.optimizer.param_groups[0]["lr"]
        if finite:
            self.optimizer.step()
            self.scheduler.step()
        else:
            self.skipped_steps += 1
            log.warning("skipping an optimizer step: loss=%s grad_norm=%s (not finite)", sums["loss"], float(grad_norm))
        self.optimizer.zero_grad(set_to_none=True)
        metrics["train/skipped_steps"] = float(self.skipped_steps)
        if self.ref is None:
            metrics.pop("train/kl")
        return metrics

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.skipped_steps = int(state.get("skipped_steps", 0))
