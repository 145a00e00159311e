"""Pipeline and expert parallelism in the planner (issue 56, item 3): the memory and time terms of the trainer's
``train.pipeline_model_parallel_size`` (``p``), ``train.virtual_pipeline_model_parallel_size`` (``v``) and
``train.expert_model_parallel_size`` (``e``), as pure functions of numbers and a model's :class:`~.arch.Arch`.
:mod:`.model` adds them to a phase's memory and time; the rules of what the trainer runs are
:mod:`reinforge.parallel_layout`'s (:func:`~reinforge.parallel_layout.microbatch_count` included).

**Pipeline** (``reinforge/train/pipeline.py``: 1F1B, or interleaved 1F1B with ``v`` > 1; every micro-batch padded
to the step's largest; at least ``p`` micro-batches, dummies making up the count):

* time: ``m`` micro-batches a step become ``m'`` = ``microbatch_count(m, p, v)``; each stage runs them in
  ``m' + (p - 1) / v`` micro-batch times (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on
  GPU Clusters Using Megatron-LM", sec. 2.2: the bubble is ``(p - 1) / v`` micro-batch times; its share of the
  schedule ``(p - 1) / (v m' + p - 1)``), against ``m`` for the work itself: :func:`pipeline_time_factor`;
* memory: the first stage holds the activations of ``min(m', p)`` = ``p`` micro-batches of its ``L / p`` layers at
  the 1F1B steady state, ``1 + (p - 1) / (p v)`` times that when interleaved (Korthikanti et al. 2022, "Reducing
  Activation Recomputation in Large Transformer Models", sec. 4.2.3): :func:`pipeline_activation_factor`, relative
  to one micro-batch through every layer (:mod:`.model` adds the LM head's, which only the last stage holds: an upper
  bound, 1.17x the fullest rank's measured peak for PP2 x TP2 in docs/benchmarks.md); a rank's weights are its
  stage's layers and the embedding or the LM head (a tied head is a copy on the last stage): :func:`stage_params`.

**Experts** (``reinforge/models/moe.py``: each of the ``e`` ranks holds ``E / e`` experts of every MoE layer, FSDP
shards them over the other ``dp / e``; tokens reach their experts by all-to-all):

* memory: the resident state per GPU is FSDP's (all parameters / ``dp``); what changes is the layer FSDP gathers
  for the forward and backward, its experts ``E / e`` instead of ``E`` (:func:`gathered_layer_params`), and the
  all-to-all's send and receive buffers of a layer (:func:`alltoall_buffer_bytes`);
* time: each MoE layer sends each routed copy of a token (``k`` per token) to its expert's rank and back, in bf16;
  ``(e - 1) / e`` of them leave the GPU: :func:`alltoall_bytes` per pass, over the link of
  :mod:`.hardware` at :data:`ALLTOALL_EFFICIENCY` (:func:`alltoall_seconds`). The backward moves the same bytes again
  (the gradients of dispatch and combine), a recomputed layer's forward once more.
"""

from __future__ import annotations

from ..parallel_layout import microbatch_count
from .arch import Arch
from .hardware import NODE_LINK_BYTES_PER_S

ALLTOALL_EFFICIENCY = 0.5  # share of the link's bandwidth an NCCL all-to-all of a few MB per peer reaches (assumed)


def pipeline_time_factor(microbatches: int, pp: int, vpp: int = 1) -> float:
    """Seconds of a pipelined step over the seconds of its work spread evenly (>= 1; 1 without a pipeline):
    ``(m' + (p - 1) / v) / m`` with ``m'`` the micro-batches the schedule runs (module doc).

    Args:
        microbatches: ``m``, real micro-batches per pipeline replica in one schedule (>= 1).
        pp, vpp: ``p`` pipeline ranks, ``v`` model chunks per rank.
    """
    if pp <= 1:
        return 1.0
    m = max(1, microbatches)
    return (microbatch_count(m, pp, vpp) + (pp - 1) / vpp) / m


def pipeline_idle_share(microbatches: int, pp: int, vpp: int = 1) -> float:
    """The bubble's share of a stage's schedule, ``(p - 1) / (v m' + p - 1)`` (0 without a pipeline)."""
    if pp <= 1:
        return 0.0
    m = microbatch_count(max(1, microbatches), pp, vpp)
    return (pp - 1) / (vpp * m + pp - 1)


def pipeline_activation_factor(pp: int, vpp: int = 1) -> float:
    """The decoder layers' activations the fullest (first) stage holds, over one micro-batch's through every layer:
    ``min(m', p) / p`` = 1, since the schedule runs ``m' >= p`` micro-batches (dummies of the real shape making up
    the count), times ``1 + (p - 1) / (p v)`` when interleaved (module doc; 1 without a pipeline)."""
    if pp <= 1:
        return 1.0
    return 1 + (pp - 1) / (pp * vpp) if vpp > 1 else 1.0


def stage_params(arch: Arch, pp: int) -> float:
    """Parameters on the fullest pipeline rank: ``1 / p`` of the decoder layers and one end's embedding or LM head
    (``V x h``; the final norm is negligible); the whole model without a pipeline."""
    if pp <= 1:
        return float(arch.num_params)
    return arch.layers_params / pp + arch.head_params


def gathered_layer_params(arch: Arch, ep: int = 1) -> float:
    """Parameters of the largest decoder layer as FSDP gathers it for a pass: a MoE layer's experts ``E / e``
    (each expert-parallel rank gathers only its own), the rest whole."""
    if not arch.moe_layers:
        return arch.layers_params / arch.num_layers
    experts = arch.experts * 3 * arch.hidden * arch.moe_intermediate
    return arch.layer_params(sparse=True) - experts + experts / max(1, ep)


def alltoall_bytes(tokens: float, arch: Arch, ep: int, elem_bytes: int = 2) -> float:
    """Bytes one GPU sends in one forward pass over ``tokens`` of its own through every MoE layer: dispatch and
    combine of the ``k`` routed copies of each token's hidden state, the ``(e - 1) / e`` bound for other GPUs
    (0 without expert parallelism or experts)."""
    if ep <= 1 or not arch.moe_layers:
        return 0.0
    per_layer = 2 * tokens * arch.experts_per_tok * arch.hidden * elem_bytes * (ep - 1) / ep
    return arch.moe_layers * per_layer


def alltoall_seconds(tokens: float, arch: Arch, ep: int, passes: float, link: float | None) -> float:
    """Seconds of ``passes`` forward-equivalents of :func:`alltoall_bytes` over ``link`` bytes/s (one way) at
    :data:`ALLTOALL_EFFICIENCY`: a training step is ``2 + recomputed / layers`` passes, a log-prob pass 1.
    0 when the link is unknown or nothing is sent."""
    sent = alltoall_bytes(tokens, arch, ep)
    if not sent or not link:
        return 0.0
    return passes * sent / (link * ALLTOALL_EFFICIENCY)


def expert_link(ep: int, node_gpus: int, link: float | None) -> float | None:
    """The bandwidth the all-to-all of ``ep`` ranks runs at: the GPUs' ``link`` within a node of ``node_gpus``,
    the network's share per GPU (:data:`.hardware.NODE_LINK_BYTES_PER_S`) once the ranks span nodes."""
    return link if ep <= max(1, node_gpus) else NODE_LINK_BYTES_PER_S


def alltoall_buffer_bytes(tokens: float, arch: Arch, ep: int, elem_bytes: int = 2) -> float:
    """The all-to-all's send and receive buffers of one MoE layer for a micro-batch of ``tokens``: the ``k``
    routed copies of each hidden state, twice (0 without expert parallelism)."""
    if ep <= 1 or not arch.moe_layers:
        return 0.0
    return 2 * tokens * arch.experts_per_tok * arch.hidden * elem_bytes


__all__ = [
    "ALLTOALL_EFFICIENCY",
    "alltoall_buffer_bytes",
    "alltoall_bytes",
    "alltoall_seconds",
    "expert_link",
    "gathered_layer_params",
    "pipeline_activation_factor",
    "pipeline_idle_share",
    "pipeline_time_factor",
    "stage_params",
]
