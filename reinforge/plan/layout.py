"""Plans for many GPUs (issue 56, item 3): for ``gpus`` GPUs on ``nodes`` nodes, the layouts a Ray run can
take, each planned by the one-GPU planner (:func:`~.planner.resolve_config` on the config with the
``cluster`` keys of that layout) and ranked by predicted generated tokens per second per GPU.

Candidates (:func:`candidates`):

* **colocated**: every GPU holds a trainer rank and an engine (``cluster.colocate=true``; the engines sleep
  while the trainers train), synchronous;
* **disaggregated**: ``r`` GPUs for the engines and the rest for the trainers, for every split that
  places the trainers in whole nodes or within one; synchronous (the two sides take turns) and
  asynchronous with ``rollout.max_staleness=1`` (one rollout ahead: the step is the longer side, plus the
  weight sync);
* the trainer's layout in each: FSDP over its GPUs, then ``train.context_parallel_size`` 2, 4 or
  ``train.tensor_model_parallel_size`` 2, 4, 8 (within a node) until the step fits (the first that does:
  :func:`~.planner.training_problems` empty); engines of one GPU each (``cluster.rollout_num_gpus_per_engine``
  > 1 needs vLLM or SGLang: there the fewest GPUs per engine whose weights leave room for a cache).

Step time: colocated and synchronous: the phases' sum; asynchronous: ``max(generation, log-probs +
training) + weight sync``. Not modelled: pipeline and expert parallelism (an EP layout is planned as its
FSDP one), the network between nodes beyond the weight broadcast, the long tail's idle engines in a
synchronous step. docs/planner.md ("Plans for many GPUs") has the checks against the recorded runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config.fields import ConfigError
from . import model as M
from .choices import _set
from .hardware import GPU

if TYPE_CHECKING:
    from ..config import Config

PARALLEL = ({}, {"train.context_parallel_size": 2}, {"train.tensor_model_parallel_size": 2})
PARALLEL += ({"train.context_parallel_size": 4}, {"train.tensor_model_parallel_size": 4})
PARALLEL += ({"train.tensor_model_parallel_size": 8},)


@dataclass
class LayoutPlan:
    """One layout's keys and prediction.

    Attributes:
        name: ``colocated``, ``disaggregated r+t`` (engine and trainer GPUs), `` async`` appended.
        keys: the config keys that make it (``cluster.*``, ``train.*_parallel_size``, ``rollout.max_staleness``).
        times: predicted seconds per phase of one rollout (generation: each engine its share).
        step: predicted seconds per rollout step; tok_s_gpu: generated tokens / step / GPUs.
        peaks: GiB per GPU at each phase's peak (a trainer's GPU; an engine's when disaggregated: ``engine``).
        problem: why it does not fit (None: it does).
    """

    name: str
    keys: dict[str, Any]
    times: dict[str, float]
    step: float
    tok_s_gpu: float
    peaks: dict[str, float]
    problem: str | None = None


def candidates(gpus: int, nodes: int, engine_tp: int = 1) -> list[tuple[str, dict[str, Any]]]:
    """The ``cluster`` keys of each layout of ``gpus`` GPUs on ``nodes`` nodes (module doc)."""
    per_node = gpus // nodes
    if per_node * nodes != gpus:
        raise ConfigError(f"--gpus={gpus} is not a whole number of GPUs on each of --nodes={nodes}")
    ray = {"cluster.mode": "ray", "cluster.rollout_num_gpus_per_engine": engine_tp}
    out = [
        (
            "colocated",
            {
                **ray,
                "cluster.colocate": True,
                "cluster.actor_num_nodes": nodes,
                "cluster.actor_num_gpus_per_node": per_node,
                "cluster.rollout_num_gpus": gpus,
                "rollout.max_staleness": 0,
            },
        )
    ]
    for engines in range(engine_tp, gpus, engine_tp):
        trainers = gpus - engines
        t_nodes = max(1, trainers // per_node)
        if trainers % t_nodes or (trainers > per_node and trainers % per_node):
            continue
        keys = {
            **ray,
            "cluster.colocate": False,
            "cluster.actor_num_nodes": t_nodes,
            "cluster.actor_num_gpus_per_node": trainers // t_nodes,
            "cluster.rollout_num_gpus": engines,
        }
        name = f"disaggregated {engines}+{trainers}"
        out.append((name, {**keys, "rollout.max_staleness": 0}))
        out.append((f"{name} async", {**keys, "rollout.max_staleness": 1}))
    return out


def _plan_one(
    cfg: Config,
    folder: Path,
    gpu: GPU,
    prompt_len: int,
    name: str,
    keys: dict[str, Any],
    lengths: list[int] | None = None,
) -> LayoutPlan:
    """The first trainer layout of :data:`PARALLEL` with which ``keys`` fit, planned (times at the
    response ``lengths`` when given, e.g. a recorded run's; else every response at its maximum)."""
    from .planner import resolve_config, training_problems

    problem = "no trainer layout fits"
    gpus = keys["cluster.rollout_num_gpus"] + (0 if keys["cluster.colocate"] else _trainers(keys))
    for parallel in PARALLEL:
        try:
            candidate = _set(cfg, {**keys, **parallel}).validate()
        except ConfigError as e:
            problem = str(e)
            continue
        resolved, plan = resolve_config(candidate, folder, gpu=gpu, prompt_len=prompt_len)
        found = training_problems(plan, prompt_len)
        if found:
            problem = found[0]
            continue
        w = plan.workload
        assert w is not None
        t = {k: v or 0.0 for k, v in plan.times(lengths).items()}
        trainer = t["log-probs"] + t["training"]
        step = max(t["generation"], trainer) if keys["rollout.max_staleness"] else t["generation"] + trainer
        step += t["weight sync"]
        tokens = sum(lengths) if lengths else w.num_seqs * w.response_len
        peaks = {b.phase: b.total / M.GIB for b in plan.memory()}
        if not w.colocated:  # the engines' GPUs hold the generation phase, the trainers' the rest
            peaks["engine"] = peaks.pop("generation")
        return LayoutPlan(name, {**keys, **parallel}, t, step, tokens / step / gpus, peaks)
    return LayoutPlan(name, keys, {}, float("inf"), 0.0, {}, problem)


def _trainers(keys: dict[str, Any]) -> int:
    return keys["cluster.actor_num_nodes"] * keys["cluster.actor_num_gpus_per_node"]


def plan_layouts(
    cfg: Config, folder: Path | str, gpu: GPU, gpus: int, nodes: int = 1, prompt_len: int | None = None
) -> list[LayoutPlan]:
    """Every candidate layout of ``cfg`` on ``gpus`` GPUs of type ``gpu`` over ``nodes`` nodes, planned,
    best first (most generated tokens per second per GPU; those that do not fit last).

    Raises:
        ConfigError: ``gpus`` not a multiple of ``nodes``.
    """
    prompt = prompt_len or cfg.data.rollout_max_prompt_len
    tp = 1 if cfg.engine.backend in ("embedded", "hf") else _engine_tp(cfg, Path(folder), gpu)
    out = [_plan_one(cfg, Path(folder), gpu, prompt, n, k) for n, k in candidates(gpus, nodes, tp)]
    return sorted(out, key=lambda p: (p.problem is not None, -p.tok_s_gpu))


def _engine_tp(cfg: Config, folder: Path, gpu: GPU) -> int:
    """The fewest GPUs per engine whose bf16 weights take at most half of one GPU's usable memory."""
    from .planner import read_arch

    arch, _ = read_arch(folder)
    usable = (gpu.memory - M.CUDA_CONTEXT) * M.USABLE_FRACTION
    tp = 1
    while arch.weight_bytes(2, tp) > usable / 2 and tp < 8:
        tp *= 2
    return tp


def format_layouts(plans: list[LayoutPlan], gpu: GPU, gpus: int, nodes: int) -> str:
    """The layouts as a table, best first, and the chosen one's keys."""
    lines = [
        f"{gpus} x {gpu.name} on {nodes} node(s): layouts, best first (predicted; each phase's peak GiB per GPU)",
        f"{'layout':<26} {'step s':>8} {'tok/s/GPU':>10} {'gen s':>7} {'train s':>8} {'sync s':>7}  peaks / why not",
    ]
    for p in plans:
        if p.problem is not None:
            lines.append(f"{p.name:<26} {'-':>8} {'-':>10} {'':>7} {'':>8} {'':>7}  does not fit: {p.problem[:160]}")
            continue
        t = p.times
        peaks = ", ".join(f"{k} {v:.0f}" for k, v in p.peaks.items())
        lines.append(
            f"{p.name:<26} {p.step:>8.1f} {p.tok_s_gpu:>10,.0f} {t['generation']:>7.1f} "
            f"{t['log-probs'] + t['training']:>8.1f} {t['weight sync']:>7.2f}  {peaks}"
        )
    best = plans[0]
    if best.problem is None:
        lines.append("chosen: " + " ".join(f"{k}={_word(v)}" for k, v in best.keys.items()))
        if best.keys.get("rollout.max_staleness"):
            lines.append(
                "max_staleness=1: the engines generate the next rollout while the trainers train this one; "
                "more staleness adds no speed when one side is the longer every step (it only absorbs uneven steps)"
            )
    return "\n".join(lines)


def _word(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


__all__ = ["LayoutPlan", "candidates", "format_layouts", "plan_layouts"]
