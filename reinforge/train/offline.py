"""The offline trainer: SFT, reward models, pairwise preference methods and KTO on one rank.

Every method goes through the same steps: the step's examples are split over ranks by tokens,
cut into micro-batches of whole examples (both responses of a pair together), and each
micro-batch's share of the step loss is back-propagated; losses are normalised by the step's
global counts (examples, pairs, tokens), so micro-batching and the number of ranks do not change
the update. Ranks with fewer micro-batches run zero-weight dummies: every rank issues the same
collectives in the same order, whatever its data (the hang ms-swift's CPO / SimPO / ORPO users
hit was an all-gather that not every rank issued; nothing here is conditional on a rank's data).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..algo.logprobs import token_log_probs
from ..algo.preference import OFFLINE_METHODS, OfflineBatch, sequence_logps
from ..config import Config
from ..config.model import DEFAULT_LORA_TARGETS
from ..data.offline import OfflineExample
from ..models.loading import is_native
from ..models.lora import adapters_disabled, apply_lora, has_lora
from ..models.reward_model import build_reward_model
from .batching import MicroBatch, build, plan_rows, row_length, split_by_token_budget
from .collectives import ParallelContext, partition_by_tokens
from .model_trainer import ModelTrainer, OptimizerSettings, TrainSettings
from .shard_load import frozen_model, trainer_model
from .step import forward_backward, forward_only

Batch = list[tuple[MicroBatch, list[tuple[int, int]]]]  # (example, response) of each sequence


@dataclass
class RefLogps:
    """Reference sequence log-probs per example: ``sums[i][j]`` / ``counts[i][j]`` for response j of
    example i; ``kl_sums`` / ``kl_counts`` for KTO's mismatched completion of example i."""

    sums: list[list[float]]
    counts: list[list[int]]
    kl_sums: list[float] | None = None
    kl_counts: list[int] | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def kto_mismatch(examples: list[OfflineExample]) -> list[OfflineExample]:
    """Example i's prompt with example (i + 1)'s completion (TRL's KL dataset: a fixed shift), the
    samples from which KTO estimates KL(pi || pi_ref)."""
    n = len(examples)
    return [
        OfflineExample(e.prompt_ids, [examples[(i + 1) % n].responses[0]], [examples[(i + 1) % n].loss_masks[0]])
        for i, e in enumerate(examples)
    ]


class OfflineTrainer(ModelTrainer):
    """The model of ``offline.method`` (a policy, or a reward model), its optimizer and steps.

    Args:
        cfg: the run's config (``offline``, ``train``, ``model`` sections).
        model_path: the initial weights (Hugging Face folder).
        device, parallel, pad_id: as :class:`ModelTrainer`.
        total_steps: optimizer steps of the run (the LR schedule's length).
    """

    def __init__(
        self,
        cfg: Config,
        model_path: str | Path,
        device: torch.device,
        total_steps: int,
        parallel: ParallelContext | None = None,
        pad_id: int = 0,
    ):
        o, t, m = cfg.offline, cfg.train, cfg.model
        for key in ("context_parallel_size", "pipeline_model_parallel_size"):
            if getattr(t, key) > 1:
                raise ValueError(
                    f"train.{key}={getattr(t, key)}: reinforge offline does not run it yet; set it to 1 (tensor "
                    f"parallelism and FSDP apply)"
                )
        self.o, self.info = o, OFFLINE_METHODS.info(o.method)
        self.loss_fn = OFFLINE_METHODS.get(o.method)
        self.is_reward = self.info["model"] == "reward"
        load = None
        if self.is_reward:
            model: nn.Module = build_reward_model(model_path, torch.float32, device, m.random_init, t.seed, pad_id)
        else:  # several data-parallel ranks: a meta model whose shards rank 0's weights fill (train/shard_load.py)
            model, load = trainer_model(
                model_path, device, parallel, lora=bool(m.lora_rank), cpu_offload=t.fsdp_cpu_offload,
                random_init=m.random_init, seed=t.seed,
            )  # fmt: skip
        if m.lora_rank:
            if self.is_reward:
                raise ValueError(
                    "model.lora_rank: LoRA is for the policy methods; train reward models in full (model.lora_rank=0)"
                )
            default = list(m.lora_target_modules) == DEFAULT_LORA_TARGETS  # (adds the family's own targets)
            model = apply_lora(model, m.lora_rank, m.lora_alpha, m.lora_dropout, m.lora_target_modules, default)
        optim = OptimizerSettings.for_actor(t)
        optim.total_steps = total_steps
        super().__init__(
            model.train(),
            device,
            optim,
            TrainSettings.from_config(m, t),
            name=o.method,
            parallel=parallel,
            pad_id=pad_id,
            load=load,
        )
        # preference pairs on reinforge's own model: [prompt | chosen | rejected] rows (prompt computed once)
        self.shared_prefix = self.info["data"] == "pairs" and not self.is_reward and is_native(model)
        self.ref: nn.Module | None = None
        # with LoRA the reference is the base model: the policy with its adapters off (no copy)
        if self.info.get("reference") and not o.precompute_ref_log_probs and not has_lora(self.model):
            self.ref = frozen_model(self, model_path, random_init=m.random_init, seed=t.seed)
        self.teacher: nn.Module | None = None
        if self.info.get("teacher"):  # GKD: a frozen teacher whose logits the student matches
            from ..distill.teachers import gkd_teacher_path

            path = gkd_teacher_path(cfg)
            self.teacher = frozen_model(self, path, seed=t.seed)

    @property
    def needs_reference(self) -> bool:
        return bool(self.info.get("reference"))

    # ------------------------------------------------------------------ batching
    def _batches(self, examples: list[OfflineExample], ids: list[int]) -> Batch:
        """This rank's share of examples ``ids`` as micro-batches of whole examples, padded with
        dummies to the largest count of any rank.

        Layouts (:mod:`~reinforge.train.batching`): preference pairs on reinforge's own model are
        one row per pair, ``[prompt | chosen | rejected]`` (shared prompt); SFT with
        ``offline.packing`` packs chats side by side; otherwise one padded row per response.
        """
        p = self.parallel
        if p.distributed:
            cost = [sum(len(examples[i].prompt_ids) + len(r) for r in examples[i].responses) for i in ids]
            ids = [ids[j] for j in partition_by_tokens(cost, p.dp_size)[p.dp_rank]]
        out: Batch = []
        budget = self.settings.max_tokens_per_gpu
        tokens: list[list[int]] = []
        rlen: list[int] = []
        masks: list[list[int]] = []
        seq_of: list[tuple[int, int]] = []  # (example, response) of each sequence
        units: list[list[int]] = []  # the sequences of each example
        for i in ids:
            e = examples[i]
            units.append(list(range(len(tokens), len(tokens) + len(e.responses))))
            for k, (resp, mask) in enumerate(zip(e.responses, e.loss_masks)):
                tokens.append(e.prompt_ids + resp)
                rlen.append(len(resp))
                masks.append(mask)
                seq_of.append((i, k))
        if not ids:
            plans = []
        elif self.shared_prefix:
            costs = [row_length(tokens, rlen, u, True) for u in units]
            plans = [[units[j] for j in g] for g in split_by_token_budget(costs, budget)]
        elif self.o.packing and self.info["data"] == "messages":
            plans = plan_rows(tokens, rlen, list(range(len(tokens))), "sequences", budget)
        else:
            width = max(len(u) for u in units)
            longest = [max(len(tokens[k]) for k in u) for u in units]
            plans = [
                [[k] for j in g for k in units[j]] for g in split_by_token_budget(longest, max(1, budget // width))
            ]
        for rows in plans:
            mb = build(tokens, rlen, masks, rows, self.pad_id, shared_prompt=self.shared_prefix).to(self.device)
            out.append((mb, [seq_of[k] for k in mb.indices]))
        real = len(out)
        for _ in range(p.max_int(real) - real):
            out.append((self.dummy_micro_batch(None), []))
        return out

    # ------------------------------------------------------------------ forward passes
    def _head(self, logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor]:
        """log pi(token) [n] of the response tokens (temperature 1)."""
        s = self.settings
        lp, _ = token_log_probs(logits, targets, 1.0, s.log_prob_chunk_size, fused=s.fused_kernels)
        return (lp,)

    @torch.no_grad()
    def sequence_stats(
        self, examples: list[OfflineExample], reference: bool = True
    ) -> tuple[list[list[float]], list[list[int]]]:
        """Per example and response: (log-prob sum, token count) under the reference (the frozen
        model; with LoRA the policy with its adapters off; else the policy as it is) or the policy;
        gathered on every rank."""
        model = self.ref if (reference and self.ref is not None) else self.model
        base = adapters_disabled(model) if reference and has_lora(model) else contextlib.nullcontext()
        was = model.training
        model.eval()
        sums: list[list[float] | None] = [None] * len(examples)
        counts: list[list[int] | None] = [None] * len(examples)
        batches = self._batches(examples, list(range(len(examples))))
        with base:
            values = forward_only(self, model, [mb for mb, _ in batches], self._head)
            for (mb, rows), v in zip(batches, values):
                grid = self.to_grid(mb, v[0])
                s, c = (grid * mb.loss_mask).sum(-1).tolist(), mb.loss_mask.sum(-1).long().tolist()
                for (i, k), si, ci in zip(rows, s, c):
                    if sums[i] is None:
                        sums[i], counts[i] = [0.0] * len(examples[i].responses), [0] * len(examples[i].responses)
                    sums[i][k], counts[i][k] = si, ci
        model.train(was)
        return self.gather_rows(sums), self.gather_rows(counts)

    def reference_logps(self, examples: list[OfflineExample]) -> RefLogps:
        """The reference log-probs of every example (and KTO's mismatched completions)."""
        sums, counts = self.sequence_stats(examples)
        ref = RefLogps(sums, counts)
        if self.o.method == "kto":
            ks, kc = self.sequence_stats(kto_mismatch(examples))
            ref.kl_sums, ref.kl_counts = [s[0] for s in ks], [c[0] for c in kc]
        return ref

    # ------------------------------------------------------------------ steps
    def step(
        self, examples: list[OfflineExample], ids: list[int], ref: RefLogps | None, train: bool = True
    ) -> dict[str, float]:
        """One optimizer step on examples ``ids`` (``train=False``: the same loss and metrics, no update).

        Returns:
            metrics averaged over the step's examples (``loss``, ``rewards/accuracy``, ...).
        """
        data = self.info["data"]
        if self.needs_reference and ref is None:
            ref = self._batch_reference(examples, ids)
        kl = self._kto_kl(examples, ids, ref) if self.o.method == "kto" else None
        counts = self._global_counts(examples, ids)
        self.model.train(train)
        batches = self._batches(examples, ids)

        def loss_fn(i: int, mb: MicroBatch, values) -> tuple[torch.Tensor, dict[str, float]]:
            out = values if self.teacher is not None else values[0]
            return self._micro_batch_loss(mb, batches[i][1], examples, ref, kl, counts, data, out)

        keys = self._stat_keys(data, self.is_reward) + (["jsd"] if self.teacher is not None else [])
        mbs = [mb for mb, _ in batches]
        head = None if self.is_reward else self._logits_head if self.teacher is not None else self._head
        sums = forward_backward(self, self.model, mbs, head, loss_fn, keys, backward=train)
        loss_sum = sums.pop("loss")
        sums = self.parallel.sum_floats(sums)
        if train:
            grad_norm, _ = self.optimizer_step(loss_sum, bool(batches))  # a rank of dummies holds FSDP's shards too
        metrics = {k: v / max(counts["examples"], 1.0) for k, v in sums.items()}
        metrics["loss"] = self.parallel.sum_floats({"l": loss_sum})["l"]
        for k in ("nll", "jsd"):
            if k in metrics:
                metrics[k] = sums[k] / max(counts["nll_tokens"], 1.0)
        if kl is not None:
            metrics["kl"] = float(kl)
            for k in ("desirable", "undesirable"):
                metrics[f"rewards/{k}"] = sums[f"rewards/{k}"] / max(counts[k], 1.0)
        if train:
            metrics["grad_norm"] = grad_norm
            metrics["lr"] = self.optimizer.param_groups[0]["lr"]
            metrics["skipped_steps"] = float(self.skipped_steps)
        return metrics

    def _logits_head(self, logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """GKD: (the student's logits [n, V] of the response tokens, their log-probs [n])."""
        s = self.settings
        lp, _ = token_log_probs(logits, targets, 1.0, s.log_prob_chunk_size, fused=False)
        return logits, lp

    def _divergence(self, mb: MicroBatch, student_logits: torch.Tensor) -> torch.Tensor:
        """[B] each row's generalized JSD to the teacher summed over its loss-mask tokens (GKD)."""
        from ..algo.distill import generalized_jsd
        from .step import forward

        assert self.teacher is not None
        with torch.no_grad():
            (teacher_logits,) = forward(self, self.teacher, mb, lambda logits, targets: (logits,))
        v = min(student_logits.shape[-1], teacher_logits.shape[-1])  # (padded vocabularies: the real ids are shared)
        jsd = generalized_jsd(
            student_logits[:, :v], teacher_logits[:, :v].float(), self.o.gkd_beta, self.o.gkd_temperature
        )
        return (self.to_grid(mb, jsd) * mb.loss_mask).sum(-1)

    @staticmethod
    def _stat_keys(data: str, reward_model: bool) -> list[str]:
        if reward_model:
            return ["rewards/chosen", "rewards/rejected", "rewards/accuracy", "rewards/margin"]
        if data == "pairs":
            return [
                "rewards/chosen",
                "rewards/rejected",
                "rewards/accuracy",
                "rewards/margin",
                "logps/chosen",
                "logps/rejected",
                "nll",
            ]
        if data == "unpaired":
            return ["rewards/desirable", "rewards/undesirable", "logps"]
        return ["nll"]

    def _global_counts(self, examples: list[OfflineExample], ids: list[int]) -> dict[str, float]:
        """Denominators of the step loss: examples, and the tokens of the NLL term (all ranks
        compute them from the same ids: no collective)."""
        nll_tokens = sum(sum(examples[i].loss_masks[0]) for i in ids)
        desirable = sum(bool(examples[i].desirable) for i in ids)
        return {
            "examples": float(len(ids)),
            "nll_tokens": float(nll_tokens),
            "desirable": float(desirable),
            "undesirable": float(len(ids) - desirable),
        }

    def _micro_batch_loss(
        self,
        mb: MicroBatch,
        rows: list[tuple[int, int]],
        examples: list[OfflineExample],
        ref: RefLogps | None,
        kl: torch.Tensor | None,
        counts: dict[str, float],
        data: str,
        out: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The method's objective (its ``OFFLINE_METHODS`` entry) on one micro-batch from the model's
        ``out`` (a reward model's scores [R], else the log-probs of the N response tokens); ``rows``: the
        (example, response) of each row; a dummy micro-batch (no rows) gives a zero loss that still
        ran the collectives."""
        o = self.o
        b = OfflineBatch(examples=counts["examples"], nll_tokens=counts["nll_tokens"])
        if self.is_reward:
            b.rewards = out
            if not rows:
                return b.rewards.sum() * 0.0, {}
            if o.margin_key:
                b.margin = torch.tensor([examples[i].margin for i, k in rows if k == 0], device=b.rewards.device)
            return self.loss_fn(b, o)
        mean = bool(self.info.get("length_normalized"))
        if self.teacher is not None:  # GKD: the student's logits, then its log-probs
            student_logits, out = out
            if rows:
                b.divergence = self._divergence(mb, student_logits)
            else:
                out = out + student_logits.sum() * 0.0  # (a dummy micro-batch: the logits join the graph)
        grid = self.to_grid(mb, out)
        if not rows:
            return grid.sum() * 0.0, {}
        b.seq_logps = sequence_logps(grid, mb.loss_mask, mean)
        b.token_nll = -(grid * mb.loss_mask).sum(-1)
        if ref is not None:
            b.ref_logps = self._ref_rows(rows, ref, mean, grid.device)
        if data == "unpaired":
            b.desirable = torch.tensor([bool(examples[i].desirable) for i, _ in rows], device=grid.device)
            b.kl = kl
        return self.loss_fn(b, o)

    @staticmethod
    def _ref_rows(rows: list[tuple[int, int]], ref: RefLogps, mean: bool, device: torch.device) -> torch.Tensor:
        """The reference's sequence log-prob of each row (token means with ``mean``)."""

        def value(i: int, k: int) -> float:
            return ref.sums[i][k] / max(ref.counts[i][k], 1) if mean else ref.sums[i][k]

        return torch.tensor([value(i, k) for i, k in rows], device=device)

    def _batch_reference(self, examples: list[OfflineExample], ids: list[int]) -> RefLogps:
        """Reference log-probs of the step's examples from the frozen reference model (indexed like
        ``examples``; entries outside ``ids`` stay empty)."""
        sub = [examples[i] for i in ids]
        sums, counts = self.sequence_stats(sub)
        full = RefLogps([[] for _ in examples], [[] for _ in examples])
        for j, i in enumerate(ids):
            full.sums[i], full.counts[i] = sums[j], counts[j]
        if self.o.method == "kto":
            ks, kc = self.sequence_stats([kto_mismatch(examples)[i] for i in ids])
            full.kl_sums, full.kl_counts = [0.0] * len(examples), [0] * len(examples)
            for j, i in enumerate(ids):
                full.kl_sums[i], full.kl_counts[i] = ks[j][0], kc[j][0]
        return full

    def _kto_kl(self, examples: list[OfflineExample], ids: list[int], ref: RefLogps) -> torch.Tensor:
        """KTO's z: the mean over the step's examples of log pi(y'|x) - log pi_ref(y'|x) on the
        mismatched completions (policy without gradient), a global mean over ranks."""
        mism = kto_mismatch(examples)
        sums, _ = self.sequence_stats([mism[i] for i in ids], reference=False)
        diff = sum(s[0] - ref.kl_sums[i] for s, i in zip(sums, ids))
        return torch.tensor(diff / max(len(ids), 1), device=self.device)
