"""The trainer's device mesh: data x context x tensor parallelism, composed as torchtitan does.

The trainer ranks form a 3-D mesh ``(dp, cp, tp)`` (``init_device_mesh``, dimensions named
``dp``, ``cp``, ``tp``; ``tp`` innermost, so a tensor-parallel group is made of neighbouring
ranks, on one node when it fits):

* ``tp`` (``train.tensor_model_parallel_size``): each decoder layer's q/k/v and gate/up
  projections are split by output rows (``ColwiseParallel``: each rank holds ``num_heads / tp``
  query heads, ``num_kv_heads / tp`` key/value heads and ``intermediate_size / tp`` MLP
  columns), o and down by input columns (``RowwiseParallel``: their outputs are summed over the
  group). The embedding, the LM head and every norm stay whole on each rank (replicated); Qwen3's
  per-head ``q_norm`` / ``k_norm`` see only the local heads, so their gradients are summed over
  the group (:func:`sum_tensor_parallel_grads`).
* ``cp`` (``train.context_parallel_size``): each rank of a group takes ``1 / cp`` of every
  micro-batch's positions; attention exchanges heads for positions (Ulysses all-to-all,
  :mod:`reinforge.models.ulysses`), so it runs over the whole sequence with ``heads / cp`` heads.
* ``dp``: the rest. Samples are split over ``dp`` only (the ranks of one tp x cp group see the
  same samples); FSDP2 shards the parameters and averages the gradients over ``dp x cp``
  (context-parallel ranks hold the same weights and each computed part of the gradient).

Expert parallelism can be added as a fourth named dimension in :meth:`TrainMesh.build`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

log = logging.getLogger(__name__)

KEYS = {"tp": "train.tensor_model_parallel_size", "cp": "train.context_parallel_size"}


@dataclass(frozen=True)
class Layout:
    """How many trainer ranks each dimension takes: ``dp * cp * tp`` = the world size."""

    dp: int = 1
    cp: int = 1
    tp: int = 1

    @property
    def world_size(self) -> int:
        return self.dp * self.cp * self.tp

    @classmethod
    def for_world(cls, world_size: int, tp: int = 1, cp: int = 1) -> "Layout":
        """The layout of ``world_size`` ranks with ``tp`` x ``cp`` ranks per model replica.

        Raises:
            ValueError: ``tp`` or ``cp`` below 1, or ``tp * cp`` does not divide ``world_size``
                (the message names the keys and the world size).
        """
        if tp < 1 or cp < 1:
            raise ValueError(f"{KEYS['tp']}={tp} and {KEYS['cp']}={cp} must be >= 1")
        if world_size % (tp * cp):
            raise ValueError(f"{KEYS['tp']}={tp} x {KEYS['cp']}={cp} = {tp * cp} does not divide the {world_size} "
                             f"trainer rank(s) (cluster.actor_num_nodes x cluster.actor_num_gpus_per_node, or "
                             f"torchrun's WORLD_SIZE): choose sizes whose product divides it")
        return cls(world_size // (tp * cp), cp, tp)

    def words(self) -> str:
        """E.g. ``"4 trainer ranks = 2 data x 2 tensor"`` (dimensions of size 1 left out, but for data)."""
        parts = [f"{self.dp} data"] + [f"{n} {name}" for n, name in ((self.cp, "context"), (self.tp, "tensor"))
                                       if n > 1]
        return f"{self.world_size} trainer rank{'s' if self.world_size > 1 else ''} = {' x '.join(parts)}"

    def model_problems(self, num_heads: int, num_kv_heads: int, intermediate_size: int) -> list[str]:
        """What the model's shape does not allow (empty: fine). Tensor parallelism splits the query
        heads, the key/value heads and the MLP columns; context parallelism (Ulysses) splits each
        rank's query heads again. Key/value heads that ``cp`` does not divide are repeated to one per
        query head before the all-to-all (more traffic, same result), so only the query heads must divide."""
        out = []
        tp, cp = self.tp, self.cp
        for name, n in (("num_attention_heads", num_heads), ("num_key_value_heads", num_kv_heads),
                        ("intermediate_size", intermediate_size)):
            if n % tp:
                out.append(f"{KEYS['tp']}={tp} must divide the model's {name}={n}")
        if not out and (num_heads // tp) % cp:
            out.append(f"{KEYS['cp']}={cp} must divide the query heads per tensor-parallel rank "
                       f"(num_attention_heads={num_heads} / {KEYS['tp']}={tp} = {num_heads // tp})")
        return out


@dataclass
class TrainMesh:
    """The device mesh of the trainer ranks and this rank's place in it.

    Attributes:
        layout: the sizes.
        mesh: the 3-D ``DeviceMesh`` (dims ``dp``, ``cp``, ``tp``).
    """

    layout: Layout
    mesh: "DeviceMesh"

    @classmethod
    def build(cls, layout: Layout, device_type: str) -> "TrainMesh":
        """Create the mesh over the default process group (its size must be ``layout.world_size``)."""
        from torch.distributed.device_mesh import init_device_mesh

        world = dist.get_world_size()
        if world != layout.world_size:
            raise ValueError(f"the layout {layout.words()} does not match the {world} ranks of the process group")
        mesh = init_device_mesh(device_type, (layout.dp, layout.cp, layout.tp), mesh_dim_names=("dp", "cp", "tp"))
        if dist.get_rank() == 0:
            log.info("trainer mesh: %s", layout.words())
        return cls(layout, mesh)

    def coordinate(self, dim: str) -> int:
        return self.mesh[dim].get_local_rank()

    def group(self, dim: str) -> dist.ProcessGroup:
        return self.mesh[dim].get_group()

    @property
    def fsdp_mesh(self) -> "DeviceMesh | None":
        """The ranks that shard parameters and average gradients: ``dp x cp`` flattened (None: one rank)."""
        if self.layout.dp * self.layout.cp == 1:
            return None
        if self.layout.cp == 1:
            return self.mesh["dp"]
        if self.layout.dp == 1:
            return self.mesh["cp"]
        return self.mesh["dp", "cp"]._flatten("dp_cp")


def apply_tensor_parallel(layers: list[nn.Module], tp_mesh: "DeviceMesh") -> None:
    """Split each decoder layer's projections over ``tp_mesh`` (see the module doc).

    Raises:
        ValueError: a layer without the Llama-style projection names (``self_attn.{q,k,v,o}_proj``,
            ``mlp.{gate,up,down}_proj``), e.g. LoRA-wrapped projections.
    """
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel()}
    for layer in layers:
        for name in plan:
            if type(layer.get_submodule(name)) is not nn.Linear:
                raise ValueError(f"{KEYS['tp']}: {name} of {type(layer).__name__} is not a plain nn.Linear "
                                 f"({type(layer.get_submodule(name)).__name__}); tensor parallelism needs reinforge's "
                                 f"own model code without LoRA")
        parallelize_module(layer, tp_mesh, plan)


def set_context_parallel(layers: list[nn.Module], group: dist.ProcessGroup | None) -> None:
    """Attention of every layer exchanges positions for heads over ``group`` (None: off)."""
    for layer in layers:
        layer.self_attn.cp_group = group


def tensor_parallel_partial_params(model: nn.Module) -> list[nn.Parameter]:
    """Replicated parameters that see only the local heads under tensor parallelism (Qwen3's
    ``q_norm`` / ``k_norm``): their gradients must be summed over the tp group."""
    return [p for n, p in model.named_parameters() if p.requires_grad and (".q_norm." in n or ".k_norm." in n)]


def sum_tensor_parallel_grads(params: list[nn.Parameter], group: dist.ProcessGroup) -> None:
    """Sum the (local shards of the) gradients of ``params`` over the tensor-parallel ``group``, in place."""
    for p in params:
        if p.grad is not None:
            g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            dist.all_reduce(g, group=group)


def grad_norm(params: list[nn.Parameter]) -> torch.Tensor:
    """The 2-norm of all gradients as one fp32 scalar tensor, the same on every rank.

    Gradients may be plain tensors (one process, or replicated over tensor parallelism) or DTensors
    on different meshes (FSDP's 1-D ``dp`` mesh for replicated parameters, the 2-D ``dp x tp`` mesh
    for tensor-parallel ones): each mesh's group is normed alone (a DTensor norm reduces over its
    own mesh only, so replicated copies are not counted twice) and the groups are combined.
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
    return total.sqrt()


def clip_grads(params: list[nn.Parameter], max_norm: float) -> float:
    """Scale the gradients so that their norm is at most ``max_norm`` (as ``clip_grad_norm_``, on
    any mix of meshes). Returns the norm before clipping (NaN / Inf left as they are: the caller skips)."""
    norm = float(grad_norm(params))
    coef = max_norm / (norm + 1e-6)
    if coef < 1.0:
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef)
    return norm
