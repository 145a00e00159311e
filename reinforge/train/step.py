"""The trainer's forward / backward seam: the one place a step's micro-batches run through a model
(torchtitan's ``forward_backward_step``, with its pipeline branch), for the actor, the critic and
the offline trainer alike.

A trainer says what it wants from each micro-batch with two functions:

* a **head** ``head(outputs, targets) -> (values, ...)``: from the model's outputs at the response
  positions ([n, vocab] logits, or [n] values for a critic) and the response tokens they predict
  ([n] int64), per-token values ([n] each: log-probs, entropy, values; None allowed);
* a **loss** ``loss_fn(i, mb, values) -> (loss, stats)``: micro-batch ``i``'s share of the step
  loss (a scalar, already normalised by the step's counts) and statistics to sum (name -> scalar),
  from ``values`` at all N response tokens of ``mb`` (the response grid's row-major order).

:func:`forward_backward` runs them and back-propagates ``loss * trainer.loss_scale`` (FSDP averages
gradients over its ranks: the scale turns them back into sums); :func:`forward_only` returns the
values. In between, the parallel layout is handled here once:

* **context parallelism**: each rank runs its positions of the micro-batch
  (:class:`~reinforge.train.context_parallel.SequenceShard`); the head sees this rank's response
  tokens and its values are gathered over the group, so every rank's loss is the whole micro-batch's;
* **pipeline parallelism**: the micro-batches go through this rank's stages on the 1F1B / interleaved
  schedule (:class:`~reinforge.train.pipeline.Pipeline`); the head and the loss run on the last stage,
  and the summed statistics are shared over the pipeline, so every rank returns the same sums.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..models.families import native_models
from ..models.loading import is_native
from ..models.moe import Routing
from ..utils import trace
from .batching import MicroBatch
from .context_parallel import SequenceShard
from .pipeline import pad_micro_batch

if TYPE_CHECKING:
    from .model_trainer import ModelTrainer

Values = tuple[torch.Tensor | None, ...]
Head = Callable[[torch.Tensor, torch.Tensor], Values]
LossFn = Callable[[int, MicroBatch, Values], tuple[torch.Tensor, dict[str, Any]]]
RoutingFn = Callable[[MicroBatch], Routing | None]


@dataclass
class ModelInput:
    """What the model runs on for one micro-batch on this rank.

    Attributes:
        input_ids, position_ids: [R, T] int64 (``position_ids`` None: 0..T-1); with context
            parallelism this rank's columns [R, T / cp].
        ctx: the attention context (None: plain causal attention).
        index: (rows, columns) [n] of the positions whose outputs predict this rank's response tokens.
        shard: this rank's share under context parallelism (None without it).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor | None
    ctx: Any
    index: tuple[torch.Tensor, torch.Tensor]
    shard: SequenceShard | None = None


def model_input(trainer: ModelTrainer, mb: MicroBatch) -> ModelInput:
    """The model input of ``mb`` on this rank (its positions only under context parallelism; rows
    padded to a multiple of ``tp`` positions under sequence parallelism)."""
    layout = trainer.parallel.layout
    if layout.sp and mb.input_ids.shape[1] % layout.tp:
        R, T = mb.input_ids.shape
        mb = pad_micro_batch(mb, R, -(-T // layout.tp) * layout.tp, trainer.pad_id)
    shard = trainer.sequence_shard(mb)
    if shard is not None:
        return ModelInput(shard.input_ids, shard.position_ids, shard.ctx, shard.index, shard)
    return ModelInput(mb.input_ids, mb.position_ids, mb.attention(), (mb.logit_rows, mb.logit_cols))


def response_outputs(model: nn.Module, mb: MicroBatch, inp: ModelInput, routing: Routing | None = None) -> torch.Tensor:
    """The model's outputs at the positions ``inp.index``: logits [n, vocab] of a language model,
    values [n] of a critic (reinforge's own model code; rows holding several sequences run with
    their attention context); a Hugging Face model's logits from its padded rows. ``routing``: a
    mixture-of-experts model's :class:`~reinforge.models.moe.Routing` (not with context parallelism).

    Raises:
        ValueError: a packed micro-batch (``train.packing`` other than ``none``) for a Hugging Face
            model; routing with context parallelism.
    """
    if is_native(getattr(model, "backbone", model)):
        if routing is not None:
            if inp.shard is not None:
                raise ValueError(
                    "context parallelism with a mixture-of-experts routing record / replay / aux loss is not "
                    "supported: set train.context_parallel_size=1 for this model"
                )
            return model(inp.input_ids, inp.position_ids, inp.ctx, logits_mask=inp.index, routing=routing)
        return model(inp.input_ids, inp.position_ids, inp.ctx, logits_mask=inp.index)
    if mb.packed:
        raise ValueError(
            f"train.packing: sequences / shared_prompt need {native_models()}; use train.packing=none for this model"
        )
    return model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False).logits[inp.index]


def _apply_head(mb: MicroBatch, inp: ModelInput, head: Head, outputs: torch.Tensor) -> Values:
    """``head`` on this rank's response tokens, gathered over the context-parallel group."""
    targets = mb.targets.reshape(-1)[mb.response_positions()]
    if inp.shard is None:
        return head(outputs, targets)
    values = head(outputs, targets[inp.shard.own])
    return tuple(inp.shard.gather(v) if v is not None else None for v in values)


def forward(
    trainer: ModelTrainer, model: nn.Module, mb: MicroBatch, head: Head | None, routing: Routing | None = None
) -> Values:
    """One micro-batch through ``model`` (not pipelined): ``head`` of its outputs at all N response
    tokens; ``head`` None: the model's output for the rows, e.g. a reward model's scores [R]."""
    if head is None:
        with trainer.autocast():
            return (model(mb.input_ids),)
    inp = model_input(trainer, mb)
    with trainer.autocast():
        outputs = response_outputs(model, mb, inp, routing)
    return _apply_head(mb, inp, head, outputs)


def forward_backward(
    trainer: ModelTrainer,
    model: nn.Module,
    mbs: list[MicroBatch],
    head: Head | None,
    loss_fn: LossFn,
    keys: Sequence[str],
    *,
    routing: RoutingFn | None = None,
    backward: bool = True,
) -> dict[str, float]:
    """Run ``mbs`` through ``model``: each micro-batch's loss (``loss_fn`` on ``head``'s values), its
    backward pass (``backward``; scaled by ``trainer.loss_scale``), and the sums of the losses and of
    the statistics ``keys`` (a statistic ``loss_fn`` leaves out counts 0).

    Returns:
        ``{"loss": sum of the micro-batch losses, key: sum of the statistic, ...}`` as floats (one
        device-to-host copy), the same on every rank of a pipeline; not summed over data-parallel ranks.
    """
    sums: dict[str, Any] = dict.fromkeys(("loss", *keys), 0.0)

    def add(loss: torch.Tensor, stats: dict[str, Any]) -> None:
        sums["loss"] += loss.detach()
        for k, v in stats.items():
            sums[k] += v

    pipeline = trainer.pipeline_of(model)
    if pipeline is not None and not mbs:  # every advantage zero: empty on every rank alike (counts are global)
        return to_floats(sums)
    if pipeline is not None:
        if head is None or routing is not None:
            raise ValueError("pipeline parallelism runs a language model's response tokens, without routing")
        _pipelined(trainer, pipeline, mbs, head, loss_fn, add, backward)
        return trainer.parallel.sum_over_pipeline(to_floats(sums))
    with torch.set_grad_enabled(backward and torch.is_grad_enabled()):
        for i, mb in enumerate(trace.spans_over("micro_batch", mbs, "train")):
            trainer._current_mb = mb
            with trace.span("forward", "train"):
                loss, stats = loss_fn(i, mb, forward(trainer, model, mb, head, routing(mb) if routing else None))
            if backward:
                with trace.span("backward", "train"):
                    (loss * trainer.loss_scale).backward()
            add(loss, stats)
    return to_floats(sums)


def forward_only(
    trainer: ModelTrainer, model: nn.Module, mbs: list[MicroBatch], head: Head, *, routing: RoutingFn | None = None
) -> list[Values | None]:
    """``head``'s values at all response tokens of each micro-batch, without gradients; with pipeline
    parallelism only the last stage has them (None elsewhere: gather per-sample results over the ranks)."""
    out: list[Values | None] = [None] * len(mbs)
    pipeline = trainer.pipeline_of(model)
    with torch.no_grad():
        if pipeline is not None:

            def keep(i: int, mb: MicroBatch, values: Values) -> tuple[torch.Tensor, dict[str, Any]]:
                if i < len(out):
                    out[i] = values
                return values[0].new_zeros(()), {}

            _pipelined(trainer, pipeline, mbs, head, keep, lambda loss, stats: None, backward=False)
            return out
        for i, mb in enumerate(mbs):
            trainer._current_mb = mb
            out[i] = forward(trainer, model, mb, head, routing(mb) if routing else None)
    return out


def _pipelined(
    trainer: ModelTrainer,
    pipeline: Any,
    mbs: list[MicroBatch],
    head: Head,
    loss_fn: LossFn,
    add: Callable[[torch.Tensor, dict[str, Any]], None],
    backward: bool,
) -> None:
    """The pipeline branch: ``mbs`` (made up with dummies to the schedule's count) padded to one shape,
    run on the schedule; on the last stage each micro-batch's head and loss as without a pipeline."""
    n = pipeline.microbatch_count(len(mbs))
    fields = {k: None for k in mbs[0].fields} if mbs else None
    mbs = mbs + [trainer.dummy_micro_batch(fields) for _ in range(n - len(mbs))]
    cp = trainer.parallel.layout.cp
    rows = max(mb.input_ids.shape[0] for mb in mbs)
    length = -(-max(mb.input_ids.shape[1] for mb in mbs) // cp) * cp
    padded = [pad_micro_batch(mb, rows, length, trainer.pad_id) for mb in mbs]
    inputs = [model_input(trainer, mb) for mb in padded]
    device_type = trainer.device.type

    def loss(i: int, logits: torch.Tensor) -> torch.Tensor:
        trainer._current_mb = mbs[i]
        with torch.autocast(device_type, enabled=False):  # the head and the loss run outside autocast, as above
            value, stats = loss_fn(i, padded[i], _apply_head(padded[i], inputs[i], head, logits))
        add(value, stats)
        return value * trainer.loss_scale

    with trace.span("pipeline_schedule", "train"), trainer.autocast():
        pipeline.run(inputs, loss, backward)


def to_floats(values: dict[str, float | torch.Tensor]) -> dict[str, float]:
    """A dict of floats and scalar tensors as floats, with one device-to-host copy for all the
    tensors (a training step accumulates its metrics on the device and synchronises once)."""
    out = {k: float(v) for k, v in values.items() if not isinstance(v, torch.Tensor)}
    keys = [k for k, v in values.items() if isinstance(v, torch.Tensor)]
    if keys:
        out.update(zip(keys, torch.stack([values[k].detach().double() for k in keys]).tolist()))
    return {k: out[k] for k in values}
