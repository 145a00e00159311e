"""Shard-wise loading of a trained model: every rank builds the model on the ``meta`` device, places it
on the mesh (FSDP2's ``fully_shard``), allocates only its own shards (``to_empty``) and receives them
from rank 0, the one rank that reads the checkpoint into CPU memory
(``torch.distributed.checkpoint.state_dict.set_model_state_dict`` with ``full_state_dict=True,
broadcast_from_rank0=True``). No rank holds the whole model on its accelerator.

Applies to reinforge's own models (:class:`~reinforge.models.transformer.CausalLM`) trained in fp32 over
plain FSDP2 data parallelism (:func:`shard_load_problem`); tensor, context, expert and pipeline
parallelism, LoRA, ``train.fsdp_cpu_offload``, transformers' models, PPO critics and reward models keep
:func:`~reinforge.models.loading.build_model`'s whole-model build. Used by the actor (and its reference and
teachers) and the offline trainers (and their reference or GKD teacher).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..models.loading import build_model, load_hf_config
from ..models.transformer import CausalLM
from .collectives import ParallelContext

if TYPE_CHECKING:
    from .model_trainer import ModelTrainer

log = logging.getLogger(__name__)


def shard_load_problem(parallel: ParallelContext, *, lora: bool = False, cpu_offload: bool = False) -> str | None:
    """Why this trainer cannot load shard-wise (None: it can).

    Shard-wise loading needs several ranks whose layout is data parallel only (FSDP2 over
    ``dp``: ``tp = cp = pp = ep = 1``), no LoRA (whose frozen base is made in bf16 by ``build_model``)
    and no ``train.fsdp_cpu_offload`` (whose shards live in CPU memory).
    """
    layout = parallel.layout
    if not parallel.distributed:
        return "one rank (nothing to shard)"
    if layout.tp > 1 or layout.cp > 1 or layout.pp > 1 or layout.ep > 1:
        return f"the layout {layout.words()} (tensor / context / pipeline / expert parallelism)"
    if lora:
        return "LoRA (its frozen base is built in bf16 whole)"
    if cpu_offload:
        return "train.fsdp_cpu_offload (shards in CPU memory)"
    return None


def shard_wise_model(
    path: str | os.PathLike, parallel: ParallelContext, *, lora: bool = False, cpu_offload: bool = False
) -> CausalLM | None:
    """The :func:`meta_model` of ``path`` where this trainer loads shard-wise (then place it on the mesh
    and call :func:`load_shards`), else None (build the whole model with ``build_model``; with several
    ranks a log line says why)."""
    problem = shard_load_problem(parallel, lora=lora, cpu_offload=cpu_offload)
    model = meta_model(path) if problem is None else None
    if problem is None and model is None:
        problem = "not one of reinforge's own model families"
    if model is None and parallel.distributed:
        log.info("%s: every rank builds the whole model before FSDP shards it: %s", path, problem)
    return model


def meta_model(path: str | os.PathLike, max_positions: int | None = None) -> CausalLM | None:
    """The fp32 :class:`CausalLM` of Hugging Face folder ``path`` on the ``meta`` device (no memory;
    tied embeddings tied), or None where the architecture is not one of reinforge's families.

    Raises:
        FileNotFoundError: no config.json in ``path``.
    """
    cfg = load_hf_config(Path(path))
    try:
        with torch.device("meta"):
            model = CausalLM(cfg, max_positions=max_positions)
    except NotImplementedError:
        return None
    if model.args.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model


def full_state_dict(
    path: str | os.PathLike,
    device: torch.device | str,
    *,
    random_init: bool = False,
    seed: int = 0,
    max_positions: int | None = None,
) -> dict[str, torch.Tensor]:
    """The fp32 weights (CPU tensors under reinforge's names) that :func:`~reinforge.models.loading.build_model`
    gives the model of ``path`` on ``device``, without holding the model on ``device``:

    - read from the checkpoint (the family's ``from_hub``) into CPU memory;
    - with ``random_init`` drawn parameter by parameter on ``device`` from one generator seeded with
      ``seed`` (``CausalLM.init_weights``' order and draws, so the values equal a model initialised
      there whole), each moved to the CPU before the next (one tensor on ``device`` at a time).

    Raises:
        FileNotFoundError: no config.json or no safetensors weights in ``path``.
        KeyError: the weights lack a parameter the architecture needs.
    """
    if not random_init:
        return build_model(path, torch.float32, "cpu", max_positions=max_positions).state_dict()
    model = meta_model(path, max_positions)
    if model is None:
        raise ValueError(f"{path}: random_init shard-wise needs one of reinforge's own model families")
    generator = torch.Generator(device=device).manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, p in model.named_parameters():  # (a tied lm_head once, as init_weights draws it)
            t = torch.empty(p.shape, dtype=torch.float32, device=device)
            model.family.init_weight(name, t, 0.02, generator)
            out[name] = t.cpu()
    if model.args.tie_word_embeddings:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


def load_shards(
    model: nn.Module,
    path: str | os.PathLike,
    device: torch.device,
    parallel: ParallelContext,
    *,
    random_init: bool = False,
    seed: int = 0,
    reader=full_state_dict,
) -> None:
    """Fill ``model`` (a :func:`meta_model` already placed on the mesh by ``fully_shard``) with its weights:
    allocate this rank's shards on ``device`` (``to_empty``), recompute the RoPE tables (buffers that are
    not in the checkpoint), then rank 0 reads the full fp32 state dict (``reader``: :func:`full_state_dict`)
    into CPU memory and ``set_model_state_dict(..., broadcast_from_rank0=True)`` sends each rank its
    shards. Ranks other than 0 never read the checkpoint. Collective: every rank of the trainer calls it.

    Raises:
        FileNotFoundError, KeyError: as :func:`full_state_dict` (on rank 0).
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    model.to_empty(device=device)
    backbone = getattr(model, "backbone", model)
    backbone.init_rope(device)
    full = reader(path, device, random_init=random_init, seed=seed) if parallel.rank == 0 else {}
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full, options=options)
    del full
    log.info("%s: loaded shard-wise over %d ranks (rank 0 read the weights)", path, parallel.world_size)


def trainer_model(
    path: str | os.PathLike,
    device: torch.device,
    parallel: ParallelContext | None,
    *,
    lora: bool = False,
    cpu_offload: bool = False,
    random_init: bool = False,
    seed: int = 0,
    **build_kw,
) -> tuple[nn.Module, Callable[[nn.Module], None] | None]:
    """The model a trainer trains, and the hook that fills it (``ModelTrainer``'s ``load``): where this trainer
    loads shard-wise (:func:`shard_wise_model`) a ``meta`` model and :func:`load_shards` bound to its arguments,
    else :func:`~reinforge.models.loading.build_model`'s whole fp32 model (``build_kw`` passed on) and None."""
    ctx = parallel or ParallelContext()
    meta = shard_wise_model(path, ctx, lora=lora, cpu_offload=cpu_offload)
    if meta is None:
        return build_model(path, torch.float32, device, random_init=random_init, seed=seed, **build_kw), None
    load = functools.partial(load_shards, path=path, device=device, parallel=ctx, random_init=random_init, seed=seed)
    return meta, load


def frozen_model(
    trainer: ModelTrainer,
    path: str | os.PathLike,
    *,
    dtype: torch.dtype = torch.float32,
    random_init: bool = False,
    seed: int = 0,
) -> nn.Module:
    """A frozen model of ``trainer`` (a reference, a teacher), placed as the trained model is: with several
    data-parallel ranks loaded shard-wise (placed on the mesh by :meth:`ModelTrainer.shard`, its shards filled by
    :func:`load_shards`; fp32 weights, bf16 compute through FSDP's mixed precision); otherwise built whole in
    ``dtype`` and, with several ranks, sharded. Collective where the trainer has several ranks."""
    meta = shard_wise_model(path, trainer.parallel, cpu_offload=trainer.settings.fsdp_cpu_offload)
    if meta is not None:
        trainer.shard(meta)
        load_shards(meta, path, trainer.device, trainer.parallel, random_init=random_init, seed=seed)
        model: nn.Module = meta
    else:
        model = build_model(path, dtype, trainer.device, random_init=random_init, seed=seed)
        model = trainer.shard(model) if trainer.parallel.distributed else model
    return model.eval().requires_grad_(False)
