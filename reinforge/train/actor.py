"""The policy on one device: log-prob computation and clipped policy-gradient updates."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..algo.logprobs import token_log_probs
from ..algo.mismatch import mismatch_stats, token_log_ratios
from ..algo.objective import STAT_KEYS, ObjectiveInputs, policy_objective
from ..config import Config
from ..config.model import DEFAULT_LORA_TARGETS
from ..models.families import moe_models, native_models
from ..models.hub import resolve_model_path
from ..models.loading import is_native, named_weights
from ..models.lora import adapters_disabled, apply_lora, has_lora, merged_named_weights
from ..models.moe import Routing
from ..records import Sample
from ..utils import faults, seeds, trace
from ..utils.ragged import flat_tensor, split_owned
from .batching import MicroBatch
from .collectives import ParallelContext, full_tensor
from .model_trainer import ModelTrainer, OptimizerSettings, TrainSettings, autocast_dtype, mean_metrics, shuffled_steps
from .rollout_share import move_rows
from .routing_replay import replay_experts
from .shard_load import frozen_model, trainer_model
from .step import Head, RoutingFn, forward_backward, forward_only

__all__ = ["Actor", "TrainData"]


@dataclass
class TrainData:
    """What one rollout hands to the trainer: this rank's share of it once scored
    (:meth:`~reinforge.train.worker.TrainWorker.score`, which :meth:`~reinforge.train.worker.TrainWorker.train`
    passes on; the one way in: RolloutBatch -> score -> train).

    ``owner[i]`` is the data-parallel rank that holds sample ``i``'s per-token data (it scored its
    group: :class:`~reinforge.train.rollout_share.RolloutShare`); this rank's entries of
    ``advantages`` (one per response token of ``samples[i]``), ``old_log_probs`` (when
    ``Config.needs_old_log_probs``) and ``ref_log_probs`` (with a reference model) are present, the
    others may be None. Each optimizer step splits its samples over the ranks token-balanced
    (:meth:`~reinforge.train.model_trainer.ModelTrainer.rank_shares`); the rows a rank needs are moved
    to it from their holders first (:func:`~reinforge.train.rollout_share.move_rows`), rank to rank.
    """

    samples: list[Sample]
    advantages: list[torch.Tensor | None]
    old_log_probs: list[torch.Tensor | None] | None
    ref_log_probs: list[torch.Tensor | None] | None
    owner: list[int]


class Actor(ModelTrainer):
    """Policy model (fp32 master weights), optional frozen reference model, AdamW, LR schedule.

    Reads ``cfg.algo`` (losses), ``cfg.train`` / ``cfg.model`` (optimizer, precision) and the
    rollout temperature and response length (the distribution the engine sampled from).
    """

    def __init__(
        self,
        cfg: Config,
        model_path: str | Path,
        device: torch.device,
        ref_path: str | Path | None = None,
        parallel: ParallelContext | None = None,
        pad_id: int = 0,
    ):
        t, m, a = cfg.train, cfg.model, cfg.algo
        # LoRA under bf16 autocast: the frozen base's matmul weights made in bf16 (models/lora.py: hold_frozen_weights)
        low = autocast_dtype(m.train_dtype, device) if m.lora_rank else None
        # several data-parallel ranks: a meta model whose shards rank 0's weights fill (train/shard_load.py)
        model, load = trainer_model(
            model_path, device, parallel, lora=bool(m.lora_rank), cpu_offload=t.fsdp_cpu_offload,
            random_init=m.random_init, seed=t.seed, matmul_dtype=low,
        )  # fmt: skip
        if m.torch_compile and (not is_native(model) or m.lora_rank):  # (compiled in parallelize)
            raise ValueError(f"model.torch_compile needs {native_models()} without LoRA: set model.torch_compile=false")
        if m.lora_rank:
            default = list(m.lora_target_modules) == DEFAULT_LORA_TARGETS  # (adds the family's own targets)
            model = apply_lora(model, m.lora_rank, m.lora_alpha, m.lora_dropout, m.lora_target_modules, default)
        if t.moe_aux_loss_coeff > 0 and not (is_native(model) and model.args.moe_layers):
            raise ValueError(
                f"train.moe_aux_loss_coeff={t.moe_aux_loss_coeff} needs {moe_models()}; {model_path} "
                f"has no experts: set train.moe_aux_loss_coeff=0"
            )
        self.replay_routes = a.use_rollout_routing_replay
        if self.replay_routes and not (is_native(model) and model.args.moe_layers):
            raise ValueError(
                f"algo.use_rollout_routing_replay=true needs {moe_models()}; {model_path} is dense: "
                f"set algo.use_rollout_routing_replay=false"
            )
        self._moe_shape = (model.args.moe_layers, model.args.num_experts_per_tok) if self.replay_routes else None
        model.train()
        super().__init__(
            model,
            device,
            OptimizerSettings.for_actor(t),
            TrainSettings.from_config(m, t),
            name="actor",
            parallel=parallel,
            pad_id=pad_id,
            compile_layers=m.torch_compile,
            load=load,
        )
        self.cfg = cfg
        self.ref: nn.Module | None = None
        # with LoRA the reference model is the base model: the policy with its adapters off
        self.has_reference = a.needs_reference
        if a.needs_reference and not has_lora(model):
            self.ref = self._frozen(ref_path or model_path, random_init=m.random_init)
        # on-policy distillation: the checkpoint teachers, frozen and placed as the reference model is
        self.teachers: dict[str, nn.Module] = {
            name: self._frozen(resolve_model_path(path)) for name, path in cfg.distill.local_teachers().items()
        }

    def _frozen(self, path: str | Path, random_init: bool = False) -> nn.Module:
        """A frozen model of this trainer (the reference, a teacher): bf16 when the forward pass runs in bf16
        on one rank; with several ranks (or ``train.fsdp_cpu_offload``) fp32 sharded by FSDP, its compute in
        bf16 through FSDP's mixed precision and its shards on the CPU with ``train.fsdp_cpu_offload``."""
        sharded = self.parallel.distributed
        dtype = torch.bfloat16 if self.compute_dtype() is torch.bfloat16 and not sharded else torch.float32
        return frozen_model(self, path, dtype=dtype, random_init=random_init, seed=self.cfg.train.seed)

    def named_weights(self):
        """(Hugging Face name, full tensor) pairs of the current policy (for weight sync); LoRA
        adapters are merged into their base weights. With FSDP every rank must iterate it (each
        tensor is an all-gather; with pipeline parallelism also a broadcast from its stage)."""
        if has_lora(self.model):
            yield from merged_named_weights(self.model, full_tensor)
            return
        if self.pipeline is not None:  # every weight from the stage that holds it, on every rank
            yield from self.pipeline.full_named_weights(full_tensor)
            return
        for name, t in named_weights(self.model):
            yield name, full_tensor(t)

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The policy as a Hugging Face state dict on CPU (merged with LoRA; rank 0 gets it, other
        ranks {}); a collective."""
        if not has_lora(self.model):
            return self.full_state_dict()
        state = {n: t.detach().cpu() for n, t in self.named_weights()}
        return state if self.parallel.rank == 0 else {}

    def _head(self, with_entropy: bool = False, temperature: float | None = None) -> Head:
        """The log-prob head: log pi(token) [n] at the rollout temperature (or ``temperature``: a teacher's
        distribution is its own, at 1) and, ``with_entropy``, the entropy [n]
        (:func:`~reinforge.algo.logprobs.token_log_probs`: fused kernels, or chunks of tokens)."""
        chunk = self.settings.log_prob_chunk_size
        temperature = self.cfg.rollout.rollout_temperature if temperature is None else temperature
        fused = self.settings.fused_kernels

        def head(logits: torch.Tensor, targets: torch.Tensor):
            return token_log_probs(logits, targets, temperature, chunk, with_entropy=with_entropy, fused=fused)

        return head

    @torch.no_grad()
    def compute_log_probs(
        self, samples: list[Sample], reference: bool = False, owned: list[int] | None = None, teacher: str | None = None
    ) -> list[torch.Tensor]:
        """Per-sample response log-probs (fp32, CPU) under the policy, the reference model (with
        LoRA: the policy with its adapters off) or the checkpoint teacher named ``teacher``
        (``distill``; ``""``: ``distill.teacher_path``). ``owned`` None: every sample's, computed by the
        data-parallel ranks in shares and gathered on every rank; a list: the samples this rank
        holds (:class:`~reinforge.train.rollout_share.RolloutShare`), computed here and kept here
        (None at the other entries; with pipeline parallelism shared over this rank's pipeline)."""
        if reference and not self.has_reference:
            raise RuntimeError("no reference model (neither algo.use_kl_loss nor algo.use_kl_in_reward)")
        if teacher is not None and teacher not in self.teachers:
            raise RuntimeError(f"no checkpoint teacher {teacher!r} (distill.teacher_path / distill.teachers)")
        if teacher is not None:
            return self._log_probs_of(self.teachers[teacher], samples, owned, contextlib.nullcontext(), "teacher")
        model = self.ref if (reference and self.ref is not None) else self.model
        base = adapters_disabled(model) if reference and self.ref is None else contextlib.nullcontext()
        return self._log_probs_of(model, samples, owned, base, "reference" if reference else "policy")

    def _log_probs_of(
        self, model: nn.Module, samples: list[Sample], owned: list[int] | None, base, which: str
    ) -> list[torch.Tensor]:
        """:meth:`compute_log_probs` with ``model`` (``which``: policy, reference or teacher; only the
        policy's forward pass replays the rollout's experts)."""
        reference = which != "policy"
        was_training = model.training
        model.eval()
        out: list[torch.Tensor | None] = [None] * len(samples)
        mbs, _ = self.rank_micro_batches(
            samples, list(range(len(samples))) if owned is None else owned, split=owned is None
        )
        with base, self._out_of_memory_in(f"{which} log-prob pass" if reference else "log-prob pass"):
            # the reference model's router decides (no replay)
            values = forward_only(
                self,
                model,
                mbs,
                self._head(temperature=1.0 if which == "teacher" else None),
                routing=self._routing_fn(samples, replay=not reference),
            )
        for mb, v in zip(mbs, values):
            if v is not None:  # (pipeline parallelism: the last stage's)
                self.split_rows(mb, self.to_grid(mb, v[0]), out)
        model.train(was_training)
        return self.gather_rows(out, pipeline_only=owned is not None)

    @contextlib.contextmanager
    def _out_of_memory_in(self, phase: str):
        """A CUDA out-of-memory error in ``phase`` stops the run in words: the phase, the micro-batch
        (``self._current_mb``) and the keys to change (:func:`reinforge.plan.out_of_memory`)."""
        from ..plan.planner import out_of_memory

        self._current_mb = None
        try:
            yield
        except torch.OutOfMemoryError as e:
            mb = self._current_mb
            tokens, rows = (int(mb.input_ids.numel()), int(mb.input_ids.shape[0])) if mb is not None else (0, 0)
            raise out_of_memory(self.cfg, phase, tokens, rows, e) from None

    def _routing(
        self, mb: MicroBatch, samples: list[Sample], aux_loss: bool = False, replay: bool = True
    ) -> Routing | None:
        """The :class:`Routing` of a policy forward pass over ``mb``: the rollout's experts replayed at
        the response positions (``algo.use_rollout_routing_replay`` and ``replay``,
        :mod:`.routing_replay`), the load-balancing statistics (``aux_loss``); None when neither.
        With both, the load-balancing loss counts the replayed experts (those the pass used), not
        the router's own top-k as Megatron-LM's ``compute_routing_scores_for_aux_loss`` (kept by
        verl's and slime's replay) does: docs/algorithms.md#rollout-routing-replay."""
        ids = None
        if replay and self.replay_routes:
            ids = replay_experts(mb, samples, *self._moe_shape)
        if ids is None and not aux_loss:
            return None
        return Routing(replay=ids, aux_loss=aux_loss, token_mask=mb.attention_mask if aux_loss else None)

    def _routing_fn(self, samples: list[Sample], aux_loss: bool = False, replay: bool = True) -> RoutingFn | None:
        """:meth:`_routing` per micro-batch for the step module, None when a pass needs no routing."""
        if not aux_loss and not (replay and self.replay_routes):
            return None
        return lambda mb: self._routing(mb, samples, aux_loss, replay)

    def train(self, data: TrainData, rollout_id: int) -> dict[str, float]:
        """Run ``train.num_steps_per_rollout`` optimizer steps over the rollout's samples.

        Old log-probs come from ``data`` (computed when it was scored, ``Config.needs_old_log_probs``);
        with one step per rollout and none needed they equal the log-probs of that step's forward
        pass (detached), which saves a forward pass. The importance weight
        ``exp(old - rollout)`` between trainer and engine is reported, and applied when
        ``algo.use_tis`` (:func:`~reinforge.algo.losses.importance_correction`): ``tis_mode:
        truncate`` caps it at ``tis_clip`` (TIS, Yao et al. 2025, "Your Efficient RL Framework
        Secretly Brings You Off-Policy RL Training"); ``mask`` weights the tokens inside
        ``[tis_clip_low, tis_clip]`` by it and the others by 0 (masked IS, slime's IcePop);
        ``reject`` drops the others and does not weight the kept ones (verl's ``rollout_rs``).
        With the decoupled objective (``Config.decoupled_loss``) the old log-probs are the
        proximal policy's and every token is weighted by ``exp(old - rollout)``, uncapped
        (:func:`~reinforge.algo.losses.decoupled_policy_loss`), unless ``use_tis`` replaces that
        weight by its mode's factor: the same loss as without the decoupled objective
        (:func:`~reinforge.algo.objective.policy_objective`).

        Returns:
            metrics averaged over the optimizer steps (``train/...``), and the tail of the trainer-vs-engine
            mismatch (:func:`~reinforge.algo.mismatch.mismatch_stats`) over every rank's tokens: those of all
            samples when the old log-probs were computed first, else those of the samples the step ran.

        Raises:
            ValueError: ``data`` lacks the old log-probs (``Config.needs_old_log_probs``) or the reference's
                (``algo.use_kl_loss``) that scoring computes: score the rollout first.
        """
        cfg, p = self.cfg, self.parallel
        samples, owner = data.samples, data.owner
        owned = [i for i, r in enumerate(owner) if r == p.dp_rank]
        use_kl = self.has_reference and cfg.algo.use_kl_loss
        for missing, key, why in (
            (cfg.needs_old_log_probs and data.old_log_probs is None, "old_log_probs", "Config.needs_old_log_probs"),
            (use_kl and data.ref_log_probs is None, "ref_log_probs", "algo.use_kl_loss"),
        ):
            if missing:
                raise ValueError(
                    f"Actor.train: TrainData.{key} is None but {why} needs them: score the rollout first "
                    f"(TrainWorker.score computes them, TrainWorker.train passes them on)"
                )
        per_token: dict[str, list[torch.Tensor]] = {
            "advantages": data.advantages,
            "rollout_log_probs": split_owned(
                flat_tensor([s.rollout_log_probs for s in samples], np.float32),
                [len(s.rollout_log_probs) for s in samples],
            ),
        }
        steps = cfg.train.num_steps_per_rollout
        if data.old_log_probs is not None:
            per_token["old_log_probs"] = data.old_log_probs
        if use_kl:
            per_token["ref_log_probs"] = data.ref_log_probs
        batches = shuffled_steps(len(samples), steps, seeds.derive(cfg.train.seed, seeds.ACTOR_SHUFFLE, rollout_id))
        # a sample whose advantages are all zero adds nothing to the policy-gradient loss or its gradient, so
        # without KL / entropy / MoE load-balancing terms it is not run at all (early in training most GRPO groups
        # have equal rewards); the load-balancing loss covers every token of the step, so it keeps every sample
        nonzero = None
        if "ref_log_probs" not in per_token and cfg.algo.entropy_coef == 0 and cfg.train.moe_aux_loss_coeff == 0:
            nonzero = self._nonzero(per_token["advantages"], owned)
        held = per_token  # each step's share of every rank: its rows moved there from their holders
        dest = self.step_ranks(samples, [_running(step, nonzero) for step in batches])
        moving = {k: v for k, v in per_token.items() if k != "rollout_log_probs"}
        moved = move_rows(p, moving, [s.response_length for s in samples], owner, dest)
        per_token = {**moved, "rollout_log_probs": held["rollout_log_probs"]}
        ratios: list[torch.Tensor] | None = None if "old_log_probs" in per_token else []
        with self._out_of_memory_in("training step"):
            metrics = mean_metrics([self._train_step(samples, step, per_token, ratios, nonzero) for step in batches])
        if ratios is None:  # the old log-probs of every sample, each on the rank that holds it
            log_ratio = token_log_ratios(
                [held["old_log_probs"][i] for i in owned],
                [held["rollout_log_probs"][i] for i in owned],
                [samples[i].loss_mask for i in owned],
            )
            # each model replica's share (from the rank that reports), gathered
            log_ratio = torch.cat(p.gather_objects(log_ratio if p.reports else log_ratio[:0]))
        else:  # the step's forward pass gave them: each model replica's tokens (from the rank that reports), gathered
            mine = torch.cat(ratios) if ratios and p.reports else torch.zeros(0)
            log_ratio = torch.cat(p.gather_objects(mine))
        metrics.update({f"train/{k}": v for k, v in mismatch_stats(log_ratio).items()})
        return metrics

    def _nonzero(self, advantages: list[torch.Tensor | None], owned: list[int]) -> list[bool]:
        """Whether each sample has a non-zero advantage: from the advantages of the samples this rank
        holds (``owned``), the flags summed over the data-parallel ranks."""
        flags = torch.zeros(len(advantages))
        for i in owned:
            flags[i] = float(bool(advantages[i].any()))
        return (self.parallel.sum_tensor(flags) > 0.5).tolist()

    def _train_step(
        self,
        samples: list[Sample],
        step: list[int],
        per_token: dict[str, list[torch.Tensor]],
        ratios: list[torch.Tensor] | None = None,
        nonzero: list[bool] | None = None,
    ) -> dict[str, float]:
        """One optimizer step over the samples ``step``: this rank's share (token-balanced) of those of them
        that run (``nonzero`` given: those with a non-zero advantage); appends ``old - rollout`` at this
        rank's loss-mask tokens to ``ratios`` if given."""
        a = self.cfg.algo
        use_kl = "ref_log_probs" in per_token
        self.model.train()
        # Loss normalisers count every sample of the step, the skipped ones too (every rank knows every sample)
        num_tokens = float(sum(sum(samples[i].loss_mask) for i in step))
        num_seqs = float(sum(any(samples[i].loss_mask) for i in step))
        mbs, real = self.rank_micro_batches(samples, _running(step, nonzero), per_token)
        aux_coeff = self.cfg.train.moe_aux_loss_coeff
        keys = [*STAT_KEYS, *(["moe_aux_loss"] if aux_coeff > 0 else [])]  # every rank reports every key
        routes: dict[int, Routing | None] = {}
        routing = self._routing_fn(samples, aux_loss=aux_coeff > 0)

        def route(mb: MicroBatch) -> Routing | None:  # the load-balancing loss over the real tokens (no padding)
            routes[id(mb)] = r = routing(mb) if routing is not None else None
            return r

        log_ratio_grids = []

        def loss_fn(i: int, mb: MicroBatch, values) -> tuple[torch.Tensor, dict]:
            lp, ent = values
            lp_grid, f = self.to_grid(mb, lp), mb.fields
            inputs = ObjectiveInputs(
                log_probs=lp_grid,
                old_log_probs=f["old_log_probs"] if "old_log_probs" in f else lp_grid.detach(),
                rollout_log_probs=f["rollout_log_probs"],
                advantages=f["advantages"],
                mask=mb.loss_mask,
                entropy=self.to_grid(mb, ent if a.entropy_coef > 0 else ent.detach()),
                ref_log_probs=f.get("ref_log_probs"),
            )
            loss, stats = policy_objective(
                inputs,
                a,
                decoupled=self.cfg.decoupled_loss,
                num_tokens=num_tokens,
                num_seqs=num_seqs,
                norm_length=self.cfg.rollout.rollout_max_response_len,
            )
            r = routes.get(id(mb))
            if aux_coeff > 0 and r is not None:  # weighted by the micro-batch's share of the step's loss tokens
                aux = r.load_balancing_loss() * (mb.loss_mask.sum() / max(num_tokens, 1.0))
                loss = loss + aux_coeff * aux
                stats = {**stats, "moe_aux_loss": aux.detach() * num_tokens}  # mean over tokens below
            if faults.hit("nan_loss"):  # fault injection (tests); a no-op unless REINFORGE_FAULT arms it
                loss = loss * float("nan")
            if ratios is not None:
                log_ratio_grids.append((inputs.old_log_probs - inputs.rollout_log_probs, mb.loss_mask))
            return loss, stats

        sums = forward_backward(
            self, self.model, mbs, self._head(with_entropy=True), loss_fn, keys, routing=route if routing else None
        )
        sums["trained_tokens"] = float(sum(mb.loss_mask.sum() for mb in mbs[:real])) if real else 0.0
        with trace.span("optimizer_step", "train"):
            grad_norm, _ = self.optimizer_step(sums["loss"], bool(mbs))
        if ratios is not None:
            ratios += [r[m.bool()].float().cpu() for r, m in log_ratio_grids]
        sums = self.parallel.sum_floats(sums)
        trained_tokens, loss_sum = sums.pop("trained_tokens"), sums.pop("loss")
        metrics = {f"train/{k}": v / max(trained_tokens, 1.0) for k, v in sums.items()}
        metrics["train/loss"] = loss_sum
        metrics["train/grad_norm"] = grad_norm
        metrics["train/trained_token_fraction"] = trained_tokens / max(num_tokens, 1.0)
        metrics["train/lr"] = self.optimizer.param_groups[0]["lr"]
        metrics["train/skipped_steps"] = float(self.skipped_steps)
        if not use_kl:
            metrics.pop("train/kl")
        if not a.use_tis:
            metrics.pop("train/tis_truncated")
            metrics.pop("train/tis_masked")
        return metrics


def _running(step: list[int], nonzero: list[bool] | None) -> list[int]:
    """The samples of ``step`` that run: those with a non-zero advantage when ``nonzero`` is given."""
    return step if nonzero is None else [i for i in step if nonzero[i]]
