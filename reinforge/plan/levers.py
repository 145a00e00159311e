"""The settings that make a refused training step fit, each one re-planned rather than guessed.

:func:`training_levers` takes a :class:`~.planner.Plan` whose training step does not fit its GPU and
re-plans it (:func:`~.planner.workload` on the config with one key changed) with each lever that
lowers the step's memory: the micro-batch and the recomputed layers, ``cluster.offload_rollout``,
``train.optimizer_offload``, ``train.fsdp_cpu_offload``, ``model.lora_rank``, a shorter
``rollout.rollout_max_response_len``, ``train.context_parallel_size`` over more GPUs, a GPU of the
planner's table with more memory. It names only those with which the step fits (:func:`how_it_fits`:
as it is, with some layers recomputed, or at a smaller micro-batch with every layer recomputed); when
no single lever fits, pairs of them. docs/planner.md ("When the step does not fit").
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import model as M

if TYPE_CHECKING:
    from .planner import Plan

MORE_MEMORY = 1.05  # a GPU of the table counts as larger above this share of the present one's memory
LORA_RANK = 16  # the rank the LoRA lever is planned with (the adapters' memory is negligible at any rank)


def how_it_fits(w: M.Workload, gradient_checkpointing: bool = True) -> str | None:
    """How ``w``'s training step fits its GPU's usable memory: ``""`` as it is; ``"with
    model.recompute_num_layers=K"``; ``"at train.max_tokens_per_gpu<=N with every layer recomputed"``
    (N at least one whole sequence); None when it does not (nor, for a sharded trainer, the whole
    model each rank builds before sharding)."""
    setup = M.setup_breakdown(w)
    if setup is not None and setup.total > w.usable:
        return None
    if M.train_breakdown(w).total <= w.usable:
        return ""
    ckpt = "" if gradient_checkpointing else " and model.gradient_checkpointing=true"
    k = M.min_recompute_that_fits(w, w.micro_tokens)
    if k is not None and k > w.recompute:
        return f"with model.recompute_num_layers={k}{ckpt}"
    L = w.arch.num_layers
    fit = M.max_tokens_that_fit(w, L)
    if fit >= w.seq_len:
        return f"at train.max_tokens_per_gpu<={fit} with every layer recomputed (model.recompute_num_layers={L}{ckpt})"
    return None


# (key, value, why it lowers the step's memory, whether it applies to a workload and its config)
CONFIG_LEVERS: tuple[tuple[str, Any, str, Callable[[M.Workload, Any], bool]], ...] = (
    (
        "cluster.offload_rollout",
        True,
        "the KV cache is freed while training",
        lambda w, cfg: (
            w.colocated and not w.offload_rollout and cfg.cluster.mode == "local" and cfg.rollout.max_staleness == 0
        ),
    ),
    (
        "train.optimizer_offload",
        True,
        "AdamW's moments in host memory",
        lambda w, cfg: not (w.optimizer_offload or w.fsdp_offload),
    ),
    (
        "train.fsdp_cpu_offload",
        True,
        "weights, gradients and AdamW in host memory, a layer at a time on the GPU",
        lambda w, cfg: not w.fsdp_offload,
    ),
    ("model.lora_rank", LORA_RANK, "LoRA: no gradients or AdamW for the frozen base", lambda w, cfg: not w.lora),
)


def _text(value: Any) -> str:
    """A value as a ``key=value`` override writes it (``true``, not ``True``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _shorter_response(w: M.Workload) -> M.Workload | None:
    """``w`` with the longest response with which one whole sequence fits (every layer recomputed);
    None when no response is short enough or the present one already is."""
    L = w.arch.num_layers
    room = M.max_tokens_that_fit(M.with_(w, recompute=L), L) - w.prompt_len
    if not 0 < room < w.response_len:
        return None
    return M.with_(w, response_len=room, micro_tokens=min(w.micro_tokens, w.prompt_len + room))


def training_levers(
    plan: Plan, replan: Callable[[dict[str, Any]], M.Workload], only: tuple[str, ...] | None = None
) -> list[str]:
    """The levers with which ``plan``'s refused training step fits (module doc), in words naming each
    key and value and how it fits (:func:`how_it_fits`); last, the smallest GPU of the planner's table
    with more memory on which it fits as configured. Empty when none does. ``only``: just these config
    keys of :data:`CONFIG_LEVERS` (the refusal's short form, when the micro-batch or recomputation
    already fits). ``replan(changes)``: the workload of ``plan``'s config with ``changes`` (``{key: value}``)."""
    from .hardware import GPUS

    w, cfg = plan.workload, plan.cfg
    if w is None:
        return []
    ckpt = cfg.model.gradient_checkpointing

    def named(v: M.Workload | None, words: str) -> str | None:
        how = how_it_fits(v, ckpt) if v is not None else None
        return None if how is None else words + (f" {how}" if how else "")

    levers = [
        (key, value, why)
        for key, value, why, applies in CONFIG_LEVERS
        if applies(w, cfg) and (only is None or key in only)
    ]
    found = [named(replan({key: value}), f"{key}={_text(value)} ({why})") for key, value, why in levers]
    if only is not None:
        return [x for x in found if x is not None]
    short = _shorter_response(w)
    if short is not None:
        also = f" and train.max_tokens_per_gpu={short.micro_tokens}" if short.micro_tokens != w.micro_tokens else ""
        found.append(named(short, f"rollout.rollout_max_response_len={short.response_len}{also}"))
    if w.cp == 1 and not w.ray:
        found.append(named(M.with_(w, cp=2), "train.context_parallel_size=2 over 2 GPUs"))
    out = [x for x in found if x is not None]
    if not out:  # no single lever: two together (e.g. the optimizer offloaded and the rollout's KV cache freed)
        for (ka, va, _), (kb, vb, _) in itertools.combinations(levers, 2):
            both = named(replan({ka: va, kb: vb}), f"{ka}={_text(va)} together with {kb}={_text(vb)}")
            if both is not None:
                out.append(both)
    bigger = [
        key
        for key, gpu in sorted(GPUS.items(), key=lambda kv: kv[1].memory)
        if gpu.memory > MORE_MEMORY * w.gpu.memory and how_it_fits(M.with_(w, gpu=gpu), ckpt) is not None
    ]
    if bigger:
        name = GPUS[bigger[0]].name
        out.append(f"a GPU with more memory (it fits on one {name}: `reinforge plan --gpu '{bigger[0]}'`)")
    return out
