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
* the trainer's layout in each (:func:`ladder`): FSDP over its GPUs, then (a mixture-of-experts model)
  ``train.expert_model_parallel_size`` 2, 4, 8 within a node, ``train.context_parallel_size`` 2, 4,
  ``train.tensor_model_parallel_size`` 2, 4, 8 (within a node), ``train.pipeline_model_parallel_size`` 2, 4, until
  the step fits (the first that does: :func:`~.planner.training_problems` empty), each only where the trainer
  runs it (:meth:`reinforge.parallel_layout.Layout.config_problems` on the model's config.json, and the config's
  checks); engines of one GPU each (``cluster.rollout_num_gpus_per_engine`` > 1 needs vLLM or SGLang: there the
  fewest GPUs per engine whose weights leave room for a cache).

Step time: colocated and synchronous: the phases' sum; asynchronous: ``max(generation, log-probs +
training) + weight sync``. Pipeline and expert parallelism's memory and time: :mod:`.parallel`. Not modelled: the
network between nodes beyond the weight broadcast, the long tail's idle engines in a synchronous step.
docs/planner.md ("Plans for many GPUs") has the checks against the recorded runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config.fields import ConfigError
from . import model as M
from .choices import _set
from .hardware import GPU
from .simulate import SimResult, StepPhases, choose_staleness, jittered, simulate

if TYPE_CHECKING:
    from ..config import Config

PARALLEL = ({}, {"train.context_parallel_size": 2}, {"train.tensor_model_parallel_size": 2})
PARALLEL += ({"train.context_parallel_size": 4}, {"train.tensor_model_parallel_size": 4})
PARALLEL += ({"train.tensor_model_parallel_size": 8},)
EP_KEY, PP_KEY = "train.expert_model_parallel_size", "train.pipeline_model_parallel_size"


def ladder(moe: bool, per_node: int) -> list[dict[str, Any]]:
    """The trainer layouts tried in order (module doc): :data:`PARALLEL` with expert parallelism (a MoE model)
    after FSDP alone and pipeline parallelism last; EP and TP within ``per_node`` GPUs (their collectives run
    every layer: NVLink, not the network)."""
    ep = [{EP_KEY: e} for e in (2, 4, 8) if moe and e <= per_node]
    tp = [x for x in PARALLEL[1:] if x.get("train.tensor_model_parallel_size", 1) <= per_node]
    return [{}, *ep, *tp, {PP_KEY: 2}, {PP_KEY: 4}]


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
        sim: the discrete-event model's run of the layout (:mod:`.simulate`: the step, each side's idle share).
        workload: the trainer's :class:`~.model.Workload` as planned (None: it does not fit).
    """

    name: str
    keys: dict[str, Any]
    times: dict[str, float]
    step: float
    tok_s_gpu: float
    peaks: dict[str, float]
    problem: str | None = None
    sim: SimResult | None = None
    workload: M.Workload | None = None


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
    only: dict[str, Any] | None = None,
    staleness: int | None = None,
) -> LayoutPlan:
    """The first trainer layout of :func:`ladder` with which ``keys`` fit, planned (times at the
    response ``lengths`` when given, e.g. a recorded run's; else every response at its maximum); ``only``: that
    trainer layout (``train.*`` keys) alone. The step is :func:`_simulated`'s (``staleness``: that
    ``max_staleness`` for an asynchronous layout instead of the one chosen)."""
    from .planner import read_config, resolve_config, training_problems

    problem, memory = "no trainer layout fits", None  # memory: FSDP's refusal, the most telling when none fits
    gpus = keys["cluster.rollout_num_gpus"] + (0 if keys["cluster.colocate"] else _trainers(keys))
    config = read_config(folder)
    moe = M.Arch.from_config(config).moe_layers > 0  # (GPT-OSS's num_local_experts too)
    for parallel in [only] if only is not None else ladder(moe, keys["cluster.actor_num_gpus_per_node"]):
        try:
            candidate = _set(cfg, {**keys, **parallel}).validate()
        except ConfigError as e:
            problem = str(e)
            continue
        found = _layout_problems(candidate, config)
        if found:
            problem = found[0]
            continue
        resolved, plan = resolve_config(candidate, folder, gpu=gpu, prompt_len=prompt_len)
        found = training_problems(plan, prompt_len)
        if found:
            problem, memory = found[0], memory or found[0]
            continue
        w = plan.workload
        assert w is not None
        t = {k: v or 0.0 for k, v in plan.times(lengths).items()}
        if lengths:  # the same tokens without the long tail: a streaming engine's seconds (:mod:`.simulate`)
            even = [round(sum(lengths) / len(lengths))] * len(lengths)
            t["generation, no tail"] = M.generation_seconds(*M.per_engine(w, even)) or 0.0
        sim, k = _simulated(t, keys, candidate, staleness)
        keys = {**keys, "rollout.max_staleness": k}
        step = sim.step
        tokens = sum(lengths) if lengths else w.num_seqs * w.response_len
        peaks = {b.phase: b.total / M.GIB for b in plan.memory()}
        if not w.colocated:  # the engines' GPUs hold the generation phase, the trainers' the rest
            peaks["engine"] = peaks.pop("generation")
        return LayoutPlan(name, {**keys, **parallel}, t, step, tokens / step / gpus, peaks, sim=sim, workload=w)
    return LayoutPlan(name, keys, {}, float("inf"), 0.0, {}, memory or problem)


SMALL_STEP_S = 5.0  # below it the recorded steps were 2.5-12x their prediction (docs/benchmarks.md)
SIM_STEPS, SIM_SPREAD = 64, 0.15  # steps simulated; the steps' spread of generation and training (assumed)


def _simulated(t: dict[str, float], keys: dict[str, Any], cfg: Config, staleness: int | None) -> tuple[SimResult, int]:
    """The layout's run of :data:`SIM_STEPS` steps and its ``max_staleness``: 0 when synchronous (equal steps);
    asynchronous (steps :func:`.simulate.jittered` by :data:`SIM_SPREAD`), ``staleness`` or else the smallest that
    reaches the best step (:func:`.simulate.choose_staleness`), with ``rollout.partial_rollout`` as ``cfg`` sets it
    (with ``rollout.over_sampling_batch_size`` too, synchronous: the long tail cut)."""
    full = t.get("generation, no tail")
    base = StepPhases(t["generation"], t["log-probs"], t["training"], t["weight sync"], full)
    r = cfg.rollout
    how = {
        "partial_rollout": r.partial_rollout,
        "streaming": r.partial_rollout and r.over_sampling_batch_size is not None,
    }
    if not keys["rollout.max_staleness"]:  # the sides take turns: uneven steps add up as even ones do
        return simulate([base] * SIM_STEPS, 0, colocated=keys["cluster.colocate"], streaming=how["streaming"]), 0
    if staleness is None:
        staleness = choose_staleness(base, SIM_STEPS, SIM_SPREAD, **how)[0]
    return simulate(jittered(base, SIM_STEPS, SIM_SPREAD), staleness, **how), staleness


def _layout_problems(cfg: Config, model_config: dict[str, Any]) -> list[str]:
    """What the trainer cannot run of ``cfg``'s parallel sizes on its trainer ranks and this model."""
    from ..parallel_layout import Layout

    try:
        layout = Layout.of_train(cfg.train, cfg.cluster.num_trainers)
    except ValueError as e:
        return [str(e)]
    return layout.config_problems(model_config) if model_config else []


def _trainers(keys: dict[str, Any]) -> int:
    return keys["cluster.actor_num_nodes"] * keys["cluster.actor_num_gpus_per_node"]


def plan_layouts(
    cfg: Config,
    folder: Path | str,
    gpu: GPU,
    gpus: int,
    nodes: int = 1,
    prompt_len: int | None = None,
    lengths: list[int] | None = None,
) -> list[LayoutPlan]:
    """Every candidate layout of ``cfg`` on ``gpus`` GPUs of type ``gpu`` over ``nodes`` nodes, planned (at the
    response ``lengths`` when given), best first (most generated tokens per second per GPU; those that do not fit
    last).

    Raises:
        ConfigError: ``gpus`` not a multiple of ``nodes``.
    """
    prompt = prompt_len or cfg.data.rollout_max_prompt_len
    tp = 1 if cfg.engine.backend in ("embedded", "hf") else _engine_tp(cfg, Path(folder), gpu)
    out = [_plan_one(cfg, Path(folder), gpu, prompt, n, k, lengths) for n, k in candidates(gpus, nodes, tp)]
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
        f"{'layout':<26} {'step s':>8} {'tok/s/GPU':>10} {'gen s':>7} {'train s':>8} {'sync s':>7} {'idle e/t':>9}"
        "  peaks / why not",
    ]
    for p in plans:
        if p.problem is not None:
            lines.append(f"{p.name:<26} {'-':>8} {'-':>10} {'':>27}  does not fit: {p.problem[:160]}")
            continue
        t = p.times
        peaks = ", ".join(f"{k} {v:.0f}" for k, v in p.peaks.items())
        idle = f"{p.sim.engine_idle:.0%}/{p.sim.trainer_idle:.0%}" if p.sim is not None else "-"
        lines.append(
            f"{p.name:<26} {p.step:>8.1f} {p.tok_s_gpu:>10,.0f} {t['generation']:>7.1f} "
            f"{t['log-probs'] + t['training']:>8.1f} {t['weight sync']:>7.2f} {idle:>9}  {peaks}"
        )
    best = plans[0]
    if best.problem is None:
        lines.append("chosen: " + " ".join(f"{k}={_word(v)}" for k, v in best.keys.items()))
        k = best.keys.get("rollout.max_staleness")
        if k:
            lines.append(
                f"max_staleness={k}: the smallest with which the simulated step ({SIM_STEPS} steps whose generation "
                f"and training vary by {SIM_SPREAD:.0%}) is within 2% of the best any staleness reaches; the engines "
                f"generate up to {k} rollout(s) ahead while the trainers train"
            )
        sim = best.sim
        if sim is not None and not best.keys.get("cluster.colocate") and max(sim.engine_idle, sim.trainer_idle) > 0.1:
            side, other = ("trainers", "engines") if sim.trainer_idle > sim.engine_idle else ("engines", "trainers")
            lines.append(
                f"the {side} idle {max(sim.engine_idle, sim.trainer_idle):.0%} of the step: the {other}' side is "
                f"the longer; a split with more GPUs for it (above, where one fits) would balance them"
            )
    lines.append(
        "step: the discrete-event model of the two sides (reinforge/plan/simulate.py); idle e/t: the engines' and "
        "the trainers' idle share of it (weight syncs count as busy)"
    )
    if best.problem is None and best.step < SMALL_STEP_S:
        lines.append(
            f"a step under {SMALL_STEP_S:g} s: fixed costs the model leaves out (engine wake-up, launches, "
            "collectives, "
            "~0.5 s a phase in the recorded runs of models <= 0.5B) dominate it; the prediction is a lower bound"
        )
    return "\n".join(lines)


def _word(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


__all__ = ["LayoutPlan", "candidates", "format_layouts", "plan_layouts"]
