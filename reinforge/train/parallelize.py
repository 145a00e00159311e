"""Placing a model on the trainer's device mesh (:func:`parallelize`): pipeline stages, tensor, context
and expert parallelism, activation checkpointing, compile, FSDP2, in that order (torchtitan's
``models/*/infra/parallelize.py``). The mesh and the collectives are :mod:`.collectives`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..models.families import native_models
from ..models.loading import is_native, set_gradient_checkpointing
from ..parallel_layout import latent_attention_problem
from .collectives import ParallelContext
from .mesh import (
    KEYS,
    apply_expert_parallel,
    apply_sequence_parallel_ends,
    apply_tensor_parallel,
    set_context_parallel,
    tensor_parallel_partial_params,
)
from .offload import offload_policy
from .pipeline import Pipeline, split_stages


@dataclass
class Sharded:
    """A model placed on the mesh, and what the trainer must do for it.

    Attributes:
        model: the model (modified in place; with pipeline parallelism only this rank's stages are left).
        fsdp: FSDP2 wraps it (it averages gradients over its ranks; bf16 through its mixed precision).
        grad_divisor: the number of ranks FSDP averages gradients over (losses are scaled by it
            to stay sums).
        tp_partial: parameters whose gradients must be summed over the tensor-parallel group.
        pipeline: this rank's pipeline stages and their schedule (None without pipeline parallelism).
    """

    model: nn.Module
    fsdp: bool = False
    grad_divisor: int = 1
    tp_partial: list[nn.Parameter] = field(default_factory=list)
    pipeline: Pipeline | None = None


def parallelize(
    model: nn.Module,
    parallel: ParallelContext,
    *,
    mixed_precision: bool = False,
    cpu_offload: bool = False,
    recompute: tuple[bool, int | None] = (False, None),
    compile_layers: bool = False,
) -> Sharded:
    """Place ``model`` on the mesh of ``parallel``, one dimension after the other in torchtitan's order:

    1. **pipeline** (``pp``): only this rank's stages of consecutive decoder layers stay
       (:func:`~reinforge.train.pipeline.split_stages`; the embedding on the first stage, the final
       norm and LM head on the last);
    2. **tensor** (``tp``): every decoder layer's projections (:func:`~reinforge.train.mesh.apply_tensor_parallel`),
       with ``train.sequence_parallel`` the norms and residual stream by positions;
    3. **context** (``cp``): the context-parallel group on every attention (Ulysses);
    4. **expert** (``ep``): the experts over ``ep`` (:func:`~reinforge.train.mesh.apply_expert_parallel`:
       their own FSDP unit over the ``dp / ep`` ranks that hold the same experts, or left out of FSDP);
    5. **activation checkpointing** (``recompute``: ``model.gradient_checkpointing``,
       ``model.recompute_num_layers``);
    6. **compile** (``compile_layers``: ``model.torch_compile``, each decoder layer);
    7. **FSDP2** (``fully_shard``: one unit per decoder layer, the rest in the root unit, or in each
       pipeline stage's unit) over the ``dp x cp`` ranks, composed with tensor parallelism as 2-D
       DTensors (torchtitan's FSDP x TP).

    On CUDA with ``mixed_precision`` the unit all-gathers bf16 parameters and reduces
    gradients in fp32 (``MixedPrecisionPolicy``); ``cpu_offload`` keeps parameters, gradients
    and optimizer state on the CPU between uses (``CPUOffloadPolicy``). A critic's or reward
    model's ``backbone`` gets the activation checkpointing and compile.

    Raises:
        ValueError: tensor, context or pipeline parallelism for a model that is not reinforge's own
            (or wraps its projections, e.g. LoRA with tensor parallelism), or whose heads / layers they
            do not divide; expert parallelism for a model without experts, or whose ``num_experts`` it
            does not divide; ``recompute`` / ``compile_layers`` a model does not allow.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh, layout = parallel.mesh, parallel.layout
    backbone = getattr(model, "backbone", model)
    out = Sharded(model)
    if layout.tp > 1 or layout.cp > 1 or layout.pp > 1:
        if not is_native(backbone):
            raise ValueError(
                f"{KEYS['tp']} / {KEYS['cp']} / {KEYS['pp']} above 1 need {native_models()}, not {type(model).__name__}"
            )
        a = backbone.args
        problems = layout.model_problems(a.num_heads, a.num_kv_heads, a.intermediate_size, a.num_layers)
        if a.kv_lora_rank and (layout.tp > 1 or layout.cp > 1):  # (pipeline stages are plain decoder layers)
            problems = [latent_attention_problem(a.model_type)]
        if problems:
            raise ValueError("; ".join(problems))
    split = None
    if layout.pp > 1:
        if model is not backbone:
            raise ValueError(f"{KEYS['pp']} > 1 runs a policy (a language model), not a {type(model).__name__}")
        split = split_stages(model, layout.pp, layout.vpp, parallel.pp_rank)
    stages = split.stages if split is not None else []
    layers = _decoder_layers(model)
    if layout.tp > 1:
        apply_tensor_parallel(layers, mesh.mesh["tp"], layout.sp)
        if layout.sp:
            apply_sequence_parallel_ends(backbone, mesh.mesh["tp"])
    if layout.cp > 1:
        set_context_parallel(layers, mesh.group("cp"))
    enabled, num_layers = recompute
    set_gradient_checkpointing(backbone, enabled, num_layers)
    if compile_layers:
        for layer in layers:  # nn.Module.compile: parameter names and the state dict unchanged
            layer.compile(dynamic=True)
    fsdp_mesh = mesh.fsdp_mesh if mesh is not None else None
    if mesh is not None and fsdp_mesh is None and cpu_offload and layout.world_size == 1:
        fsdp_mesh = mesh.sub("dp")  # train.fsdp_cpu_offload on one rank: FSDP2 over a mesh of one
    kwargs: dict[str, Any] = {}
    if mixed_precision:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if cpu_offload:
        kwargs["offload_policy"] = offload_policy()
    if fsdp_mesh is not None:
        if layout.ep > 1:
            ignored = apply_expert_parallel(model, mesh, kwargs)
            if ignored:
                kwargs["ignored_params"] = set(ignored)
        for layer in layers:
            fully_shard(layer, mesh=fsdp_mesh, **kwargs)
        for stage in stages:  # each pipeline stage is a root unit (its forward runs; the model's does not)
            fully_shard(stage, mesh=fsdp_mesh, **kwargs)
        if not stages:
            fully_shard(model, mesh=fsdp_mesh, **kwargs)
        out.fsdp, out.grad_divisor = True, layout.dp * layout.cp
    if layout.tp > 1:  # after fully_shard, which registered new (sharded) parameters: the list must hold those
        out.tp_partial = tensor_parallel_partial_params(model)
    if split is not None:
        act_dtype = torch.bfloat16 if out.fsdp and mixed_precision else None
        out.pipeline = Pipeline(model, split, parallel, act_dtype)
    return out


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of ``model`` (a policy, a critic's / reward model's backbone, a LoRA-wrapped
    policy); with pipeline parallelism those of this rank's stages. A transformers model of another
    layout (the fallback for a model of no registered family: GPT-2's ``transformer.h``...) gives the
    modules of the classes its ``_no_split_modules`` names (its blocks, as accelerate's FSDP wrapping
    reads them).

    Raises:
        ValueError: neither layout is found.
    """
    for path in ("model.layers", "backbone.model.layers", "model.model.layers"):
        obj: Any = model
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        return list(obj.values()) if isinstance(obj, nn.ModuleDict) else list(obj)
    blocks = {name for m in model.modules() for name in (getattr(m, "_no_split_modules", None) or [])}
    layers = [m for m in model.modules() if type(m).__name__ in blocks]
    if layers:
        return layers
    raise ValueError(
        f"cannot find the decoder layers of {type(model).__name__} to shard (no model.layers, and no module of "
        f"the classes its _no_split_modules names)"
    )
