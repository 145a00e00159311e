"""The trainer's device mesh: pipeline x data x context x tensor parallelism, composed as torchtitan does.

The sizes and their rules are :class:`~reinforge.parallel_layout.Layout`'s. The trainer ranks form
a 3-D mesh ``(dp, cp, tp)`` (``init_device_mesh``, dimensions named ``dp``, ``cp``, ``tp``; ``tp``
innermost, so a tensor-parallel group is made of neighbouring ranks, on one node when it fits),
4-D ``(pp, dp, cp, tp)`` with pipeline parallelism:

* ``pp`` (``train.pipeline_model_parallel_size``, outermost): each rank of a pipeline holds the
  decoder layers of its stage(s) (:mod:`reinforge.train.pipeline`); activations travel between
  neighbouring stages point to point. The ranks of one pipeline take the same samples.

* ``tp`` (``train.tensor_model_parallel_size``): as the model family plans it (``Family.tp_plan``,
  :mod:`reinforge.models.families`; every registered family keeps the default), each decoder
  layer's q/k/v and gate/up projections are split by output rows (``ColwiseParallel``: each rank
  holds ``num_heads / tp`` query heads, ``num_kv_heads / tp`` key/value heads and
  ``intermediate_size / tp`` MLP columns), o and down by input columns (``RowwiseParallel``: their
  outputs are summed over the group). The embedding, the LM head and every norm stay whole on each
  rank (replicated); Qwen3's
  per-head ``q_norm`` / ``k_norm`` see only the local heads, so their gradients are summed over
  the group (:func:`sum_tensor_parallel_grads`).
* ``cp`` (``train.context_parallel_size``): each rank of a group takes ``1 / cp`` of every
  micro-batch's positions; attention exchanges heads for positions (Ulysses all-to-all,
  :mod:`reinforge.models.ulysses`), so it runs over the whole sequence with ``heads / cp`` heads.
* ``dp``: the rest. Samples are split over ``dp`` only (the ranks of one tp x cp group see the
  same samples); FSDP2 shards the parameters and averages the gradients over ``dp x cp``
  (context-parallel ranks hold the same weights and each computed part of the gradient).

* ``ep`` (``train.expert_model_parallel_size``): carved out of ``dp`` (Megatron's and
  torchtitan's convention). The ``dp`` ranks are laid out as ``edp x ep`` (``ep`` innermost): the
  ranks of one ``ep`` group hold ``num_experts / ep`` experts each of every mixture-of-experts
  layer (a DTensor ``Shard(0)`` of the stacked expert weights over the ``ep`` dimension) and send
  each token to the ranks of its experts (:mod:`reinforge.models.expert_parallel`); the ``edp``
  ranks that hold the same experts shard them again with FSDP (when ``edp`` > 1). Every other
  parameter is FSDP-sharded over ``dp`` as without expert parallelism. Samples are still split
  over all ``dp`` ranks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from ..parallel_layout import KEYS, Layout

__all__ = ["KEYS", "Layout", "TrainMesh"]

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

log = logging.getLogger(__name__)


@dataclass
class TrainMesh:
    """The device mesh of the trainer ranks and this rank's place in it.

    Attributes:
        layout: the sizes.
        mesh: the 3-D ``DeviceMesh`` (dims ``dp``, ``cp``, ``tp``); with expert parallelism 4-D
            (``edp``, ``ep``, ``cp``, ``tp``, with ``dp`` their first two flattened); with pipeline
            parallelism 4-D (``pp``, ``dp``, ``cp``, ``tp``).
    """

    layout: Layout
    mesh: DeviceMesh
    dp_mesh: DeviceMesh | None = None  # with expert parallelism: edp x ep flattened (kept, not sliced by name)
    _pair_group: Any = None  # (pipeline) the first and last stage of this rank's pipeline: built on first use

    @classmethod
    def build(cls, layout: Layout, device_type: str) -> TrainMesh:
        """Create the mesh over the default process group (its size must be ``layout.world_size``)."""
        from torch.distributed.device_mesh import init_device_mesh

        world = dist.get_world_size()
        if world != layout.world_size:
            raise ValueError(f"the layout {layout.words()} does not match the {world} ranks of the process group")
        if layout.ep > 1:
            mesh = init_device_mesh(
                device_type, (layout.edp, layout.ep, layout.cp, layout.tp), mesh_dim_names=("edp", "ep", "cp", "tp")
            )
            dp_mesh = mesh["edp", "ep"]._flatten("dp")
        elif layout.pp > 1:
            shape, names = (layout.pp, layout.dp, layout.cp, layout.tp), ("pp", "dp", "cp", "tp")
            mesh, dp_mesh = init_device_mesh(device_type, shape, mesh_dim_names=names), None
        else:
            mesh = init_device_mesh(device_type, (layout.dp, layout.cp, layout.tp), mesh_dim_names=("dp", "cp", "tp"))
            dp_mesh = None
        if dist.get_rank() == 0:
            log.info("trainer mesh: %s", layout.words())
        return cls(layout, mesh, dp_mesh)

    def sub(self, dim: str) -> DeviceMesh:
        """The 1-D mesh of dimension ``dim`` (``dp``, ``cp``, ``tp``; with expert parallelism also ``edp``, ``ep``)."""
        return self.dp_mesh if dim == "dp" and self.dp_mesh is not None else self.mesh[dim]

    def coordinate(self, dim: str) -> int:
        return self.sub(dim).get_local_rank()

    def group(self, dim: str) -> dist.ProcessGroup:
        return self.sub(dim).get_group()

    def pipeline_ends(self) -> dist.ProcessGroup:
        """The process group of the first and the last stage of this rank's pipeline (the ranks that
        hold a tied embedding and its LM-head copy); the pipeline group itself when ``pp`` is 2. A
        collective the first time: every rank builds every pipeline's pair in the same order."""
        if self._pair_group is None:
            if self.layout.pp == 2:
                self._pair_group = self.group("pp")
            else:
                pipelines = self.mesh.mesh.movedim(0, -1).reshape(-1, self.layout.pp).tolist()
                me = dist.get_rank()
                for ranks in pipelines:  # dist.new_group is a collective over the world: all pairs, everywhere
                    group = dist.new_group([ranks[0], ranks[-1]])
                    if me in ranks:
                        self._pair_group = group
        return self._pair_group

    @property
    def fsdp_mesh(self) -> DeviceMesh | None:
        """The ranks that shard parameters and average gradients: ``dp x cp`` flattened (None: one rank)."""
        if self.layout.dp * self.layout.cp == 1:
            return None
        if self.layout.cp == 1:
            return self.sub("dp")
        if self.layout.dp == 1:
            return self.mesh["cp"]
        return self.mesh["dp", "cp"]._flatten("dp_cp")


def apply_tensor_parallel(layers: list[nn.Module], tp_mesh: DeviceMesh, sequence_parallel: bool = False) -> None:
    """Split each decoder layer's projections over ``tp_mesh`` as the layer's family plans it
    (``layer.tp_plan``: submodule -> ``"colwise"`` / ``"rowwise"``, from
    :meth:`~reinforge.models.families.base.Family.tp_plan`; see the module doc).

    ``sequence_parallel`` (``train.sequence_parallel``, Megatron's ``--sequence-parallel``; Korthikanti
    et al. 2022): the layer's input, its norms and its residual adds hold ``1 / tp`` of the positions
    (``SequenceParallel`` norms); the attention's and the MLP's inputs are all-gathered over the
    positions (``PrepareModuleInput``) and the row-wise projections' outputs reduce-scattered back to
    them (``RowwiseParallel(output_layouts=Shard(1))``) instead of all-reduced
    (:func:`apply_sequence_parallel_ends` splits the embedding's output and gathers the final norm's).

    Raises:
        ValueError: a layer without a plan (not reinforge's own model code), a plan style other than
            colwise / rowwise, or a planned submodule that is not a plain ``nn.Linear`` (e.g.
            LoRA-wrapped projections); sequence parallelism on a mixture-of-experts layer.
    """
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    if sequence_parallel:
        styles["rowwise"] = lambda: RowwiseParallel(output_layouts=Shard(1))
    for layer in layers:
        # a mixture-of-experts layer's MLP stays whole on every tensor-parallel rank in the default
        # plan (its input, the attention's all-reduced output, is the same there): the experts are
        # split by train.expert_model_parallel_size, not by tp
        names = getattr(layer, "tp_plan", None)
        if names is None:
            raise ValueError(
                f"{KEYS['tp']}: {type(layer).__name__} has no tensor-parallel plan (tp_plan); tensor "
                f"parallelism needs reinforge's own model code (a registered model family)"
            )
        bad = sorted(set(names.values()) - set(styles))
        if bad:
            raise ValueError(f"{KEYS['tp']}: the family's tp_plan names {bad}; the styles are {sorted(styles)}")
        for name in names:
            if type(layer.get_submodule(name)) is not nn.Linear:
                raise ValueError(
                    f"{KEYS['tp']}: {name} of {type(layer).__name__} is not a plain nn.Linear "
                    f"({type(layer.get_submodule(name)).__name__}); tensor parallelism needs reinforge's "
                    f"own model code without LoRA"
                )
        plan: dict[str, Any] = {name: styles[style]() for name, style in names.items()}
        if sequence_parallel:
            if getattr(layer, "sparse", False):
                raise ValueError(
                    f"{KEYS['sp']}=true: a mixture-of-experts layer's MLP is not split by tensor parallelism"
                )
            whole = (Replicate(),)
            plan |= {
                "input_layernorm": SequenceParallel(),
                "post_attention_layernorm": SequenceParallel(),
                "self_attn": PrepareModuleInput(
                    input_layouts=(Shard(1), None, None, None), desired_input_layouts=(*whole, None, None, None)
                ),
                "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=whole),
            }
        parallelize_module(layer, tp_mesh, plan)
        attn = getattr(layer, "self_attn", None)
        if getattr(attn, "sinks", None) is not None and "self_attn.q_proj" in names:
            # GPT-OSS's sink logits, one per query head: split with the heads (Attention.local_sinks)
            attn.sinks = nn.Parameter(distribute_tensor(attn.sinks.data, tp_mesh, [Shard(0)]))


def apply_sequence_parallel_ends(lm: nn.Module, tp_mesh: DeviceMesh) -> None:
    """The two ends of sequence parallelism on a :class:`~reinforge.models.transformer.CausalLM`: each
    tensor-parallel rank keeps its ``1 / tp`` of the embedding's output positions (the backward pass
    all-gathers their gradients: every rank's embedding gradient is the whole one), and the final norm
    runs on those positions (``SequenceParallel``) and all-gathers its output, so the LM head (or a
    value head) sees every position. Rows must hold a multiple of ``tp`` positions (the step pads them)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module

    def own_positions(module, args, out):
        return (
            DTensor.from_local(out, tp_mesh, [Replicate()], run_check=False)
            .redistribute(tp_mesh, [Shard(1)])
            .to_local()
        )

    def all_positions(module, args, out):
        return out.redistribute(tp_mesh, [Replicate()]).to_local() if isinstance(out, DTensor) else out

    lm.model.embed_tokens.register_forward_hook(own_positions)
    parallelize_module(lm.model, tp_mesh, {"norm": SequenceParallel()})
    lm.model.norm.register_forward_hook(all_positions)


def apply_expert_parallel(model: nn.Module, mesh: TrainMesh, fsdp_kwargs: dict[str, Any]) -> list[nn.Parameter]:
    """Split the experts of every mixture-of-experts block over the ``ep`` dimension (see the module
    doc): each rank keeps its ``num_experts / ep`` experts of ``experts.gate_up_proj`` [E, 2I, H] and
    ``experts.down_proj`` [E, H, I] as a DTensor ``Shard(0)`` over ``mesh.mesh["ep"]`` (a slice of
    the weights every rank loaded: no communication), and the block dispatches its tokens over the
    ``ep`` group. With ``edp`` > 1 the experts become an FSDP unit of their own over the ``edp``
    ranks (``fsdp_kwargs``: the mixed precision / offload of the other units).

    Returns:
        the expert parameters FSDP must leave alone (``edp`` = 1: no rank shares them), for the
        ``ignored_params`` of the enclosing units.
    Raises:
        ValueError: the model has no mixture-of-experts block, or ``ep`` does not divide its
            ``num_experts`` (names the key).
    """
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Shard

    from ..models.moe import SparseMoeBlock

    layout, ep_mesh = mesh.layout, mesh.mesh["ep"]
    blocks = [m for m in model.modules() if isinstance(m, SparseMoeBlock)]
    problems = layout.expert_problems(blocks[0].experts.num_experts if blocks else 0)
    if problems:
        raise ValueError(f"{type(model).__name__}: {problems[0]}")
    rank, ignored = ep_mesh.get_local_rank(), []
    for block in blocks:
        n = block.experts.num_experts // layout.ep
        for name in block.experts.expert_params:  # (the matrices, and a family's expert biases)
            p = getattr(block.experts, name)
            local = p.detach()[rank * n : (rank + 1) * n].clone()
            dt = DTensor.from_local(local, ep_mesh, [Shard(0)], run_check=False)
            setattr(block.experts, name, nn.Parameter(dt, requires_grad=p.requires_grad))
        block.ep_group = ep_mesh.get_group()
        if layout.edp > 1:
            fully_shard(block.experts, mesh=mesh.mesh["edp"], **fsdp_kwargs)
        else:
            ignored += [getattr(block.experts, name) for name in block.experts.expert_params]
    return ignored


def set_context_parallel(layers: list[nn.Module], group: dist.ProcessGroup | None) -> None:
    """Attention of every layer exchanges positions for heads over ``group`` (None: off)."""
    for layer in layers:
        layer.self_attn.cp_group = group


def tensor_parallel_partial_params(model: nn.Module) -> list[nn.Parameter]:
    """Replicated parameters that see only the local heads under tensor parallelism (Qwen3's
    ``q_norm`` / ``k_norm``: the family's ``tp_partial_grads`` name fragments): their gradients must
    be summed over the tp group."""
    native = getattr(model, "backbone", model)  # a critic's / reward model's backbone
    family = getattr(native, "family", None)
    parts = family.tp_partial_grads if family is not None else (".q_norm.", ".k_norm.")
    return [p for n, p in model.named_parameters() if p.requires_grad and any(f in n for f in parts)]


def sum_tensor_parallel_grads(params: list[nn.Parameter], group: dist.ProcessGroup) -> None:
    """Sum the (local shards of the) gradients of ``params`` over the tensor-parallel ``group``, in place."""
    for p in params:
        if p.grad is not None:
            g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            dist.all_reduce(g, group=group)


def grad_norm(params: list[nn.Parameter], pp_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """The 2-norm of all gradients as one fp32 scalar tensor, the same on every rank.

    Gradients may be plain tensors (one process, or replicated over tensor parallelism) or DTensors
    on different meshes (FSDP's 1-D ``dp`` mesh for replicated parameters, the 2-D ``dp x tp`` mesh
    for tensor-parallel ones): each mesh's group is normed alone (a DTensor norm reduces over its
    own mesh only, so replicated copies are not counted twice) and the groups are combined. With
    pipeline parallelism (``pp_group``) each stage holds other parameters: the squares are summed
    over the pipeline (the caller leaves a tied LM-head copy out of ``params``).
    """
    groups: dict[Any, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is not None:
            groups.setdefault(getattr(p.grad, "device_mesh", None), []).append(p.grad)
    total = torch.zeros((), dtype=torch.float32)
    for grads in groups.values():
        n = torch.nn.utils.get_total_norm(grads, 2.0)
        n = n.full_tensor() if hasattr(n, "full_tensor") else n
        total = total + n.detach().float().cpu() ** 2
    if pp_group is not None:
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(pp_group) == "nccl" else "cpu"
        total = total.to(device)
        dist.all_reduce(total, group=pp_group)
        total = total.cpu()
    return total.sqrt()


def clip_grads(
    params: list[nn.Parameter], max_norm: float, pp_group: dist.ProcessGroup | None = None, also: list | None = None
) -> float:
    """Scale the gradients so that their norm is at most ``max_norm`` (as ``clip_grad_norm_``, on
    any mix of meshes; over the pipeline with ``pp_group``; ``also``: parameters scaled but not
    counted, a tied LM-head copy). Returns the norm before clipping (NaN / Inf left as they are: the
    caller skips)."""
    norm = float(grad_norm(params, pp_group))
    params = params + (also or [])
    coef = max_norm / (norm + 1e-6)
    if coef < 1.0:
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef)
    return norm
