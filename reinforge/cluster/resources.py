"""Resource checks in words, before any process or actor starts.

(Lengths, token budgets and the embedded engine's KV cache are :mod:`reinforge.preflight`'s
checks, run once before any placement.)

:func:`check_placement` compares what a placement asks for with what exists (this machine, or
a running Ray cluster) and raises :class:`ClusterError` listing every shortfall, what exists,
and the flags to change:

* GPUs: trainer ranks (+ engines when disaggregated) against the GPUs;
* CPU mode (no GPU): worker processes x ``cluster.num_cpus_per_worker`` against the cores, and
  an estimate of the memory of every process against the available memory.

The memory estimate (:func:`estimate_memory`) is deliberately simple and documented in its
message: a trainer rank holds fp32 weights, gradients and two AdamW moments (16 bytes per
parameter, sharded over the ranks) plus one full fp32 copy (weight sync / checkpoint gather),
the reference model (4 bytes per parameter) when KL needs it, a critic like the policy, and the
logits of one micro-batch (``train.max_tokens_per_gpu`` x vocabulary x 4 bytes); an engine holds
its weights and its KV cache as the up-front checks count them (:func:`reinforge.engine.kv_cache.kv_cache_plan`:
``max_model_len`` x ``engine.max_num_seqs`` (capped at what the run holds at once,
:func:`reinforge.plan.sequences.run_max_seqs`) x the bytes per token of :mod:`reinforge.plan.kv`, the sink block
and a hybrid's states included, at ``engine.dtype``); every process adds about 0.5 GiB (Python, torch).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..models.shape import ModelShape, ShapeUnknown, model_shape
from ..utils.machine import machine_resources

if TYPE_CHECKING:
    from ..config import Config

log = logging.getLogger(__name__)

GIB = 1 << 30
PROCESS_OVERHEAD = GIB // 2  # bytes: interpreter, torch, Ray worker
TRAIN_BYTES_PER_PARAM = 16  # fp32 weights + gradients + AdamW exp_avg + exp_avg_sq
FP32 = 4


__all__ = ["ClusterError", "ModelShape", "model_shape", "machine_resources", "estimate_memory", "check_placement"]


class ClusterError(ValueError):
    """The machine or cluster cannot host the requested placement; the message says what was
    asked, what exists and which settings to change. A usage error: ``reinforge`` exits with
    status 2 and the supervisor does not relaunch."""


@dataclass
class MemoryEstimate:
    """Bytes per trainer rank and per engine, and how they were counted (for the message)."""

    trainer: int
    engine: int
    trainer_parts: str
    engine_parts: str


def estimate_memory(cfg: Config, shape: ModelShape, max_model_len: int, world_size: int) -> MemoryEstimate:
    """Host memory of one trainer rank and one engine process in CPU mode (see the module doc): the trainer's
    state as the planner counts it (:func:`reinforge.plan.model.trainer_state`), the engine's as the up-front
    checks do (:func:`reinforge.engine.kv_cache.kv_cache_plan`)."""
    from ..config.fields import unplanned
    from ..plan.model import trainer_state
    from ..plan.planner import teacher_sizes

    p, m = shape.num_params, cfg.model
    parts = trainer_state(
        p,
        max(world_size, 1),
        lora=m.lora_rank > 0,
        bf16=m.train_dtype == "bf16",  # (`auto` is fp32 on a CPU)
        reference=cfg.algo.needs_reference,
        critic=cfg.algo.needs_critic,
        teacher_params=teacher_sizes(cfg)["teacher_params"],
    )
    frozen = {k: int(parts.pop(k)) for k in ("reference", "critic", "teachers") if k in parts}
    state, full = int(sum(parts.values())), FP32 * p
    tokens = unplanned(cfg.train).max_tokens_per_gpu  # (`auto` here: no GPU planned it, its CPU value)
    logits = tokens * shape.vocab_size * FP32
    trainer = PROCESS_OVERHEAD + state + full + sum(frozen.values()) + logits
    import torch

    from ..engine.kv_cache import kv_cache_plan
    from ..rollout.backends import engine_config_for, engine_dtype

    cpu = torch.device("cpu")  # (CPU mode: the engine's one-block layout, its sink block and states included)
    eng = kv_cache_plan(shape, engine_config_for(cfg), max_model_len, cpu, engine_dtype(cfg.engine.dtype, cpu))
    slots, kv = eng.slots, eng.bytes + eng.state_bytes  # engine.max_num_seqs capped at what the run holds at once
    engine = PROCESS_OVERHEAD + eng.total
    g = lambda b: f"{b / GIB:.1f} GiB"  # noqa: E731
    tparts = (
        f"{p / 1e6:.0f}M parameters "
        + (
            f"x {TRAIN_BYTES_PER_PARAM} bytes (fp32 weights, gradients, AdamW)"
            if set(parts) == {"weights fp32", "AdamW", "gradients"}
            else f"({', '.join(parts)})"  # LoRA: the base's weights, the adapters' state negligible
        )
        + f" / {world_size} rank(s) = {g(state)}, a full fp32 copy {g(full)}"
        + "".join(f", the {k}{' model' if k == 'reference' else ''} {g(b)}" for k, b in frozen.items())
        + f", logits of train.max_tokens_per_gpu={tokens} tokens {g(logits)}"
    )
    eparts = (
        f"weights {g(eng.weight_bytes)}, KV cache {g(kv)} for {slots} sequences (engine.max_num_seqs="
        f"{cfg.engine.max_num_seqs}, capped at what the run holds at once) of {max_model_len} tokens"
    )
    return MemoryEstimate(trainer, engine, tparts, eparts)


def placement_counts(cfg: Config) -> dict[str, int]:
    """Trainer ranks, engines, GPUs and worker processes (bundles) of the placement."""
    c = cfg.cluster
    trainers = c.actor_num_nodes * c.actor_num_gpus_per_node if c.mode == "ray" else 1
    engines = c.rollout_num_gpus // c.rollout_num_gpus_per_engine if c.mode == "ray" else 1
    gpus = trainers if c.colocate or c.mode == "local" else trainers + c.rollout_num_gpus
    processes = 1 if c.mode == "local" else (trainers if c.colocate else trainers + engines)
    return {"trainers": trainers, "engines": engines, "gpus": gpus, "processes": processes}


def layout_words(cfg: Config, trainers: int) -> str:
    """``trainers`` in words with their parallel layout, e.g. ``"4 (4 trainer ranks = 2 data x 2 tensor)"``
    (the number alone when every rank is data parallel or the sizes do not divide it: config checks say so)."""
    from ..parallel_layout import Layout

    try:
        layout = Layout.of_train(cfg.train, trainers)
    except ValueError:
        return str(trainers)
    return f"{trainers} ({layout.words()})" if layout.dp != trainers or layout.ep > 1 else str(trainers)


def check_placement(
    cfg: Config,
    resources: dict[str, float],
    model_folder: Path | None = None,
    max_model_len: int | None = None,
    where: str = "this machine",
) -> bool:
    """Check the placement of ``cfg`` against ``resources`` (``CPU``, ``GPU``, ``memory`` in
    bytes; a missing ``memory`` skips the memory check). ``max_model_len`` defaults to
    ``rollout_max_response_len`` (a lower bound: prompts are not known yet).

    With ``model_folder``, the memory of every process is estimated in CPU mode (:func:`estimate_memory`).
    (The lengths, token budgets, engine slots and the engine's KV cache are :mod:`reinforge.preflight`'s, checked
    once by ``reinforge train`` and :class:`reinforge.loop.RLLoop` before any placement.)

    Returns:
        whether the run uses GPUs.
    Raises:
        ClusterError: every shortfall in one message, with the settings to change.
    """
    c, n = cfg.cluster, placement_counts(cfg)
    have_gpus, have_cpus = int(resources.get("GPU", 0)), float(resources.get("CPU", 0))
    mode = (
        "local (cluster.mode=local: one process)"
        if c.mode == "local"
        else "colocated (cluster.colocate=true)"
        if c.colocate
        else "disaggregated (cluster.colocate=false)"
    )
    split = f"actor_num_nodes * actor_num_gpus_per_node = {layout_words(cfg, n['trainers'])}" + (
        "" if c.colocate or c.mode == "local" else f" + rollout_num_gpus = {c.rollout_num_gpus}"
    )
    if have_gpus and cfg.train.device != "cpu":
        if have_gpus < n["gpus"]:
            raise ClusterError(
                f"the {mode} placement needs {n['gpus']} GPUs ({split}) but {where} has "
                f"{have_gpus}: lower those settings or add nodes"
            )
        need_cpus = n["processes"] * c.num_cpus_per_worker
        if have_cpus < need_cpus and c.mode == "ray":
            raise ClusterError(
                f"the {mode} placement runs {n['processes']} worker processes of "
                f"cluster.num_cpus_per_worker={c.num_cpus_per_worker:g} CPUs ({need_cpus:g} in all) "
                f"but {where} has {have_cpus:g} CPUs: lower cluster.num_cpus_per_worker"
            )
        return True
    problems, warnings = [], []
    need_cpus = n["processes"] * c.num_cpus_per_worker
    procs = (
        f"{n['processes']} worker processes ({n['trainers']} trainer rank(s)"
        + ("" if c.colocate else f" + {n['engines']} engine(s)")
        + ")"
    )
    if have_cpus < need_cpus and c.mode == "ray":
        problems.append(f"{procs} x cluster.num_cpus_per_worker={c.num_cpus_per_worker:g} = {need_cpus:g} CPU cores")
    need_mem = None
    if model_folder is not None and "memory" in resources and c.memory_check != "off":
        length = max_model_len or cfg.rollout.rollout_max_response_len
        try:
            shape = model_shape(model_folder)
        except ShapeUnknown as e:  # a family with its own size keys: the run is not refused on a guess
            log.warning("memory estimate unavailable, not checked: %s", e)
            shape = None
        est = estimate_memory(cfg, shape, length, n["trainers"]) if shape is not None else None
        # every engine is a process of its own in Ray mode; in local mode it shares the trainer's
        shared = PROCESS_OVERHEAD if c.mode == "local" else 0
        need_mem = n["trainers"] * est.trainer + n["engines"] * est.engine - shared if est is not None else None
        if est is not None and need_mem is not None and need_mem > resources["memory"]:
            # one local process is not refused on an estimate (the default path is unchanged): a warning
            found = warnings if c.mode == "local" or c.memory_check == "warn" else problems
            found.append(
                f"about {need_mem / GIB:.1f} GiB of memory: {n['trainers']} trainer rank(s) of "
                f"{est.trainer / GIB:.1f} GiB ({est.trainer_parts}) and {n['engines']} engine(s) of "
                f"{est.engine / GIB:.1f} GiB ({est.engine_parts})"
            )
    mem = f" and {resources['memory'] / GIB:.1f} GiB of available memory" if "memory" in resources else ""
    if warnings and not problems:
        log.warning(
            "the %s placement may not fit in memory on %s (%.1f GiB available): the run needs %s. An "
            "estimate; lower engine.max_num_seqs or train.max_tokens_per_gpu if it runs out of memory",
            mode,
            where,
            resources["memory"] / GIB,
            warnings[0],
        )
    if problems:
        problems += warnings
        raise ClusterError(
            f"the {mode} placement ({split}) cannot run on {where}: it has no GPU, {have_cpus:g} CPU cores{mem}; "
            f"the run needs "
            + "; and ".join(problems)
            + ". "
            + (
                "Lower engine.max_num_seqs or train.max_tokens_per_gpu, use a smaller model.path, or run on a GPU"
                if c.mode == "local"
                else "Lower cluster.actor_num_gpus_per_node / cluster.actor_num_nodes (trainer ranks) and "
                "cluster.rollout_num_gpus (engines), e.g. to 1 each (or use cluster.mode=local), lower "
                "engine.max_num_seqs or train.max_tokens_per_gpu for memory, set cluster.num_cpus_per_worker "
                "below 1 to share cores between processes, or run on GPUs. The memory figure is an estimate: "
                "cluster.memory_check=warn (or off) runs anyway"
            )
        )
    return False
