"""The value model of PPO: the policy's architecture with a scalar head, trained on GAE returns."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..algo.losses import aggregate, clipped_value_loss
from ..config import Config
from ..models.families import native_models
from ..models.loading import build_model, is_native, set_gradient_checkpointing
from ..records import Sample
from ..utils import seeds
from .batching import MicroBatch
from .model_trainer import ModelTrainer, OptimizerSettings, TrainSettings, mean_metrics, shuffled_steps, to_floats
from .parallel import ParallelContext


class ValueModel(nn.Module):
    """A :class:`CausalLM` backbone whose final hidden state feeds ``value_head`` (hidden -> 1).

    ``state_dict()`` keeps the backbone's Hugging Face names under ``backbone.`` plus
    ``value_head.weight`` / ``value_head.bias``.
    """

    def __init__(self, backbone: nn.Module):
        super().__init__()
        if not is_native(backbone):
            raise ValueError(f"the critic needs {native_models()} (critic.path)")
        self.backbone = backbone
        param = next(backbone.parameters())
        self.value_head = nn.Linear(backbone.args.hidden_size, 1, device=param.device, dtype=param.dtype)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None, ctx=None) -> torch.Tensor:
        """Values [B, T] (fp32): V at position t estimates the return from token t + 1 on
        (``position_ids`` / ``ctx``: packed rows, as :meth:`CausalLM.forward_hidden`)."""
        return self.value_head(self.backbone.forward_hidden(input_ids, position_ids, ctx)).squeeze(-1).float()


class Critic(ModelTrainer):
    """Value model, its AdamW optimizer and LR schedule (``critic.*`` settings)."""

    def __init__(
        self,
        cfg: Config,
        path: str | Path,
        device: torch.device,
        parallel: ParallelContext | None = None,
        pad_id: int = 0,
    ):
        c, t, m = cfg.critic, cfg.train, cfg.model
        backbone = build_model(path, torch.float32, device, random_init=m.random_init, seed=t.seed)
        set_gradient_checkpointing(backbone, m.gradient_checkpointing, m.recompute_num_layers)
        model = ValueModel(backbone).train()
        super().__init__(
            model,
            device,
            OptimizerSettings.for_critic(c, t),
            TrainSettings.from_config(m, t),
            name="critic",
            parallel=parallel,
            pad_id=pad_id,
        )
        self.value_clip, self.num_steps, self.seed = c.value_clip, t.num_steps_per_rollout, t.seed

    def _values(self, mb: MicroBatch) -> torch.Tensor:
        """V(s_t) on the [S, L] response grid: the value at the position that predicts each response token."""
        shard = self.sequence_shard(mb)
        with self.autocast():
            if shard is None:
                values = self.model(mb.input_ids, mb.position_ids, mb.attention())[mb.logit_rows, mb.logit_cols]
            else:  # context parallelism: this rank's positions, then all N values on every rank of the group
                values = shard.gather(self.model(shard.input_ids, shard.position_ids, shard.ctx)[shard.index])
        return self.to_grid(mb, values)

    @torch.no_grad()
    def compute_values(self, samples: list[Sample]) -> list[torch.Tensor]:
        """Per-sample values at the response positions (fp32, CPU), one per response token."""
        self.model.eval()
        out: list[torch.Tensor | None] = [None] * len(samples)
        mbs, _ = self.rank_micro_batches(samples, list(range(len(samples))))
        for mb in mbs:
            self.split_rows(mb, self._values(mb), out)
        self.model.train()
        return self.gather_rows(out)

    def train(
        self, samples: list[Sample], returns: list[torch.Tensor], old_values: list[torch.Tensor], rollout_id: int
    ) -> dict[str, float]:
        """``train.num_steps_per_rollout`` steps of the clipped value loss (token mean)."""
        per_token = {"returns": returns, "old_values": old_values}
        batches = shuffled_steps(
            len(samples), self.num_steps, seeds.derive(self.seed, seeds.CRITIC_SHUFFLE, rollout_id)
        )
        return mean_metrics([self._train_step(samples, idx, per_token) for idx in batches])

    def _train_step(
        self, samples: list[Sample], idx: list[int], per_token: dict[str, list[torch.Tensor]]
    ) -> dict[str, float]:
        num_tokens = float(sum(sum(samples[i].loss_mask) for i in idx))
        sums: dict[str, float | torch.Tensor] = {"value_loss": 0.0, "value_clipfrac": 0.0, "values": 0.0}
        loss_sum: float | torch.Tensor = 0.0
        mbs, _ = self.rank_micro_batches(samples, idx, per_token)
        for mb in mbs:
            values = self._values(mb)
            f = mb.fields
            loss_tok, clipped = clipped_value_loss(values, f["old_values"], f["returns"], self.value_clip)
            loss = aggregate(loss_tok, mb.loss_mask, "token_mean", num_tokens=num_tokens)
            (loss * self.loss_scale).backward()
            loss_sum += loss.detach()
            m = mb.loss_mask
            sums["value_loss"] += (loss_tok.detach() * m).sum()
            sums["value_clipfrac"] += (clipped.float() * m).sum()
            sums["values"] += (values.detach() * m).sum()
        sums = to_floats({**sums, "loss": loss_sum})
        grad_norm, _ = self.optimizer_step(sums.pop("loss"), bool(mbs))
        sums = self.parallel.sum_floats(sums)
        step = {f"critic/{k}": v / max(num_tokens, 1.0) for k, v in sums.items()}
        step["critic/grad_norm"] = grad_norm
        step["critic/lr"] = self.optimizer.param_groups[0]["lr"]
        return step
