"""Pipeline parallelism for the trainer (``train.pipeline_model_parallel_size``, Megatron's name),
with ``torch.distributed.pipelining``.

**Stages.** The ``L`` decoder layers are cut into ``S = pp x vpp`` stages of ``L / S`` consecutive
layers (``vpp``: ``train.virtual_pipeline_model_parallel_size``); stage ``s`` runs on pipeline rank
``s mod pp`` (so with ``vpp`` > 1 a rank holds ``vpp`` model chunks, Megatron's interleaving). The
first stage also holds the embedding, the last the final norm and the LM head. Each rank keeps
only its own parts of the model (:func:`split_stages`): its layers stay under their global names
(``model.layers.<i>`` in an ``nn.ModuleDict``), so the optimizer, checkpoints and weight export see
the Hugging Face names. A tied LM head (SmolLM2, Qwen2.5 < 7B) becomes a copy on the last stage;
its gradient and the embedding's are summed between the first and last stage before every step
(Megatron's embedding group), so the two copies stay equal.

**Schedules.** One pipeline rank: ``Schedule1F1B``; several model chunks per rank:
``ScheduleInterleaved1F1B`` (Narayanan et al. 2021). Both need at least ``pp`` micro-batches, the
interleaved one a multiple of its rounds: dummy micro-batches (loss weight 0) make up the count
(:meth:`Pipeline.microbatch_count`, :func:`reinforge.parallel_layout.microbatch_count`).

**Shapes.** The RL trainer's micro-batches differ in rows and length, but a stage receives its
activations into buffers sized once per schedule. Every micro-batch of a step is padded to the
step's largest ``[rows, length]`` (:func:`pad_micro_batch`: pad tokens after the real ones, which
causal or packed attention never lets a real position see; whole rows of padding), and a new
schedule is built for each step with those shapes given up front (no shape inference on the
wire). With ``train.packing: sequences`` a micro-batch is one row of at most
``train.max_tokens_per_gpu`` tokens, so the padding stays under one micro-batch's budget.
Only the logits of the response positions leave the last stage; the losses are computed there,
per micro-batch, with the step's normalisation (:mod:`reinforge.train.step`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..models.loading import named_weights
from ..parallel_layout import microbatch_count
from .batching import MicroBatch

if TYPE_CHECKING:
    from ..models.transformer import CausalLM
    from .collectives import ParallelContext


@dataclass(frozen=True)
class WeightInfo:
    """One Hugging Face weight of the whole model and the pipeline rank that holds it."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    owner: int


class StageModule(nn.Module):
    """One pipeline stage of a :class:`~reinforge.models.transformer.CausalLM`: its decoder layers
    (the model's own modules, registered here too) and, first or last, the embedding or the final
    norm and LM head. ``forward(x, mb_index)``: ``x`` token ids [R, T] (first stage) or the previous
    stage's hidden states [R, T, hidden]; returns hidden states, or on the last stage the micro-batch's
    loss [1] (``loss(mb_index, logits)`` of the logits [n, vocab] at the response positions: a fixed
    output shape, which torch 2.11's schedules check on the last stage too). What else a micro-batch
    needs (positions, the attention context, the response positions) and ``loss`` are set for the step
    by :class:`Pipeline`."""

    def __init__(self, lm: CausalLM, index: int, layer_ids: range, first: bool, last: bool):
        super().__init__()
        self.__dict__["lm"] = lm  # not a submodule: the model is not this stage's to shard
        self.index = index
        self.embed_tokens = lm.model.embed_tokens if first else None
        self.layers = nn.ModuleDict({str(i): lm.model.layers[i] for i in layer_ids})
        self.norm = lm.model.norm if last else None
        self.lm_head = lm.lm_head if last else None
        self.inputs: list[Any] = []
        self.loss: Callable[[int, torch.Tensor], torch.Tensor] | None = None
        self.act_dtype = torch.float32

    def forward(self, x: torch.Tensor, mb_index: torch.Tensor) -> torch.Tensor:
        inp, lm = self.inputs[int(mb_index)], self.lm
        if self.embed_tokens is not None:
            x = self.embed_tokens(x)
        positions = inp.position_ids
        if positions is None:
            positions = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)
        ropes = lm.layer_ropes(positions, x.dtype)
        recompute = lm.gradient_checkpointing and lm.training and torch.is_grad_enabled()
        n_recompute = len(self.layers) if lm.recompute_num_layers is None else lm.recompute_num_layers
        for i, (key, layer) in enumerate(self.layers.items()):  # (recompute_num_layers: per model chunk, as Megatron)
            cos, sin = ropes[int(key)]
            if recompute and i < n_recompute:
                x = checkpoint(layer, x, cos, sin, inp.ctx, None, use_reentrant=False)
            else:
                x = layer(x, cos, sin, inp.ctx)
        if self.lm_head is None:
            return x.to(self.act_dtype)
        assert self.loss is not None, "Pipeline.run sets the last stage's loss"
        return self.loss(int(mb_index), self.lm_head(self.norm(x)[inp.index])).reshape(1)


@dataclass
class StageSplit:
    """This rank's stages and every weight of the whole model with its owner."""

    stages: list[StageModule]
    weights: list[WeightInfo]
    tied: bool


def _owner(name: str, layers_per_stage: int, pp: int) -> int:
    if name.startswith("model.layers."):
        return (int(name.split(".")[2]) // layers_per_stage) % pp
    return 0 if name.startswith("model.embed_tokens.") else pp - 1


def split_stages(lm: CausalLM, pp: int, vpp: int, pp_rank: int) -> StageSplit:
    """Keep only pipeline rank ``pp_rank``'s stages of ``lm`` (in place; see the module doc) and
    return them as :class:`StageModule` s, first to last.

    Raises:
        ValueError: ``pp * vpp`` does not divide the decoder layers (names the keys).
    """
    from ..parallel_layout import Layout

    L, S = lm.args.num_layers, pp * vpp
    problems = Layout(pp=pp, vpp=vpp).model_problems(1, 1, 1, L)
    if problems:
        raise ValueError(problems[0])
    k = L // S
    weights = [WeightInfo(n, tuple(t.shape), t.dtype, _owner(n, k, pp)) for n, t in named_weights(lm)]
    tied = lm.lm_head.weight is lm.model.embed_tokens.weight
    mine = [s for s in range(S) if s % pp == pp_rank]
    if S - 1 in mine and tied:  # the embedding lives on the first stage, another rank: the head gets a copy
        lm.lm_head.weight = nn.Parameter(lm.lm_head.weight.detach().clone())
    layers = list(lm.model.layers)
    stages = [StageModule(lm, s, range(s * k, (s + 1) * k), s == 0, s == S - 1) for s in mine]
    lm.model.layers = nn.ModuleDict({str(i): layers[i] for s in mine for i in range(s * k, (s + 1) * k)})
    if 0 not in mine:
        lm.model.embed_tokens = None
    if S - 1 not in mine:
        lm.model.norm, lm.lm_head = None, None
    return StageSplit(stages, weights, tied)


def pad_micro_batch(mb: MicroBatch, rows: int, length: int, pad_id: int) -> MicroBatch:
    """``mb``'s model input padded to ``[rows, length]``: pad tokens after each row's end and whole rows
    of padding (attention mask 0, sequence id -1, positions repeating the row's last); the response
    grid and the positions that predict it are unchanged."""
    R, T = mb.input_ids.shape
    if (R, T) == (rows, length):
        return mb
    pad = (0, length - T, 0, rows - R)
    positions = mb.position_ids
    if positions is None:
        positions = torch.arange(T, device=mb.input_ids.device).expand(R, T)
    positions = torch.cat([positions, positions[:, -1:].expand(R, length - T)], 1)  # (any valid position)
    return replace(
        mb,
        input_ids=F.pad(mb.input_ids, pad, value=pad_id),
        attention_mask=F.pad(mb.attention_mask, pad, value=0),
        position_ids=F.pad(positions, (0, 0, 0, rows - R)),
        doc_ids=F.pad(mb.doc_ids, pad, value=-1) if mb.doc_ids is not None else None,
        shared=F.pad(mb.shared, pad, value=False) if mb.shared is not None else None,
    )


class Pipeline:
    """This rank's pipeline stages of a model and how to run a step's micro-batches through them.

    Args:
        lm: the model, split by :func:`split_stages` (this rank's parts only).
        split: what :func:`split_stages` returned (the stages, FSDP-wrapped or not by now).
        parallel: this rank's place (the ``pp`` group, ranks, device).
        act_dtype: the dtype of the activations between stages (bf16 under FSDP's mixed precision;
            None: fp32).
    """

    def __init__(self, lm: CausalLM, split: StageSplit, parallel: ParallelContext, act_dtype: torch.dtype | None):
        self.lm, self.stages, self.weights, self.tied = lm, split.stages, split.weights, split.tied
        self.parallel = parallel
        layout = parallel.layout
        self.pp, self.vpp, self.group = layout.pp, layout.vpp, parallel.pp_group
        self.act_dtype = act_dtype or torch.float32
        for st in self.stages:
            st.act_dtype = self.act_dtype
        if self.tied:
            parallel.mesh.pipeline_ends()  # (a collective the first time: every rank, now)

    # ------------------------------------------------------------------ running micro-batches
    def microbatch_count(self, n: int) -> int:
        """:func:`microbatch_count` of this pipeline."""
        return microbatch_count(n, self.pp, self.vpp)

    def run(self, inputs: list[Any], loss: Callable[[int, torch.Tensor], torch.Tensor], backward: bool) -> None:
        """Run one schedule over the micro-batches whose stage inputs are ``inputs`` (all of one shape:
        ``input_ids`` [R, T], ``position_ids``, ``ctx``, ``index``; as many as :meth:`microbatch_count`).
        On the last stage ``loss(i, logits)`` gets micro-batch ``i``'s logits at its response positions
        and returns what to back-propagate (``backward``; else forward only, its result ignored)."""
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B

        n = len(inputs)
        R, T = inputs[0].input_ids.shape
        # (requires_grad: what a stage receives and sends back a gradient for)
        hidden = torch.empty(R, T, self.lm.args.hidden_size, dtype=self.act_dtype, device="meta", requires_grad=True)
        loss_out = torch.empty(1, dtype=torch.float32, device="meta", requires_grad=True)  # (the last stage's)
        ids = torch.empty(R, T, dtype=torch.long, device="meta")
        device = inputs[0].input_ids.device
        S = self.pp * self.vpp
        stages = []
        for st in self.stages:
            st.inputs, st.loss = inputs, loss
            first, last = st.index == 0, st.index == S - 1
            stages.append(
                PipelineStage(
                    st,
                    st.index,
                    S,
                    device,
                    input_args=ids if first else hidden,
                    output_args=loss_out if last else hidden,
                    group=self.group,
                )
            )

        def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return output.sum()  # (the last stage's output is its micro-batch's loss already)

        if self.vpp == 1:
            schedule: Any = Schedule1F1B(stages[0], n, loss_fn=loss_fn, scale_grads=False)
        else:
            schedule = ScheduleInterleaved1F1B(stages, n, loss_fn=loss_fn, scale_grads=False)
        args = (torch.cat([x.input_ids for x in inputs]),) if any(st.index == 0 for st in self.stages) else ()
        index = torch.arange(n)
        try:
            with torch.no_grad() if not backward else contextlib.nullcontext():
                (schedule.step if backward else schedule.eval)(*args, target=index, mb_index=index)
        finally:
            for st in self.stages:
                st.inputs, st.loss = [], None

    # ------------------------------------------------------------------ the tied embedding
    def _tied_param(self) -> nn.Parameter | None:
        """This rank's copy of a tied embedding / LM head (the first stage's embedding, the last
        stage's head), None elsewhere or when untied."""
        if not self.tied:
            return None
        if self.lm.model.embed_tokens is not None:
            return self.lm.model.embed_tokens.weight
        return self.lm.lm_head.weight if self.lm.lm_head is not None else None

    def head_copy(self) -> nn.Parameter | None:
        """The last stage's copy of a tied embedding (left out of the gradient norm: counted once)."""
        return self.lm.lm_head.weight if self.tied and self.lm.lm_head is not None else None

    def sync_tied_grads(self) -> None:
        """Sum the gradients of the tied embedding and its LM-head copy between the first and the last
        stage (both then take the same step); a no-op for an untied model."""
        p = self._tied_param()
        if p is None:
            return
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
        dist.all_reduce(g, group=self.parallel.mesh.pipeline_ends())

    # ------------------------------------------------------------------ weights out
    def full_named_weights(self, full_tensor: Callable[[torch.Tensor], torch.Tensor]):
        """(Hugging Face name, full tensor) of every weight of the whole model, in the one-process
        order, on every rank: the stage that holds a weight gathers it (``full_tensor``: FSDP / TP
        shards) and broadcasts it over the pipeline. A collective: every rank iterates it in step."""
        mine = dict(named_weights(self.lm))
        for w in self.weights:
            if w.owner == self.parallel.pp_rank:
                t = full_tensor(mine[w.name]).detach().contiguous()
            else:
                t = torch.empty(w.shape, dtype=w.dtype, device=self._device())
            t = self._broadcast(t, w.owner)
            yield w.name, t

    def _device(self) -> torch.device:
        p = next(iter(self.lm.parameters()))
        return p.device if not hasattr(p, "device_mesh") else p.to_local().device

    def _broadcast(self, t: torch.Tensor, owner: int) -> torch.Tensor:
        src = dist.get_global_rank(self.group, owner)
        dist.broadcast(t, src=src, group=self.group)
        return t
