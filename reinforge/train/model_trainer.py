"""What every trained model shares (actor, critic): optimizer, LR schedule, precision,
micro-batches, rank-balanced work, NaN-guarded steps and sharded checkpoints."""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..config.fields import unplanned
from ..models.lora import has_lora, hold_frozen_weights
from ..models.transformer import CausalLM, Variant
from ..records import Sample
from ..utils import faults
from ..utils.ragged import split_owned
from ..utils.triton import liger_available
from .batching import MicroBatch, build, plan_rows, prompt_groups, row_length
from .collectives import ParallelContext, full_tensor, partition_by_tokens
from .context_parallel import SequenceShard
from .mesh import clip_grads, sum_tensor_parallel_grads
from .offload import build_adamw
from .parallelize import parallelize
from .pipeline import Pipeline
from .schedule import lr_multiplier

if TYPE_CHECKING:
    from ..config import CriticConfig, ModelConfig, TrainConfig

log = logging.getLogger(__name__)


@dataclass
class OptimizerSettings:
    """AdamW and its learning-rate schedule (warm-up, then constant / linear / cosine decay to
    ``min_lr`` at ``total_steps``), and gradient-norm clipping."""

    lr: float
    total_steps: int
    warmup_steps: int = 0
    decay_style: str = "constant"
    min_lr: float = 0.0
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    clip_grad: float = 1.0

    @classmethod
    def for_actor(cls, t: TrainConfig) -> OptimizerSettings:
        """The policy's settings: ``train.*``."""
        return cls(
            lr=t.lr,
            total_steps=t.num_rollout * t.num_steps_per_rollout,
            warmup_steps=t.lr_warmup_iters,
            decay_style=t.lr_decay_style,
            min_lr=t.min_lr,
            weight_decay=t.weight_decay,
            betas=(t.adam_beta1, t.adam_beta2),
            eps=t.adam_eps,
            clip_grad=t.clip_grad,
        )

    @classmethod
    def for_critic(cls, c: CriticConfig, t: TrainConfig) -> OptimizerSettings:
        """The value model's settings: ``critic.*``; AdamW's betas and eps and the step count from ``train.*``."""
        return cls(
            lr=c.lr,
            total_steps=t.num_rollout * t.num_steps_per_rollout,
            warmup_steps=c.lr_warmup_iters,
            decay_style=c.lr_decay_style,
            min_lr=c.min_lr,
            weight_decay=c.weight_decay,
            betas=(t.adam_beta1, t.adam_beta2),
            eps=t.adam_eps,
            clip_grad=c.clip_grad,
        )


@dataclass
class TrainSettings:
    """How a model is run: precision, micro-batch budget, log-prob chunk, FSDP offload, activation
    checkpointing (from ``model.*`` / ``train.*``)."""

    train_dtype: str = "auto"
    max_tokens_per_gpu: int = 8192
    log_prob_chunk_size: int = 2048
    fsdp_cpu_offload: bool = False
    optimizer_offload: bool = False
    packing: str = "none"
    fused_kernels: bool = False
    gradient_checkpointing: bool = False
    recompute_num_layers: int | None = None

    @classmethod
    def from_config(cls, m: ModelConfig, t: TrainConfig) -> TrainSettings:
        """The settings of ``m`` and ``t``; keys left at ``auto`` (no planner resolved them: a trainer
        built outside a run) take their unplanned values (:func:`~reinforge.config.fields.unplanned`)."""
        m, t = unplanned(m), unplanned(t)
        return cls(
            train_dtype=m.train_dtype,
            max_tokens_per_gpu=t.max_tokens_per_gpu,
            log_prob_chunk_size=t.log_prob_chunk_size,
            fsdp_cpu_offload=t.fsdp_cpu_offload,
            optimizer_offload=t.optimizer_offload,
            packing=t.packing,
            fused_kernels=m.trains_fused_kernels,
            gradient_checkpointing=m.gradient_checkpointing,
            recompute_num_layers=m.recompute_num_layers,
        )


def same_groups(scheduler_state: dict[str, Any], groups: int) -> dict[str, Any]:
    """A saved LR scheduler's state for an optimizer of ``groups`` parameter groups: every group has the
    one learning rate, but the count follows the layout (:func:`~reinforge.train.offload.build_adamw`
    splits sharded and plain parameters), so a checkpoint of one layout resumes on another."""
    out = dict(scheduler_state)
    for key in ("base_lrs", "_last_lr"):
        if isinstance(out.get(key), list) and out[key] and len(out[key]) != groups:
            out[key] = out[key][:1] * groups
    return out


def autocast_dtype(train_dtype: str, device: torch.device) -> torch.dtype | None:
    """The trainer's autocast dtype for ``model.train_dtype`` on ``device``: bf16 (``bf16``; ``auto`` on
    CUDA) or None (fp32: ``fp32``; ``auto`` elsewhere)."""
    if train_dtype == "fp32" or (train_dtype == "auto" and device.type != "cuda"):
        return None
    return torch.bfloat16


class ModelTrainer:
    """A model (not an ``nn.Module`` itself) with its AdamW optimizer and LR schedule: the base of
    :class:`~reinforge.train.actor.Actor` and :class:`~reinforge.train.critic.Critic`.

    Precision: fp32 parameters and optimizer state; on CUDA the forward pass runs under
    bf16 autocast (``model.train_dtype: auto | bf16``), on CPU in fp32. With LoRA under bf16 autocast
    the frozen base's matmul weights are held in bf16 (:func:`~reinforge.models.lora.hold_frozen_weights`).

    Args:
        model: the model to train (sharded here with FSDP2 when ``parallel`` has several ranks).
        device: its device.
        optim: optimizer and schedule (:class:`OptimizerSettings`: each model its own section).
        settings: precision, micro-batch budget, offload.
        name: for log messages ("actor", "critic").
        parallel: this process's rank among the trainer ranks.
        compile_layers: ``torch.compile`` each decoder layer (``model.torch_compile``).
        load: fills ``model`` once placed on the mesh, before the optimizer is built (a ``meta`` model
            loaded shard-wise: :func:`~reinforge.train.shard_load.load_shards`); None: ``model`` has its weights.
    """

    _current_mb: MicroBatch | None = None  # the micro-batch running (for an out-of-memory message)

    def __init__(
        self,
        model: nn.Module,
        device: torch.device,
        optim: OptimizerSettings,
        settings: TrainSettings,
        *,
        name: str,
        parallel: ParallelContext | None = None,
        pad_id: int = 0,
        compile_layers: bool = False,
        load: Callable[[nn.Module], None] | None = None,
    ):
        self.device, self.name, self.optim, self.settings = device, name, optim, settings
        self.parallel = parallel or ParallelContext()
        if settings.fused_kernels and device.type == "cuda" and not liger_available():
            log.warning(
                "model.fused_kernels: the training kernels come from Liger-Kernel, which is not installed "
                "(`pip install liger-kernel`); %s trains with eager PyTorch norms",
                name,
            )
        elif settings.fused_kernels:  # (on CUDA with Triton; the policy, a critic's or reward model's backbone)
            for m in model.modules():
                if isinstance(m, CausalLM):
                    m.set_variant(Variant(fused_kernels=True))
        if has_lora(model) and self.compute_dtype() is not None:  # the frozen base in bf16: half its memory
            hold_frozen_weights(model, torch.bfloat16)  # (a no-op where build_model made them so)
        # the mesh's layout: pipeline stages, tensor / context / expert parallelism, recompute, compile,
        # FSDP2 over dp x cp (train/parallelize.py)
        self._pipelines: dict[int, Pipeline] = {}
        sharded = self._parallelize(
            model, (settings.gradient_checkpointing, settings.recompute_num_layers), compile_layers
        )
        self.fsdp, self.grad_divisor, self.tp_partial = sharded.fsdp, sharded.grad_divisor, sharded.tp_partial
        if load is not None:  # a meta model placed on the mesh: its shards filled (train/shard_load.py)
            load(model)
        self.model = model
        self.pipeline = sharded.pipeline
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = build_adamw(  # train.optimizer_offload: the moments in CPU memory (train/offload.py)
            params,
            device,
            settings.optimizer_offload,
            lr=optim.lr,
            betas=optim.betas,
            eps=optim.eps,
            weight_decay=optim.weight_decay,
        )
        min_ratio = optim.min_lr / optim.lr
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda step: lr_multiplier(step, optim.warmup_steps, optim.total_steps, optim.decay_style, min_ratio),
        )
        self.pad_id = pad_id
        self.skipped_steps = 0

    def compute_dtype(self) -> torch.dtype | None:
        """bf16 when the forward pass runs in bf16 (``model.train_dtype``), else None (fp32)."""
        return autocast_dtype(self.settings.train_dtype, self.device)

    def _parallelize(self, model: nn.Module, recompute: tuple[bool, int | None], compile_layers: bool = False):
        sharded = parallelize(
            model,
            self.parallel,
            mixed_precision=self.compute_dtype() is not None,
            cpu_offload=self.settings.fsdp_cpu_offload,
            recompute=recompute,
            compile_layers=compile_layers,
        )
        if sharded.pipeline is not None:
            self._pipelines[id(model)] = sharded.pipeline
        return sharded

    def shard(self, model: nn.Module) -> nn.Module:
        """Place another model of this trainer (a frozen reference) on the mesh as the trained one
        (bf16 compute through FSDP's mixed precision; the same pipeline stages)."""
        return self._parallelize(model, (False, None)).model

    def pipeline_of(self, model: nn.Module) -> Pipeline | None:
        """The pipeline stages of ``model`` (the trained one, or one placed by :meth:`shard`) on this rank."""
        return self._pipelines.get(id(model))

    def autocast(self):
        """bf16 autocast for a model outside FSDP; FSDP's mixed precision does it when sharded."""
        dtype = self.compute_dtype()
        if dtype is None or self.fsdp:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def micro_batches(
        self, samples: list[Sample], indices: list[int], per_token: dict[str, list[torch.Tensor]] | None = None
    ) -> list[MicroBatch]:
        """Micro-batches of ``samples[indices]`` on the device, in the layout ``train.packing``
        (:mod:`~reinforge.train.batching`) within ``train.max_tokens_per_gpu`` tokens."""
        tokens = [s.tokens for s in samples]
        rlen = [s.response_length for s in samples]
        masks = [s.loss_mask for s in samples]
        layout = self.settings.packing
        return [
            build(tokens, rlen, masks, rows, self.pad_id, per_token, layout == "shared_prompt").to(self.device)
            for rows in plan_rows(tokens, rlen, indices, layout, self.settings.max_tokens_per_gpu)
        ]

    def rank_micro_batches(
        self,
        samples: list[Sample],
        indices: list[int],
        per_token: dict[str, list[torch.Tensor]] | None = None,
        *,
        split: bool = True,
    ) -> tuple[list[MicroBatch], int]:
        """This data-parallel rank's share of ``indices`` (:meth:`rank_shares`) as micro-batches, padded
        with dummy micro-batches to the largest count of any rank. ``split`` False: ``indices`` are
        this rank's already (the samples it holds of a rollout,
        :class:`~reinforge.train.rollout_share.RolloutShare`), taken whole. Returns (batches, real count)."""
        p = self.parallel
        if split:
            indices = self.rank_shares(samples, indices)[p.dp_rank if p.distributed else 0]
        mbs = self.micro_batches(samples, indices, per_token) if indices else []
        real = len(mbs)
        for _ in range(p.max_int(real) - real):
            mbs.append(self.dummy_micro_batch(per_token))
        return mbs, real

    def rank_shares(self, samples: list[Sample], indices: list[int]) -> list[list[int]]:
        """Every data-parallel rank's share of ``indices`` (deterministic: each rank computes all of
        them alike): token-balanced (:func:`partition_by_tokens`), whole prompt groups with the
        shared-prompt layout; the ranks of one tensor x context parallel group or pipeline take the
        same share. Not distributed: ``[indices]``."""
        p = self.parallel
        if not p.distributed:
            return [indices]
        tokens, rlen = [s.tokens for s in samples], [s.response_length for s in samples]
        shared = self.settings.packing == "shared_prompt"
        units = prompt_groups(tokens, rlen, indices) if shared else [[i] for i in indices]
        parts = partition_by_tokens([row_length(tokens, rlen, u, shared) for u in units], p.dp_size)
        return [[i for j in part for i in units[j]] for part in parts]

    def step_ranks(self, samples: list[Sample], steps: list[list[int]]) -> list[int]:
        """For each sample, the data-parallel rank that runs it in ``steps`` (each step's samples split by
        :meth:`rank_shares`); -1 for a sample no step runs."""
        ranks = [-1] * len(samples)
        for step in steps:
            for r, share in enumerate(self.rank_shares(samples, step)):
                for i in share:
                    ranks[i] = r
        return ranks

    def dummy_micro_batch(self, per_token: dict[str, list[torch.Tensor]] | None) -> MicroBatch:
        """Two pad tokens, one response position with loss mask 0: runs the collectives, adds nothing."""
        fields = {k: [torch.zeros(1)] for k in (per_token or {})}
        mb = build([[self.pad_id, self.pad_id]], [1], [[0]], [[0]], self.pad_id, fields).to(self.device)
        mb.indices = []
        return mb

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
        if self.tp_partial:
            sum_tensor_parallel_grads(self.tp_partial, self.parallel.mesh.group("tp"))
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self.pipeline is not None:  # the stages' norms summed; a tied LM-head copy counted once, on the first stage
            self.pipeline.sync_tied_grads()
            copy = self.pipeline.head_copy()
            counted = [p for p in params if p is not copy]
            also = [p for p in params if p is copy]
            grad_norm = clip_grads(counted, self.optim.clip_grad, self.parallel.pp_group, also=also)
        else:
            grad_norm = clip_grads(params, self.optim.clip_grad)
        loss_sum = self.parallel.sum_floats({"loss": loss_sum})["loss"]
        applied = math.isfinite(grad_norm) and math.isfinite(loss_sum)
        if applied:
            faults.hit("optimizer_step")  # fault injection (tests): no-op unless REINFORGE_FAULT arms it
            self.optimizer.step()
            self.scheduler.step()
        else:
            self.skipped_steps += 1
            log.warning(
                "%s: skipping an optimizer step: loss=%s grad_norm=%s (not finite)", self.name, loss_sum, grad_norm
            )
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm, applied

    @staticmethod
    def to_grid(mb: MicroBatch, values: torch.Tensor) -> torch.Tensor:
        """Values at the N response tokens (row-major order) -> the [S, L] response grid (0 elsewhere)."""
        grid = torch.zeros(mb.response_mask.shape, dtype=values.dtype, device=values.device)
        grid.view(-1)[mb.response_positions()] = values
        return grid

    @property
    def loss_scale(self) -> float:
        """FSDP averages gradients over its ``dp x cp`` ranks; losses are multiplied back to sums."""
        return float(self.grad_divisor)

    def sequence_shard(self, mb: MicroBatch) -> SequenceShard | None:
        """This context-parallel rank's positions of ``mb`` (None without context parallelism)."""
        p = self.parallel
        if p.cp_group is None:
            return None
        return SequenceShard(mb, p.mesh.coordinate("cp"), p.layout.cp, p.cp_group, self.pad_id)

    def gather_rows(self, out: list[Any], pipeline_only: bool = False) -> list[Any]:
        """Merge the per-sample results each rank filled in (``None`` elsewhere): from every rank, or
        with ``pipeline_only`` from the ranks of this rank's pipeline (they share its samples and
        only the last stage computed them; nothing moves without pipeline parallelism)."""
        if not self.parallel.distributed or (pipeline_only and self.parallel.pp_group is None):
            return out
        merged = list(out)
        for part in self.parallel.gather_objects(out, pipeline_only=pipeline_only):
            for i, v in enumerate(part):
                if v is not None:
                    merged[i] = v
        return merged

    @staticmethod
    def split_rows(mb: MicroBatch, grid: torch.Tensor, out: list[Any]) -> None:
        """Per-sample response vectors (fp32, CPU) from a grid, into ``out[sample index]``: one copy to the
        host for the micro-batch (a copy per sample waited for the device each time)."""
        if not mb.indices:
            return
        mask = mb.response_mask  # (a dummy micro-batch has a row and no indices: returned above)
        values = split_owned(grid[mask].detach().float().cpu(), mask.sum(1).tolist())
        for i, v in zip(mb.indices, values):
            out[i] = v

    def save(self, directory: str, optimizer: bool = True, weights_in: str | None = None) -> dict[str, Any]:
        """The model's trainable weights into ``directory`` and, with ``optimizer``, the AdamW state
        into ``directory + "_optim"``, with ``torch.distributed.checkpoint`` (each rank writes its
        shards, or its pipeline stages' weights; loadable on any layout). The optimizer state is
        flattened (one entry per parameter name, ``param_groups`` too: a pipeline rank's groups hold
        only its parameters). Frozen weights (the base model under LoRA) are not written: they are
        rebuilt from ``model.path``. ``weights_in``: a Hugging Face folder (relative to
        ``directory``) the caller writes with these very weights in fp32 (:attr:`hf_folder_holds_weights`):
        ``directory`` then holds only :data:`HF_WEIGHTS` naming it, and :meth:`load` reads the weights
        from there (4 bytes per parameter saved). Returns the small replicated state (scheduler,
        counters) for the caller to store."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        options = StateDictOptions(flatten_optimizer_state_dict=True)
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=options)
        if weights_in is not None and self.parallel.rank == 0:
            Path(directory).mkdir(parents=True, exist_ok=True)
            Path(directory, HF_WEIGHTS).write_text(json.dumps({"weights": weights_in, "dtype": "float32"}) + "\n")
        with _single_process_dcp(self.parallel):
            if weights_in is None:
                dcp.save({"model": self._trainable(model_sd)}, checkpoint_id=directory)
            if optimizer:
                dcp.save({"optim": optim_sd}, checkpoint_id=optimizer_dir(directory))
        return {"scheduler": self.scheduler.state_dict(), "skipped_steps": self.skipped_steps}

    @property
    def hf_folder_holds_weights(self) -> bool:
        """Whether a Hugging Face folder of :meth:`full_state_dict` holds every trained weight as
        trained (fp32, names the family maps back): every parameter trains (no LoRA), the model is
        reinforge's own, and no pipeline splits it (its tied head's copy is not in the folder)."""
        return (
            self.pipeline is None
            and isinstance(self.model, CausalLM)
            and all(p.requires_grad for p in self.model.parameters())
        )

    def load_hf_weights(self, folder: str | Path) -> None:
        """Set the (possibly sharded) model's weights from the Hugging Face folder :meth:`save`'s
        ``weights_in`` named: every rank reads the full tensors and keeps its shards.

        Raises:
            KeyError: the folder lacks a weight of the model."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        from ..models.loading import read_native_weights

        full = read_native_weights(folder)
        if "lm_head.weight" not in full and "model.embed_tokens.weight" in full:  # tied: stored once
            full["lm_head.weight"] = full["model.embed_tokens.weight"]  # (also a last pipeline stage's head copy)
        local = self.model.state_dict()  # this rank's (a pipeline stage's) names
        state = {k: v for k, v in full.items() if k in local}
        missing = sorted(set(local) - set(state))
        if missing:
            raise KeyError(f"{folder}: the checkpoint's weights lack {missing[:5]}")
        if self.fsdp or self.parallel.distributed:
            set_model_state_dict(self.model, state, options=StateDictOptions(full_state_dict=True, strict=False))
        else:
            self.model.load_state_dict(state, strict=False)

    def _trainable(self, model_sd: dict[str, Any]) -> dict[str, Any]:
        """``model_sd`` without the frozen parameters (all of it when every parameter trains)."""
        frozen = {n for n, p in self.model.named_parameters(remove_duplicate=False) if not p.requires_grad}  # tied too
        return {k: v for k, v in model_sd.items() if k not in frozen} if frozen else model_sd

    def load(self, directory: str, state: dict[str, Any]) -> bool:
        """Inverse of :meth:`save` (resharding to this run's layout); also reads the older layouts
        (the optimizer state inside ``directory``, or not flattened). Returns whether the optimizer
        state was restored (False: the checkpoint has none; AdamW's moments start from zero).

        Raises:
            ValueError: a checkpoint whose optimizer state is not flattened (written before pipeline
                parallelism) loaded on pipeline ranks."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_state_dict,
            set_model_state_dict,
            set_state_dict,
        )

        marker = Path(directory, HF_WEIGHTS)
        if marker.is_file():  # the weights are the checkpoint's Hugging Face folder (save's weights_in)
            self.load_hf_weights(Path(directory, json.loads(marker.read_text())["weights"]))
        combined = not marker.is_file() and _has_optimizer_state(directory)  # (before the optimizer's own folder)
        optim_dir = directory if combined else optimizer_dir(directory)
        restored = combined or Path(optim_dir, ".metadata").is_file()
        flat = restored and _flattened(optim_dir)
        if restored and not flat and self.pipeline is not None:
            raise ValueError(
                f"{directory}: its optimizer state predates pipeline parallelism (not flattened); load it with "
                f"train.pipeline_model_parallel_size=1 and save it again"
            )
        options = StateDictOptions(strict=False, flatten_optimizer_state_dict=flat)  # frozen weights: not stored
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=options)
        model_sd = self._trainable(model_sd)
        # a tied LM head's copy on the last pipeline stage takes the embedding's optimizer state (they are equal)
        alias = self.pipeline is not None and self.pipeline.head_copy() is not None
        rename = (".lm_head.weight.", ".model.embed_tokens.weight.") if alias else (".", ".")
        request = {k.replace(*rename): v for k, v in optim_sd.items()}
        with _single_process_dcp(self.parallel):
            if not marker.is_file():
                dcp.load({"model": model_sd, **({"optim": request} if combined else {})}, checkpoint_id=directory)
            if restored and not combined:
                loaded = {"optim": request}
                dcp.load(loaded, checkpoint_id=optim_dir)
                request = loaded["optim"]
        if restored:
            optim_sd = {k: request[k.replace(*rename)] for k in optim_sd}
            set_state_dict(
                self.model, self.optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd, options=options
            )
        else:
            set_model_state_dict(self.model, model_sd, options=options)
        self.scheduler.load_state_dict(same_groups(state["scheduler"], len(self.optimizer.param_groups)))
        self.skipped_steps = int(state.get("skipped_steps", 0))
        return restored

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model state on CPU (rank 0 gets it; other ranks get {}); a collective."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        if self.pipeline is not None:  # each weight from the stage that holds it
            full = {}
            for name, t in self.pipeline.full_named_weights(full_tensor):
                if self.parallel.rank == 0:
                    full[name] = t.cpu()
            return full
        if not self.parallel.distributed and not self.fsdp:
            return {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


HF_WEIGHTS = "hf_weights.json"  # in a weights folder whose weights are the checkpoint's Hugging Face folder


def optimizer_dir(directory: str) -> str:
    """Where :meth:`ModelTrainer.save` writes the optimizer state of the weights in ``directory``."""
    return str(directory).rstrip("/") + "_optim"


def _flattened(directory: str) -> bool:
    """Whether the optimizer state in the DCP checkpoint ``directory`` is flattened (one
    ``param_groups.<name>.*`` entry per parameter, not ``param_groups.<i>.params`` lists)."""
    from torch.distributed.checkpoint import FileSystemReader

    keys = FileSystemReader(directory).read_metadata().state_dict_metadata
    return not any(k.startswith("optim.param_groups.") and k.split(".")[2].isdigit() for k in keys)


def _has_optimizer_state(directory: str) -> bool:
    """Whether the DCP checkpoint ``directory`` holds optimizer entries beside the model's."""
    from torch.distributed.checkpoint import FileSystemReader

    keys = FileSystemReader(directory).read_metadata().state_dict_metadata
    return any(k.startswith("optim.") for k in keys)


@contextlib.contextmanager
def _single_process_dcp(parallel: ParallelContext):
    """DCP warns that it assumes a single process when torch.distributed is not initialised:
    that is intended here (local mode)."""
    import warnings

    with warnings.catch_warnings():
        if not parallel.distributed:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def split_steps(indices: list[int], steps: int) -> list[list[int]]:
    """``steps`` nearly equal consecutive chunks of ``indices`` (all of them used)."""
    n = len(indices)
    bounds = [round(i * n / steps) for i in range(steps + 1)]
    return [indices[bounds[i] : bounds[i + 1]] for i in range(steps)]


def shuffled_steps(n: int, steps: int, seed: int) -> list[list[int]]:
    """Sample indices 0..n-1 shuffled by ``seed`` and cut into ``steps`` mini-batches."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    return split_steps(order, steps)


def mean_metrics(steps: list[dict[str, float]]) -> dict[str, float]:
    """Per-key mean of the optimizer steps' metrics."""
    out: dict[str, float] = {}
    for m in steps:
        for k, v in m.items():
            out[k] = out.get(k, 0.0) + v / len(steps)
    return out
