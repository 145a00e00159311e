"""One trainer process: the actor (with its reference model) and the critic, on one device.

In local mode the driver holds one worker; in Ray mode each GPU (or CPU process) runs one
inside a Ray actor and the workers form a torch process group (FSDP2). The driver calls the
same method on every worker with the same arguments; each takes its share of the samples.

A rollout step is two calls: :meth:`TrainWorker.score` (the rollout, handed over once: this rank
takes its share of whole groups and computes their old / reference log-probs, values and
advantages, kept here) and :meth:`TrainWorker.train` (the critic's and the policy's optimizer
steps on what it kept). Both return metrics only (:mod:`.rollout_share`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ..config import Config
from ..distill.teachers import rank_teacher_log_probs, student_log_probs
from ..parallel_layout import Layout
from ..records import Sample
from ..utils import trace
from ..utils.device import resolve_device
from ..weights.buckets import bucket_by_bytes
from .actor import Actor, TrainData
from .collectives import ParallelContext
from .critic import Critic
from .export import write_trainers
from .model_trainer import ModelTrainer
from .rollout_advantages import compute_advantages
from .rollout_share import RolloutBatch, RolloutShare, advantage_metrics

log = logging.getLogger(__name__)


class TrainWorker:
    """Actor (+ reference) and critic of one trainer rank.

    Args:
        cfg: the run's config.
        base_path: Hugging Face folder of the initial policy (and of the reference model).
        critic_path: initial critic weights (``gae`` only).
        rank, world_size, master_addr, master_port: this process's place in the trainers'
            process group (world size 1: no process group, no sharding).
    """

    def __init__(
        self,
        cfg: Config,
        base_path: str | Path,
        critic_path: str | Path | None = None,
        *,
        rank: int = 0,
        world_size: int = 1,
        master_addr: str = "127.0.0.1",
        master_port: int = 0,
        pad_id: int = 0,
    ):
        self.cfg = cfg
        self.base_path = Path(base_path)
        self.device = resolve_device(cfg.train.device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
            torch.cuda.set_device(self.device)
        t = cfg.train
        self.parallel = ParallelContext.init(
            rank,
            world_size,
            master_addr,
            master_port,
            self.device,
            layout=Layout.of_train(t, world_size),
            single_rank_fsdp=t.fsdp_cpu_offload,
        )
        torch.manual_seed(cfg.train.seed)
        self.actor = Actor(cfg, base_path, self.device, ref_path=base_path, parallel=self.parallel, pad_id=pad_id)
        self.critic: Critic | None = None
        if cfg.algo.needs_critic:
            self.critic = Critic(cfg, critic_path or base_path, self.device, parallel=self.parallel, pad_id=pad_id)
        self.rollout: RolloutShare | None = None  # this rank's share of the rollout, from score to train

    @property
    def has_reference(self) -> bool:
        return self.actor.has_reference

    # ------------------------------------------------------------------ a rollout step
    def score(self, batch: RolloutBatch) -> dict[str, float]:
        """Take this rank's share of ``batch`` (whole groups, :class:`RolloutShare`) and compute on it
        what training needs, kept here until :meth:`train`: the old log-probs
        (``Config.needs_old_log_probs``), the reference's (a reference model), the critic's values
        (``gae``), then the advantages and returns (:func:`compute_advantages` on these groups; the
        batch-wide statistics summed over the data-parallel ranks). Every rank must call it.

        Returns:
            ``rollout/advantage_{mean,std,abs_mean}`` over every sample's tokens and
            ``rollout/shaped_reward_mean`` (the same on every rank); when distilling
            ``distill/reverse_kl`` (mean of ``log p_student - log p_teacher`` over the student's tokens of the
            rollout) and ``distill/teacher_seconds`` (this rank's seconds in the teachers' pass).
        """
        cfg, p = self.cfg, self.parallel
        share = RolloutShare.take(batch, p.dp_rank, p.dp_size, shared_prompt=cfg.train.packing == "shared_prompt")
        samples, owned = share.samples, share.owned
        if cfg.needs_old_log_probs:
            with trace.span("old_log_probs", "train"):
                share.old_log_probs = self.actor.compute_log_probs(samples, owned=owned)
        if self.has_reference:
            with trace.span("ref_log_probs", "train"):
                share.ref_log_probs = self.actor.compute_log_probs(samples, reference=True, owned=owned)
        if self.critic is not None:
            with trace.span("values", "train"):
                share.values = self.critic.compute_values(samples, owned=owned)
        teacher = student = None
        if cfg.distill.enabled:  # on-policy distillation: the teachers score the student's own tokens
            with trace.span("teacher_log_probs", "train") as teaching:
                teacher = rank_teacher_log_probs(self.actor, samples, owned, cfg.distill)
            student = student_log_probs(samples, owned, share.old_log_probs)
        several = p.dp_size > 1
        with trace.span("advantages", "train"):
            adv = compute_advantages(
                cfg.algo,
                batch.groups,
                cfg.rollout.rollout_max_response_len,
                values=share.mine(share.values),
                old_log_probs=share.mine(share.old_log_probs),
                ref_log_probs=share.mine(share.ref_log_probs),
                turn_discount=cfg.agent.turn_discount if cfg.agent.turn_reward == "discounted" else None,
                owned=share.groups,
                batch_sum=p.sum_tensor if several else None,
                distill=cfg.distill,
                teacher_log_probs=teacher,
                student_log_probs=student,
            )
        share.advantages, share.returns = share.spread(adv.advantages), share.spread(adv.returns)
        self.rollout = share
        metrics = advantage_metrics(adv.advantages, p.sum_floats if several else None)
        metrics["rollout/shaped_reward_mean"] = float(adv.rewards.mean())
        if adv.reverse_kl is not None:
            kl = {"sum": adv.reverse_kl[0], "n": adv.reverse_kl[1]}
            kl = p.sum_floats(kl) if several else kl
            metrics["distill/reverse_kl"] = kl["sum"] / max(kl["n"], 1.0)
            metrics["distill/teacher_seconds"] = teaching.seconds
        return metrics

    def train(self, rollout_id: int) -> dict[str, float]:
        """The critic's optimizer steps (``gae``), then, after ``critic.num_warmup_rollouts``, the
        policy's, on the share :meth:`score` kept (which is then dropped). Every rank must call it.

        Returns:
            the ``critic/*`` and ``train/*`` metrics and, with a critic, ``time/train_critic`` (s).

        Raises:
            RuntimeError: no rollout was scored since the last call.
        """
        share, self.rollout = self.rollout, None
        if share is None:
            raise RuntimeError("TrainWorker.train: no rollout on this rank (call score first)")
        metrics: dict[str, float] = {}
        if self.critic is not None:
            with trace.span("train_critic", "train") as s:
                metrics.update(self.critic.train(share.samples, share.returns, share.values, rollout_id, share.owner))
            metrics["time/train_critic"] = s.seconds
        if self.critic is None or rollout_id >= self.cfg.critic.num_warmup_rollouts:
            data = TrainData(share.samples, share.advantages, share.old_log_probs, share.ref_log_probs, share.owner)
            with trace.span("train_actor", "train"):
                metrics.update(self.actor.train(data, rollout_id))
        return metrics

    # ------------------------------------------------------------------ the sync probe
    def probe_log_probs(self, samples: list[Sample]) -> list[torch.Tensor]:
        """The policy's log-probs of every sample's response tokens (each ``[response_length]``, float32,
        on CPU), every rank holding every sample: the log-prob probe after a weight sync
        (:mod:`reinforge.weights.probe`). Every rank must call it."""
        return self.actor.compute_log_probs(samples)

    # ------------------------------------------------------------------ weights
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full policy tensors; with FSDP every rank must consume it in step."""
        return self.actor.named_weights()

    def weight_buckets(self, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """The policy's full tensors in groups of about ``bucket_bytes`` (at least one tensor each)."""
        return bucket_by_bytes(self.named_weights(), bucket_bytes)

    # ------------------------------------------------------------------ checkpoints
    def save(self, directory: str, optimizer: bool = True) -> None:
        """Write this rank's part of a checkpoint into ``directory`` (shared by all ranks):
        ``dcp/actor`` and ``dcp/critic`` (sharded, any-rank-count loadable; trainable weights only),
        with ``optimizer`` their AdamW states in ``dcp/actor_optim`` and ``dcp/critic_optim``, and from rank 0
        ``model/`` (the policy as a Hugging Face folder, LoRA merged), ``adapter/`` (with LoRA: the
        PEFT adapter folder) and ``trainer_state.pt``. When ``model/`` holds every trained weight as
        trained (full-parameter training, :attr:`~ModelTrainer.hf_folder_holds_weights`), ``dcp/actor``
        names it instead of holding a second copy."""
        trainers: dict[str, ModelTrainer] = {"actor": self.actor}
        if self.critic is not None:
            trainers["critic"] = self.critic
        write_trainers(directory, trainers, self.base_path, optimizer, share_hf_weights=True)

    def load(self, directory: str) -> list[str]:
        """Inverse of :meth:`save`. Returns the models whose optimizer state the checkpoint does not
        hold (``["actor"]``: AdamW's moments restart from zero).

        Raises:
            ValueError: a critic run from a checkpoint without a critic."""
        d = Path(directory)
        state = torch.load(d / "trainer_state.pt", map_location="cpu", weights_only=True)
        without = [] if self.actor.load(str(d / "dcp" / "actor"), state["actor"]) else ["actor"]
        if self.critic is not None:
            if "critic" not in state:
                raise ValueError(f"{d}: the checkpoint has no critic (it was not a gae run)")
            if not self.critic.load(str(d / "dcp" / "critic"), state["critic"]):
                without.append("critic")
        return without

    def release_cached_memory(self) -> None:
        """Hand the CUDA caching allocator's free blocks back to the driver (a colocated Ray rank, whose
        engine runs in another process: the rank's cached blocks are not the engine's to reuse). Called
        after setup (the full model each rank builds before sharding: 60 GB of a 15B model in fp32) and
        after each training step (the activations' peak), before the engine wakes up."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def describe(self) -> dict[str, Any]:
        info = {"rank": self.parallel.rank, "device": str(self.device)}
        if self.device.type == "cuda":
            info["gpu"] = torch.cuda.get_device_name(self.device)
        return info
