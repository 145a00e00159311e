"""From a run's config to its plan: the ``auto`` keys chosen, every phase's memory and time, refusals.

:func:`resolve_config` is the one function ``reinforge plan``, ``reinforge train`` (at the start of
:class:`reinforge.loop.RLLoop`), ``eval``, ``offline``, ``generate`` and ``make-data`` resolve
``auto`` with; :func:`training_problems` is the up-front training-memory check
(:func:`reinforge.preflight.check_rl`). The model is :mod:`reinforge.plan.model`; docs/planner.md
describes the choices.

Keys that accept ``auto`` (:data:`AUTO_KEYS`; all of them by default, issue 56), chosen by
:func:`.choices.choose` in this order:

0. ``train.packing``: ``sequences`` for reinforge's own model code trained in bf16, else ``none``;
1. ``engine.max_num_seqs``: the sequences the run holds at once (rollout or evaluation), capped at
   what the KV cache (``engine.kv_cache_memory_fraction`` of the free memory) holds at a footprint
   of prompt + 3/4 of the response each, never below ``rollout.n_samples_per_prompt`` (chosen last,
   after 4, when the share is ``auto``);
2. ``cluster.offload_rollout``: true when it changes 3's choice for the better (fewer recomputed layers,
   a larger micro-batch, a step that fits only with it) or lets 4's cache grow by more than 5% (local
   mode, synchronous), else false, the reason naming the KV cache the training step then holds;
3. ``model.recompute_num_layers`` and ``train.max_tokens_per_gpu``: the micro-batch is at least one
   whole sequence and at least 8192 tokens (today's default) when that fits, the fewest recomputed
   layers with which it fits (0 allowed: ``gradient_checkpointing`` follows); ``max_tokens_per_gpu``
   alone: the largest micro-batch that fits, at most ``MAX_AUTO_TOKENS`` (or one sequence when longer).
   The recomputation's reason names the resolved micro-batch;
4. ``engine.kv_cache_memory_fraction`` (the embedded engine): the largest share with which every phase
   fits (:func:`.choices.largest_kv_fraction`), no more than the slots need at full length.

Below the choices, :func:`fp8_line` predicts what ``engine.kv_cache_dtype=fp8`` and
``engine.quantization=fp8`` would buy (the dtype stays the user's).

A refusal names the levers with which the step fits, each re-planned (:mod:`.levers`).

Without a GPU the planner cannot size anything, nor choose on a GPU not in its table: ``auto`` becomes
today's default (:data:`DEFAULTS`) and the plan says so.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config.fields import ConfigError
from ..utils.triton import liger_available
from . import model as M
from .choices import (
    AUTO,
    AUTO_HEADROOM,
    AUTO_KEYS,
    DEFAULTS,
    KV_KEY,
    MIN_AUTO_TOKENS,
    Choice,
    _set,
    auto_keys,
    choose,
    largest_kv_fraction,
)
from .hardware import GPU, detect

if TYPE_CHECKING:
    from ..config import Config

log = logging.getLogger(__name__)
__all__ = [  # (the choices' names are read from here too: reinforge.plan, report.py, the tests)
    "AUTO",
    "AUTO_HEADROOM",
    "AUTO_KEYS",
    "DEFAULTS",
    "Choice",
    "Plan",
    "TrainingOutOfMemory",
    "auto_keys",
    "format_plan",
    "largest_kv_fraction",
    "out_of_memory",
    "resolve_config",
    "training_problems",
    "workload",
]


class TrainingOutOfMemory(ConfigError):
    """A CUDA out-of-memory error in the trainer, in words: the phase, the micro-batch and the keys
    to change. A usage error (exit status 2, not relaunched: the same settings would fail again)."""


@dataclass
class Plan:
    """A run's plan: the resolved config, the workload it describes, the choices and notes."""

    cfg: Config
    gpu: GPU | None
    workload: M.Workload | None
    choices: list[Choice] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def memory(self) -> list[M.Breakdown]:
        return M.memory_plan(self.workload) if self.workload is not None else []

    def times(self, lengths: list[int] | None = None) -> dict[str, float | None]:
        return M.times(self.workload, lengths) if self.workload is not None else {}


def read_config(folder: Path) -> dict[str, Any]:
    """The model's ``config.json``.

    Raises:
        FileNotFoundError: ``folder`` has no config.json.
    """
    import json

    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: no config.json (model.path must be a Hugging Face folder)")
    return json.loads(path.read_text())


def read_arch(folder: Path) -> tuple[M.Arch, bool]:
    """The model's :class:`~.model.Arch` and whether reinforge's own model code runs it."""
    from ..models.families import is_native_type

    config = read_config(folder)
    return M.Arch.from_config(config), is_native_type(config.get("model_type"))


def teacher_sizes(cfg: Config) -> dict[str, int]:
    """``teacher_params`` and ``teacher_flop_params`` of :class:`~.model.Workload`: the checkpoint teachers of
    ``distill`` summed (read from their config.json; a teacher not found counts 0 and the run's start says why)."""
    from ..models.hub import resolve_model_path

    params = flops = 0
    for where in cfg.distill.local_teachers().values():
        try:
            arch, _ = read_arch(resolve_model_path(where))
        except FileNotFoundError:
            continue
        params, flops = params + arch.num_params, flops + arch.flop_params
    return {"teacher_params": params, "teacher_flop_params": flops}


def workload(
    cfg: Config, arch: M.Arch, gpu: GPU, prompt_len: int, native: bool = True, offline: bool = False
) -> M.Workload:
    """The :class:`~.model.Workload` of ``cfg`` (``auto`` keys at a placeholder: resolve them first for
    anything but the choices). ``offline``: a trainer without engine (``reinforge offline``)."""
    from .sequences import run_max_seqs

    r, e, t, m, c, a = cfg.rollout, cfg.engine, cfg.train, cfg.model, cfg.cluster, cfg.algo
    seqs = r.rollout_batch_size * r.n_samples_per_prompt if t.num_rollout > 0 else (run_max_seqs(cfg) or 1)
    slots = e.max_num_seqs if e.max_num_seqs != AUTO else seqs
    k = m.recompute_num_layers
    recompute = 0 if not m.gradient_checkpointing else arch.num_layers if k in (None, AUTO) else min(k, arch.num_layers)
    ray = c.mode == "ray"
    tp, cp, pp = t.tensor_model_parallel_size, t.context_parallel_size, t.pipeline_model_parallel_size
    dp = max(1, c.num_trainers // (tp * cp * pp)) if ray else 1
    colocated = not offline and (not ray or c.colocate)
    return M.Workload(
        arch=arch,
        gpu=gpu,
        prompt_len=prompt_len,
        response_len=0 if offline else r.rollout_max_response_len,
        num_seqs=seqs,
        slots=min(slots, seqs),
        micro_tokens=t.max_tokens_per_gpu if t.max_tokens_per_gpu != AUTO else MIN_AUTO_TOKENS,
        recompute=recompute,
        kv_elem_bytes=1 if e.kv_cache_dtype.startswith("fp8") else (4 if e.dtype == "fp32" else 2),
        engine_elem_bytes=4 if e.dtype == "fp32" else 2,
        kv_fraction=e.kv_cache_memory_fraction if e.kv_cache_memory_fraction != AUTO else DEFAULTS[KV_KEY],
        num_kv_blocks=e.num_kv_blocks,
        log_prob_chunk=t.log_prob_chunk_size,
        colocated=colocated,
        offload_rollout=(c.offload_rollout is True) or (ray and c.colocate),
        offload_engine_weights=c.offload_engine_weights,
        reference=a.needs_reference,
        critic=a.needs_critic,
        dp=dp,
        tp=tp,
        cp=cp,
        ep=t.expert_model_parallel_size,
        pp=pp,
        vpp=t.virtual_pipeline_model_parallel_size,
        engine_tp=c.rollout_num_gpus_per_engine if ray and not offline else 1,
        node_gpus=c.actor_num_gpus_per_node if ray else 8,
        ray=ray,
        engines=max(1, c.rollout_num_gpus // c.rollout_num_gpus_per_engine) if ray and not offline else 1,
        lora=m.lora_rank > 0,
        train_bf16=m.train_dtype != "fp32",
        eager_norms=not (m.torch_compile or (m.fused_kernels and liger_available())),
        fused_logprobs=m.trains_fused_kernels,  # (on a GPU: Triton ships with CUDA builds of torch)
        optimizer_offload=t.optimizer_offload,
        fsdp_offload=t.fsdp_cpu_offload,
        logprob_passes=int(cfg.needs_old_log_probs) + int(a.needs_reference),  # as the loop runs them
        **({} if offline else teacher_sizes(cfg)),
        steps_per_rollout=t.num_steps_per_rollout,
        prefill_tokens=e.max_prefill_tokens,
        engine_fp8=e.quantization == "fp8",
    )


def resolve_config(
    cfg: Config,
    model_folder: Path | str,
    *,
    gpu: GPU | None | str = "detect",
    prompt_len: int | None = None,
    offline: bool = False,
    log_plan: bool = False,
) -> tuple[Config, Plan]:
    """Resolve the ``auto`` keys of ``cfg`` and plan the run (module doc).

    Args:
        cfg: the run's config (left unchanged; a copy is returned).
        model_folder: the policy's Hugging Face folder.
        gpu: the GPU to plan for; ``"detect"``: the one ``train.device`` names (None on a CPU).
        prompt_len: the longest prompt in tokens (default ``data.rollout_max_prompt_len``, an upper bound).
        offline: a trainer without engine (``reinforge offline``).
        log_plan: log the plan's table (``reinforge train`` does at its start).
    Returns:
        (the config with every ``auto`` key replaced, the :class:`Plan`).
    """
    from ..models.shape import ShapeUnknown
    from ..utils.device import resolve_device

    if gpu == "detect":
        gpu = detect(resolve_device(cfg.train.device)) if cfg.train.device != "cpu" else None
    try:
        arch, native = read_arch(Path(model_folder))
        unknown = None
    except ShapeUnknown as e:  # a family with its own size keys: plan nothing, say so, never stop here
        unknown = str(e)
    prompt = prompt_len or cfg.data.rollout_max_prompt_len
    keys = auto_keys(cfg)
    if gpu is None or unknown is not None:
        changes = {k: DEFAULTS[k] for k in keys}
        why = "no GPU to plan for" if gpu is None else "the model's size is unknown"
        plan = Plan(
            _set(cfg, changes),
            gpu,
            None,
            [Choice(k, v, f"{why}: today's default") for k, v in changes.items()],
            [
                "no GPU: memory and time are not planned (the CPU checks of reinforge/preflight.py apply); "
                "`reinforge plan --gpu h100` (or h200, a100, l40s, 4090) plans for a GPU from this machine"
                if gpu is None
                else f"memory and time are not planned: {unknown}"
            ],
        )
    else:
        if gpu.knows_speed:
            changes, choices = choose(cfg, workload(cfg, arch, gpu, prompt, native, offline), native, offline)
        else:  # its memory is read, but nothing the `auto` choices rest on was measured on it
            changes = {k: DEFAULTS[k] for k in keys}
            choices = [
                Choice(k, v, f"{gpu.name} is not in the planner's table: today's default") for k, v in changes.items()
            ]
        resolved = _set(cfg, changes)
        plan = Plan(resolved, gpu, workload(resolved, arch, gpu, prompt, native, offline), choices)
        if gpu.knows_speed and not offline:
            line = fp8_line(cfg, plan, arch, native)
            if line:
                plan.notes.append(line)
        if not gpu.knows_speed:
            plan.notes.append(
                f"{gpu.name} is not in the planner's table (reinforge/plan/hardware.py): `auto` keys take today's "
                f"defaults; memory is checked from its {gpu.memory / M.GIB:.0f} GiB, time is not predicted"
            )
        if prompt_len is None:
            plan.notes.append(f"prompts assumed {prompt} tokens (data.rollout_max_prompt_len)")
    if log_plan:
        log.info("plan:\n%s", format_plan(plan))
    return plan.cfg, plan


def fp8_line(cfg: Config, plan: Plan, arch: M.Arch, native: bool) -> str | None:
    """What fp8 would buy this run, predicted: the step with ``engine.kv_cache_dtype=fp8``, with
    ``engine.quantization=fp8`` and with both (each re-planned: its ``auto`` keys chosen again, e.g. twice
    the sequences in the cache), against this plan's step; None when both are set already or time is
    not predicted. The dtype stays the user's: fp8 makes the engine's log-probs differ more from the
    trainer's, which ``algo.use_tis`` corrects for."""
    w = plan.workload
    if w is None or cfg.train.num_rollout == 0:
        return None
    base = sum(s for s in plan.times().values() if s is not None)
    e = cfg.engine
    options = {}
    if not e.kv_cache_dtype.startswith("fp8"):
        options["engine.kv_cache_dtype=fp8"] = {"engine.kv_cache_dtype": "fp8"}
    if e.quantization != "fp8" and e.backend != "hf" and native:
        options["engine.quantization=fp8"] = {"engine.quantization": "fp8"}
    if len(options) == 2:
        options["both"] = {"engine.kv_cache_dtype": "fp8", "engine.quantization": "fp8"}
    if not options or base <= 0:
        return None
    said = []
    for name, change in options.items():
        alt = _set(cfg, change)
        changes, _ = choose(alt, workload(alt, arch, w.gpu, w.prompt_len, native), native, False)
        v = workload(_set(alt, changes), arch, w.gpu, w.prompt_len, native)
        t = M.times(v)
        step, gen = sum(s for s in t.values() if s is not None), t.get("generation")
        said.append(f"{name} {step:.1f} s ({step / base - 1:+.0%}; generation {gen:.1f} s)")
    tis = "on" if cfg.algo.use_tis else "off: set algo.use_tis=true with it"
    return (
        f"fp8 would buy (predicted step, now {base:.1f} s): {', '.join(said)}; it makes the engine's log-probs "
        f"differ more from the trainer's (the rollout-training mismatch), which algo.use_tis corrects ({tis})"
    )


def _g(x: Any) -> str:
    """A number as ``:g`` formats it; ``auto`` (or any other word) as it is."""
    return f"{x:g}" if isinstance(x, (int, float)) else str(x)


def _gib(b: float) -> str:
    return f"{b / M.GIB:.1f} GiB"


def training_problems(plan: Plan, prompt_len: int | None = None) -> list[str]:
    """The training step's peak against the GPU's usable memory, in words naming the keys and the
    values that fit (``prompt_len``: the longest prompt for the one-sequence minimum); first, for a
    sharded trainer, the whole model each rank builds before sharding (:func:`~.model.setup_breakdown`)."""
    w = plan.workload
    cfg = plan.cfg
    if w is None or cfg.train.num_rollout == 0 or w.micro_tokens <= 0:
        return []
    if prompt_len is not None:
        w = M.with_(w, prompt_len=prompt_len)
    setup = M.setup_breakdown(w)
    if setup is not None and setup.total > w.usable:
        lora = M.with_(w, lora=True, train_bf16=True)
        fix = (
            f"with LoRA (model.lora_rank > 0) the frozen base is built in bf16 ({_gib(M.setup_breakdown(lora).total)})"
            if not w.lora and M.setup_breakdown(lora).total <= w.usable
            else "no setting makes it fit"
        )
        return [
            f"each of the {w.shards} trainer ranks builds the whole model ({_gib(setup.total)}) on its GPU before "
            f"FSDP shards it, but {w.gpu.name} leaves ~{_gib(w.usable)} to allocate: {fix}; use GPUs with more "
            f"memory, or plain data parallelism without LoRA or train.fsdp_cpu_offload (then each rank loads "
            f"only its shard)"
        ]
    peak = M.train_breakdown(w)
    if peak.total <= w.usable:
        return []
    L, t = w.arch.num_layers, cfg.train.max_tokens_per_gpu
    rec = "none" if w.recompute == 0 else f"{w.recompute} of {L}"
    head = (
        f"train.max_tokens_per_gpu={t} needs ~{_gib(peak.total)} at the training step's peak ({peak.words(5)}; "
        f"layers recomputed: {rec}) but {w.gpu.name} leaves ~{_gib(w.usable)} to allocate "
        f"({_gib(w.gpu.memory)} less {_gib(M.CUDA_CONTEXT)} and a {1 - M.USABLE_FRACTION:.0%} margin)"
    )
    fixes = []
    fit = M.max_tokens_that_fit(w)
    one = w.seq_len
    if fit >= one:
        fixes.append(f"it fits at train.max_tokens_per_gpu<={fit}")
    k = M.min_recompute_that_fits(w, t)
    if k is not None and k > w.recompute:
        fixes.append(
            f"set model.recompute_num_layers={k}"
            + ("" if cfg.model.gradient_checkpointing else " with model.gradient_checkpointing=true")
        )
    if "KV cache" in peak.parts:  # the cache stays beside the training step: a smaller share of memory
        f = largest_kv_fraction(w, w.usable)
        if f is not None and f < w.kv_fraction:
            fixes.append(f"set engine.kv_cache_memory_fraction={f:g} (or auto)")
    from .levers import training_levers

    only = ("cluster.offload_rollout",) if fixes else None  # the micro-batch or recomputation fits: short
    found = training_levers(
        dataclasses.replace(plan, workload=w),
        lambda changes: workload(_set(cfg, changes), w.arch, w.gpu, w.prompt_len),
        only,
    )
    levers = [f"set {x}" if not x.startswith("a GPU") else f"use {x}" for x in found]
    if not fixes:
        fixes.append(
            f"one sequence of {one} tokens does not fit even with every layer recomputed"
            + (
                f"; it fits with {levers[0].removeprefix('set ').removeprefix('use ')}"
                if len(levers) == 1
                else "; each of these fits"
                if levers
                else "; nor with any lever the planner checks (cluster.offload_rollout, train.optimizer_offload, "
                "train.fsdp_cpu_offload, model.lora_rank, a shorter rollout.rollout_max_response_len, "
                "train.context_parallel_size=2, alone or in pairs, or a larger GPU of its table)"
            )
        )
        fixes, levers = [fixes[0] + (": " + ", or ".join(levers) if len(levers) > 1 else "")], []
    return [f"{head}: {', or '.join(fixes + levers)} (`reinforge plan` shows every phase)"]


def out_of_memory(cfg: Config, phase: str, tokens: int, rows: int, error: BaseException) -> TrainingOutOfMemory:
    """The error a CUDA out-of-memory in the trainer becomes (raise it ``from`` the original)."""
    t, m = cfg.train, cfg.model
    rec = (
        ("every layer" if m.recompute_num_layers is None else f"{m.recompute_num_layers} layers")
        if m.gradient_checkpointing
        else "none"
    )
    first = str(error).split(". ")[0]
    return TrainingOutOfMemory(
        f"CUDA out of memory in the {phase} (a micro-batch of {tokens} tokens in {rows} row(s); "
        f"train.max_tokens_per_gpu={t.max_tokens_per_gpu}, recomputed: {rec}, cluster.offload_rollout="
        f"{cfg.cluster.offload_rollout}, engine.kv_cache_memory_fraction={_g(cfg.engine.kv_cache_memory_fraction)}): "
        f"lower train.max_tokens_per_gpu (or set it to auto), set model.gradient_checkpointing=true and "
        f"model.recompute_num_layers (or auto), cluster.offload_rollout=true, or lower "
        f"engine.kv_cache_memory_fraction; `reinforge plan -c CONFIG` shows what fits. No checkpoint was written "
        f"at this point (the newest one is kept). ({first})"
    )


def bottleneck_line(memory: list[M.Breakdown], times: dict[str, float | None]) -> str:
    """``bottleneck: time: <phase> <s> of the <total> s step (<share>); memory: <phase> peaks at <GiB>, most
    of it <part> (<GiB>, <share>)``: the phase that takes the most predicted time, the phase with the
    highest peak and that peak's largest term."""
    known = {p: s for p, s in times.items() if s is not None}
    total = sum(known.values())
    if known and total > 0:
        slow = max(known, key=lambda p: known[p])
        time = f"time: {slow} {known[slow]:.1f} s of the {total:.1f} s step ({known[slow] / total:.0%})"
    else:
        time = "time: not predicted on this GPU"
    peak = max(memory, key=lambda b: b.total)
    part, size = max(peak.parts.items(), key=lambda kv: kv[1])
    return (
        f"bottleneck: {time}; memory: {peak.phase} peaks at {_gib(peak.total)}, most of it {part} "
        f"({_gib(size)}, {size / peak.total:.0%})"
    )


def format_plan(plan: Plan, lengths: list[int] | None = None) -> str:
    """The plan as a short table: phase, peak memory, predicted time; then each ``auto`` choice."""
    lines = []
    w = plan.workload
    if plan.gpu is not None and w is not None:
        lines.append(
            f"{plan.gpu.name} ({_gib(plan.gpu.memory)}, {plan.gpu.source}); {w.num_seqs} sequences of "
            f"<= {w.seq_len} tokens, micro-batch {w.micro_tokens} tokens, {w.recompute} of "
            f"{w.arch.num_layers} layers recomputed; usable {_gib(w.usable)}"
        )
        times = plan.times(lengths)
        lines.append(
            f"{'phase':<12} {'peak memory':>12} {'predicted':>10}  largest parts (GiB; time "
            f"{'at the measured lengths' if lengths else 'with every response at its maximum'})"
        )
        for b in plan.memory():
            s = times.get(b.phase)
            lines.append(
                f"{b.phase:<12} {_gib(b.total):>12} {f'{s:.1f} s' if s is not None else 'n/a':>10}  {b.words(4)}"
            )
        for phase in ("weight sync",):
            s = times.get(phase)
            lines.append(f"{phase:<12} {'':>12} {f'{s:.3f} s' if s is not None else 'n/a':>10}")
        lines.append(bottleneck_line(plan.memory(), times))
    for c in plan.choices:
        lines.append(f"auto {c.key}={c.value}: {c.reason}")
    lines += [f"note: {n}" for n in plan.notes]
    return "\n".join(lines)
