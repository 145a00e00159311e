"""The value model of PPO: the policy's architecture with a scalar head, trained on GAE returns."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..algo.losses import aggregate, clipped_value_loss
from ..config import Config
from ..models.families import native_models
from ..models.loading import build_model, is_native
from ..records import Sample
from ..utils import seeds
from .batching import MicroBatch
from .collectives import ParallelContext
from .model_trainer import ModelTrainer, OptimizerSettings, TrainSettings, mean_metrics, shuffled_steps
from .rollout_share import move_rows
from .step import forward_backward, forward_only


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

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        ctx=None,
        logits_mask: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Values [B, T] (fp32): V at position t estimates the return from token t + 1 on
        (``position_ids`` / ``ctx``: packed rows, as :meth:`CausalLM.forward_hidden`); with
        ``logits_mask`` (rows [n], columns [n]) only those positions' values, [n]."""
        hidden = self.backbone.forward_hidden(input_ids, position_ids, ctx)
        if logits_mask is not None:
            hidden = hidden[logits_mask]
        return self.value_head(hidden).squeeze(-1).float()


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
        model = ValueModel(backbone).train()  # (the backbone's activation checkpointing: in parallelize)
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

    @staticmethod
    def _head(values: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor]:
        """The value head's outputs are the values (V(s_t) at the position that predicts each response token)."""
        return (values,)

    @torch.no_grad()
    def compute_values(self, samples: list[Sample], owned: list[int] | None = None) -> list[torch.Tensor]:
        """Per-sample values at the response positions (fp32, CPU), one per response token: of every
        sample (computed in shares, gathered on every rank), or of the samples ``owned`` by this rank
        (kept here, None at the other entries; as :meth:`Actor.compute_log_probs`)."""
        self.model.eval()
        out: list[torch.Tensor | None] = [None] * len(samples)
        rows = list(range(len(samples))) if owned is None else owned
        mbs, _ = self.rank_micro_batches(samples, rows, split=owned is None)
        for mb, v in zip(mbs, forward_only(self, self.model, mbs, self._head)):
            if v is not None:  # (pipeline parallelism: the last stage's)
                self.split_rows(mb, self.to_grid(mb, v[0]), out)
        self.model.train()
        return self.gather_rows(out, pipeline_only=owned is not None)

    def train(
        self,
        samples: list[Sample],
        returns: list[torch.Tensor],
        old_values: list[torch.Tensor],
        rollout_id: int,
        owner: list[int],
    ) -> dict[str, float]:
        """``train.num_steps_per_rollout`` steps of the clipped value loss (token mean). ``owner``: the
        data-parallel rank holding each sample's returns and values (:attr:`TrainData.owner`; they are
        moved to the ranks that run them first)."""
        per_token = {"returns": returns, "old_values": old_values}
        batches = shuffled_steps(
            len(samples), self.num_steps, seeds.derive(self.seed, seeds.CRITIC_SHUFFLE, rollout_id)
        )
        dest = self.step_ranks(samples, batches)
        per_token = move_rows(self.parallel, per_token, [s.response_length for s in samples], owner, dest)
        return mean_metrics([self._train_step(samples, idx, per_token) for idx in batches])

    def _train_step(
        self, samples: list[Sample], idx: list[int], per_token: dict[str, list[torch.Tensor]]
    ) -> dict[str, float]:
        num_tokens = float(sum(sum(samples[i].loss_mask) for i in idx))
        mbs, _ = self.rank_micro_batches(samples, idx, per_token)

        def loss_fn(i: int, mb: MicroBatch, out) -> tuple[torch.Tensor, dict]:
            values, f, m = self.to_grid(mb, out[0]), mb.fields, mb.loss_mask
            loss_tok, clipped = clipped_value_loss(values, f["old_values"], f["returns"], self.value_clip)
            loss = aggregate(loss_tok, m, "token_mean", num_tokens=num_tokens)
            return loss, {
                "value_loss": (loss_tok.detach() * m).sum(),
                "value_clipfrac": (clipped.float() * m).sum(),
                "values": (values.detach() * m).sum(),
            }

        sums = forward_backward(self, self.model, mbs, self._head, loss_fn, ("value_loss", "value_clipfrac", "values"))
        grad_norm, _ = self.optimizer_step(sums.pop("loss"), bool(mbs))
        sums = self.parallel.sum_floats(sums)
        step = {f"critic/{k}": v / max(num_tokens, 1.0) for k, v in sums.items()}
        step["critic/grad_norm"] = grad_norm
        step["critic/lr"] = self.optimizer.param_groups[0]["lr"]
        return step
