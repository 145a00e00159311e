"""Optimizer settings come from each model's own section: the policy's from ``train.*``, the
critic's from ``critic.*`` (the critic once followed ``train.min_lr`` / ``lr_decay_style``)."""

import pytest
import torch

from reinforge.config import load_config
from reinforge.train.critic import Critic
from reinforge.train.model_trainer import OptimizerSettings


def _lrs(trainer, steps):
    out = []
    for _ in range(steps):
        out.append(trainer.optimizer.param_groups[0]["lr"])
        trainer.optimizer.step()
        trainer.scheduler.step()
    return out


def test_critic_schedule_follows_critic_section(tiny_model_path):
    cfg = load_config(
        None,
        [
            f"model.path={tiny_model_path}",
            "algo.advantage_estimator=gae",
            "train.num_rollout=4",
            "critic.lr=1e-3",
            "critic.min_lr=1e-4",
            "critic.lr_decay_style=linear",
            "critic.lr_warmup_iters=1",
            "train.lr=1e-6",
            "train.min_lr=0.0",
            "train.lr_decay_style=cosine",
            "train.lr_warmup_iters=0",
        ],
    )
    critic = Critic(cfg, tiny_model_path, torch.device("cpu"))
    lrs = _lrs(critic, 5)
    # warm-up of one step, then linear from 1e-3 to critic.min_lr over the remaining 3 steps
    assert lrs == pytest.approx([1e-3, 1e-3, 1e-3 - 0.9e-3 / 3, 1e-3 - 1.8e-3 / 3, 1e-4])


def test_actor_and_critic_settings_are_separate():
    cfg = load_config(
        None,
        [
            "algo.advantage_estimator=gae",
            "critic.lr=3e-5",
            "critic.clip_grad=0.5",
            "critic.lr_decay_style=cosine",
            "train.lr=2e-6",
            "train.clip_grad=2.0",
        ],
    )
    actor, critic = OptimizerSettings.for_actor(cfg.train), OptimizerSettings.for_critic(cfg.critic, cfg.train)
    assert (actor.lr, actor.clip_grad, actor.decay_style) == (2e-6, 2.0, "constant")
    assert (critic.lr, critic.clip_grad, critic.decay_style) == (3e-5, 0.5, "cosine")
    assert critic.total_steps == actor.total_steps == cfg.train.num_rollout * cfg.train.num_steps_per_rollout
