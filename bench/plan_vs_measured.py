"""The planner's prediction against a run's measurement, per phase (issue 37, items 1-2).

Runs ``--rollouts`` rollout steps of a config (``RLLoop``, as ``reinforge train`` does, ``auto`` keys
resolved by the planner) and prints one table for the last step: each phase's predicted seconds
(the planner's time model at the step's measured response lengths) against the measured
``time/*`` metric, and, on a GPU, the predicted peak memory against ``torch.cuda.max_memory_allocated``
taken around the phase (the counter is reset when the phase starts). On a CPU the memory columns are
``n/a`` and the prediction is that of ``--gpu`` when given (a CPU run checks the script, not the model).

    PYTHONPATH=. python bench/plan_vs_measured.py -c examples/arith_grpo.yaml --rollouts 2
    PYTHONPATH=. python bench/plan_vs_measured.py -c CONFIG --rollouts 2 train.max_tokens_per_gpu=auto
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

PHASES = (
    ("generation", "time/generate"),
    ("log-probs", "time/logprob"),
    ("training", "time/train"),
    ("weight sync", "time/sync"),
)


def _gib(b: float | None) -> str:
    return "n/a" if b is None else f"{b / 2**30:.1f}"


def _sec(s: float | None) -> str:
    return "n/a" if s is None else f"{s:.3f}" if s < 1 else f"{s:.1f}"


class PeakMeter:
    """Wraps ``obj.name`` so each call records the CUDA peak allocated during it under ``phase``."""

    def __init__(self) -> None:
        self.cuda = torch.cuda.is_available()
        self.peaks: dict[str, float] = {}

    def wrap(self, obj, name: str, phase: str) -> None:
        fn = getattr(obj, name)

        def wrapped(*args, **kwargs):
            if self.cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            try:
                return fn(*args, **kwargs)
            finally:
                if self.cuda:
                    torch.cuda.synchronize()
                    self.peaks[phase] = max(self.peaks.get(phase, 0.0), float(torch.cuda.max_memory_allocated()))

        setattr(obj, name, wrapped)


def measure(cfg, rollouts: int, gpu=None) -> dict:
    """Run ``rollouts`` steps of ``cfg``; return the last step's predicted and measured figures."""
    from reinforge.loop import RLLoop
    from reinforge.plan import model as M
    from reinforge.plan.planner import resolve_config

    loop = RLLoop(cfg)
    meter = PeakMeter()
    lengths: list[int] = []
    take = loop.source.take

    def take_and_measure(rollout_id):
        r = take(rollout_id)
        lengths[:] = [s.response_length for g in r.groups for s in g]
        return r

    loop.source.take = take_and_measure
    meter.wrap(loop.source, "take", "generation")
    meter.wrap(loop.cluster, "score", "log-probs")
    meter.wrap(loop.cluster, "train", "training")
    meter.wrap(loop.cluster, "sync_weights", "weight sync")
    try:
        t0 = time.perf_counter()
        metrics = [loop.rollout_step(i)[0] for i in range(rollouts)]
        wall = time.perf_counter() - t0
        plan = loop.plan
        if gpu is not None:  # a CPU run: the prediction of the named GPU
            plan = resolve_config(loop.cfg, loop.base_path, gpu=gpu)[1]
        w = plan.workload
        if w is not None:
            w = dataclasses.replace(w, prompt_len=max(1, int(loop.train_data.max_prompt_tokens)))
        predicted_t = M.times(w, lengths) if w is not None else {}
        predicted_m = {b.phase: b.total for b in M.memory_plan(w)} if w is not None else {}
        if w is not None:
            predicted_m["weight sync"] = M.generation_breakdown(w).total - M.engine_workspace(w)
    finally:
        loop.close()
    last = metrics[-1]
    rows = []
    for phase, key in PHASES:
        rows.append(
            dict(
                phase=phase,
                predicted_s=predicted_t.get(phase),
                measured_s=last.get(key),
                predicted_mem=predicted_m.get(phase),
                measured_mem=meter.peaks.get(phase),
            )
        )
    return dict(
        rows=rows,
        gpu=plan.gpu.name if plan.gpu else "none",
        lengths=lengths,
        wall=wall,
        step=last.get("time/rollout_step"),
    )


def format_table(result: dict) -> str:
    lines = [
        f"GPU planned: {result['gpu']}; last step {_sec(result['step'])} s; {len(result['lengths'])} samples, "
        f"mean response {sum(result['lengths']) / max(len(result['lengths']), 1):.0f} tokens",
        "| phase | predicted s | measured s | measured / predicted | predicted peak GiB | measured peak GiB |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in result["rows"]:
        ratio = (
            f"{r['measured_s'] / r['predicted_s']:.2f}" if r["predicted_s"] and r["measured_s"] is not None else "n/a"
        )
        lines.append(
            f"| {r['phase']} | {_sec(r['predicted_s'])} | {_sec(r['measured_s'])} | {ratio} | "
            f"{_gib(r['predicted_mem'])} | {_gib(r['measured_mem'])} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    from reinforge.config import load_config
    from reinforge.plan import named

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", "-c")
    ap.add_argument("--rollouts", type=int, default=2, help="rollout steps (the last is reported)")
    ap.add_argument("--gpu", help="predict for this GPU (a CPU run: the script's check)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    cfg = load_config(
        args.config,
        args.overrides
        + ["run.progress=false", "run.save_final=false", "eval.eval_before_train=false", "data.n_eval_prompts=0"],
    )
    result = measure(cfg, args.rollouts, named(args.gpu) if args.gpu else None)
    print(format_table(result))


if __name__ == "__main__":
    main()
