"""The published anchors of issue 56 item 3, predicted by the planner's phase model driving the discrete-event model
of the two sides (reinforge/plan/simulate.py): no GPU needed.

* NeMo-RL v0.6, Qwen3-30B-A3B GRPO on 32 H100s at 4k (docs/about/performance-summary.md of NVIDIA-NeMo/RL, recipes
  ``examples/configs/recipes/llm/performance/grpo-qwen3-30ba3b-4n8g.yaml`` and ``...-4n8g-async-1off.yaml``):
  64 prompts x 32 samples, at most 4,096 tokens a sequence (3,203 on average, prompt included), one optimizer step
  a rollout; synchronous: colocated on the 32 GPUs, vLLM engines of 2 GPUs, Megatron EP 8; one step off: 16 GPUs of
  engines (TP 2) and 16 of trainers (EP 8, PP 2), ``max_trajectory_age_steps: 1``, in-flight weight updates.
  Published: 1,102 and 1,414 tokens/s/GPU (all tokens of the step, prompts included, over the step and the GPUs).
* verl, Qwen3-30B-A3B at 32k responses: 377 -> 685 tok/s/GPU (the figure issue 36 and 56 quote). Its settings were
  not found in verl's docs, recipes or issues (searched 2026-12-08): assumed below (:data:`VERL`).

Every row re-plans the workload with reinforge's keys (engines of 2 GPUs need ``engine.backend=vllm``; EP 8 alone,
since reinforge does not combine expert with pipeline parallelism; no partial rollouts, which vLLM engines cannot
do in reinforge); the planner's efficiencies are reinforge's own engine's and trainer's. A sharded trainer with
tensor / expert / pipeline parallelism builds the whole model on each rank before sharding (113.7 GiB in fp32 here):
that refuses those layouts on an H100, so the rows are planned with that setup phase left out (as if each rank loaded
its shard only, as plain FSDP2 now does: train/shard_load.py), and the refusal is printed at the end.
The last two rows are the planner's own choice of layout for each workload.

    PYTHONPATH=. python bench/plan_anchors.py
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan_multi_vs_measured import grpo, model  # noqa: E402

from reinforge.plan import GPUS  # noqa: E402
from reinforge.plan import model as M  # noqa: E402
from reinforge.plan.layout import SIM_SPREAD, SIM_STEPS, LayoutPlan, _plan_one, candidates, plan_layouts  # noqa: E402
from reinforge.plan.simulate import SimResult, StepPhases, jittered, simulate  # noqa: E402


@dataclass
class Anchor:
    """A published run: its settings as reinforge keys, the layout (a name of :func:`candidates`) and the figure."""

    name: str
    layout: str
    gpus: int
    nodes: int
    prompts: int
    n: int
    prompt: int  # tokens (assumed where not published)
    length: int  # rollout.rollout_max_response_len
    mean: int  # mean response tokens
    published: float  # tokens / s / GPU as the source counts them
    count_prompts: bool  # the published figure counts prompt tokens too
    train: dict
    keys: tuple[str, ...] = ()
    staleness: int | None = None


NEMO = [
    Anchor(
        "NeMo-RL 30B-A3B 4k sync",
        "colocated",
        32,
        4,
        64,
        32,
        200,
        3896,
        3003,
        1102,
        True,
        {"train.expert_model_parallel_size": 8},
    ),
    Anchor(
        "NeMo-RL 30B-A3B 4k 1-off",
        "disaggregated 16+16 async",
        32,
        4,
        64,
        32,
        200,
        3896,
        3001,
        1414,
        True,
        {"train.expert_model_parallel_size": 8},
        ("rollout.max_staleness=1",),
        1,
    ),
]
# verl's run, assumed: 4 nodes of 8 H100s, 32 prompts x 16 samples (DAPO-math prompts of ~200 tokens), responses up to
# 32k with a long tail (mean half the limit), FSDP + EP 8; synchronous colocated against one step off on 16 + 16 GPUs
VERL = [
    Anchor(
        "verl 30B-A3B 32k sync",
        "colocated",
        32,
        4,
        32,
        16,
        200,
        32768,
        16384,
        377,
        True,
        {"train.expert_model_parallel_size": 8},
    ),
    Anchor(
        "verl 30B-A3B 32k 1-off",
        "disaggregated 16+16 async",
        32,
        4,
        32,
        16,
        200,
        32768,
        16384,
        685,
        True,
        {"train.expert_model_parallel_size": 8},
        ("rollout.max_staleness=1",),
        1,
    ),
]


def lengths(a: Anchor) -> list[int]:
    """The rollout's response lengths: evenly spread from ``2 mean - length`` (at least 1) to ``length`` (the long
    tail: the longest sets each engine's generation time), ``mean`` on average."""
    n = a.prompts * a.n
    lo = max(1, 2 * a.mean - a.length)
    return [round(lo + (a.length - lo) * i / (n - 1)) for i in range(n)]


def plan(a: Anchor, folder: Path, shard_load: bool, best: bool = False) -> tuple[LayoutPlan, float]:
    """The anchor's layout planned on H100s (``best``: the planner's best layout of those GPUs instead) and its
    tokens / s / GPU as the source counts them."""
    path = model(folder, "qwen3-moe-30b-a3b", own_vocab=True)
    extra = ("engine.backend=vllm", "engine.kv_cache_memory_fraction=0.8", "train.max_tokens_per_gpu=8192")
    cfg = grpo(path, a.prompts * a.n, a.length, *extra, *a.keys, n=a.n)
    keys = dict(candidates(a.gpus, a.nodes, engine_tp=2))[a.layout]
    saved = M.setup_breakdown
    if shard_load:
        M.setup_breakdown = lambda w: None  # type: ignore[assignment]  # (as if each rank loaded its shard only)
    try:
        if best:
            p = plan_layouts(cfg, path, GPUS["h100"], a.gpus, a.nodes, a.prompt, lengths(a))[0]
        else:
            only, k = a.train, a.staleness
            p = _plan_one(cfg, path, GPUS["h100"], a.prompt, a.layout, keys, lengths(a), only=only, staleness=k)
    finally:
        M.setup_breakdown = saved
    tokens = sum(lengths(a)) + (a.prompt * a.prompts * a.n if a.count_prompts else 0)
    return p, tokens / p.step / a.gpus if p.problem is None else 0.0


def streamed(p: LayoutPlan, k: int) -> SimResult:
    """``p``'s asynchronous run again with streaming engines (:func:`.simulate.simulate`'s ``streaming``)."""
    t = p.times
    base = StepPhases(t["generation"], t["log-probs"], t["training"], t["weight sync"], t["generation, no tail"])
    return simulate(jittered(base, SIM_STEPS, SIM_SPREAD), k, streaming=True)


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    print(
        f"{'anchor':<26} {'gen s':>7} {'train s':>8} {'sync s':>7} {'step s':>7} {'idle e/t':>9} "
        f"{'pred tok/s/GPU':>15} {'published':>10} {'ratio':>6}"
    )
    refusal = ""
    with tempfile.TemporaryDirectory() as tmp:
        for a in NEMO + VERL:
            refused, _ = plan(a, Path(tmp), shard_load=False)
            p, rate = plan(a, Path(tmp), shard_load=True)
            if p.problem is not None:
                print(f"{a.name:<26} does not fit: {p.problem[:200]}")
                continue
            t, sim = p.times, p.sim
            idle = f"{sim.engine_idle:.0%}/{sim.trainer_idle:.0%}" if sim else "-"
            print(
                f"{a.name:<26} {t['generation']:>7.1f} {t['log-probs'] + t['training']:>8.1f} {t['weight sync']:>7.2f} "
                f"{p.step:>7.1f} {idle:>9} {rate:>15,.0f} {a.published:>10,.0f} {rate / a.published:>6.2f}"
            )
            if a.staleness:
                sim = streamed(p, a.staleness)
                print(
                    f"  {'streaming engines':<24} {t['generation, no tail']:>7.1f} {'':>8} {'':>7} {sim.step:>7.1f} "
                    f"{sim.engine_idle:>4.0%}/{sim.trainer_idle:.0%} {rate * p.step / sim.step:>15,.0f} "
                    f"{a.published:>10,.0f} {rate * p.step / sim.step / a.published:>6.2f}"
                )
            if refused.problem is not None and not refusal:
                refusal = refused.problem
        for group in (NEMO, VERL):  # what reinforge's planner would choose on those GPUs for that workload
            p, rate = plan(group[0], Path(tmp), shard_load=True, best=True)
            sim = p.sim
            idle = f"{sim.engine_idle:.0%}/{sim.trainer_idle:.0%}" if sim else "-"
            chosen = " ".join(f"{k}={v}" for k, v in p.keys.items() if k.startswith(("train.", "rollout.")) and v)
            print(
                f"{'  planner: ' + p.name:<26} {p.times['generation']:>7.1f} "
                f"{p.times['log-probs'] + p.times['training']:>8.1f} {p.times['weight sync']:>7.2f} {p.step:>7.1f} "
                f"{idle:>9} {rate:>15,.0f}  ({chosen})"
            )
    print("(H100; the rows assume each trainer rank loads its shard only: bench/plan_anchors.py's doc says why)")
    if refusal:
        print(f"as reinforge is today, every row is refused: {refusal.split(': use GPUs')[0]}")


if __name__ == "__main__":
    main()
