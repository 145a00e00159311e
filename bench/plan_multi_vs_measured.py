"""The planner's layouts against every multi-GPU run recorded (issue 56, item 3): no GPU needed.

Each run of :data:`RUNS` is re-planned from its recorded settings (the model's shape from bench/archs.py, its
keys, its layout as one of :func:`reinforge.plan.layout.candidates`' on its GPUs and nodes, its mean response
length) with :func:`reinforge.plan.layout._plan_one`, and its measured phases (docs/benchmarks.md, docs/results)
printed beside the prediction: generation, log-probs + training ("trainer"), weight sync and the step, with
predicted / measured. The bench/plan_vs_measured.py of one GPU runs a config and measures it; this one reads the
runs already made on several.

    PYTHONPATH=. python bench/plan_multi_vs_measured.py            # the table
    PYTHONPATH=. python bench/plan_multi_vs_measured.py --markdown # as docs/benchmarks.md holds it
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from archs import ARCHS  # noqa: E402
from plan_vs_measured import _sec  # noqa: E402

from reinforge.config import load_config  # noqa: E402
from reinforge.plan import GPUS  # noqa: E402
from reinforge.plan import model as M  # noqa: E402
from reinforge.plan.layout import LayoutPlan, _plan_one, candidates  # noqa: E402

PHASES = ("generation", "trainer", "weight sync", "step")
RELATIVE = "trainer, FSDP's measured + the layout's predicted difference"
PEAK = "peak GiB (fullest rank)"


def model(folder: Path, arch: str, own_vocab: bool = False) -> Path:
    """bench/archs.py's ``arch`` as a config-only Hugging Face folder under ``folder``: with SmolLM2's tied
    49,152-token vocabulary, as bench/grpo_long.py and bench/grpo_ray.py write it, or (``own_vocab``) its own, as
    bench/pipeline.py does."""
    path = folder / (arch + ("-own" if own_vocab else ""))
    path.mkdir(parents=True, exist_ok=True)
    cfg = dict(ARCHS[arch]) if own_vocab else {**ARCHS[arch], "vocab_size": 49152, "tie_word_embeddings": True}
    cfg["architectures"] = ["Qwen2ForCausalLM"]
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def grpo(path: Path, seqs: int, length: int, *extra: str, n: int = 8):
    """bench/grpo_ray.py / bench/async_long.py's workload: ``n`` samples per prompt, packed, checkpointed."""
    return load_config(
        None,
        [
            f"model.path={path}",
            "model.gradient_checkpointing=true",
            f"rollout.rollout_batch_size={seqs // n}",
            f"rollout.n_samples_per_prompt={n}",
            f"rollout.rollout_max_response_len={length}",
            "train.packing=sequences",
            f"train.max_tokens_per_gpu={max(16384, length + 256)}",
            *extra,
        ],
    )


@dataclass
class Run:
    """One recorded multi-GPU run: its settings and measured seconds (``measured``: :data:`PHASES` keys)."""

    name: str
    source: str
    arch: str
    gpus: int
    nodes: int
    layout: str  # a name of :func:`candidates`
    seqs: int
    length: int  # rollout.rollout_max_response_len
    mean: int  # the measured mean response length
    measured: dict[str, float]
    keys: list[str] = field(default_factory=list)
    prompt: int = 64
    own_vocab: bool = False
    trainer_only: bool = False  # bench/pipeline.py: log-probs + training of a fixed batch, no engine
    n: int = 8
    note: str = ""
    staleness: int | None = None  # an asynchronous run's rollout.max_staleness (None: the planner's choice)
    baseline: str | None = None  # a run of the same call whose measured rest the relative row keeps


KV85, KV30 = "engine.kv_cache_memory_fraction=0.85", "engine.kv_cache_memory_fraction=0.3"
# examples/arith_grpo.yaml: SmolLM2-135M, 32 prompts x 16 samples, ~15-token answers, 2 optimizer steps a rollout
ARITH = ["model.gradient_checkpointing=false", "train.num_steps_per_rollout=2", "engine.max_num_seqs=1024"]
# bench/pipeline.py: 256 samples of 64-128 prompt and 32-256 response tokens (62,695 tokens), no checkpointing
PIPE = dict(arch="qwen3-dense-0.5b", gpus=4, nodes=1, layout="colocated", seqs=256, length=256, mean=149, prompt=96)
PIPE_KEYS = ["model.gradient_checkpointing=false"]
PIPE_PEAKS = {"fsdp": 36.64, "pp2-tp2": 26.16, "tp2": 29.72, "tp2-sp": 27.42}  # call 2's torch peaks, GiB
PIPELINE_ROWS = ("fsdp (1)", "pp2 (1)", "pp2-vpp2 (1)", "pp4 (1)", "fsdp (2)", "pp2-tp2 (2)", "tp2 (2)", "tp2-sp (2)")

RUNS = [
    Run(
        "1a sync 8k",
        "benchmarks.md 2026-11-28 run 1a",
        "qwen2.5-1.5b",
        2,
        1,
        "disaggregated 1+1",
        64,
        8192,
        7500,
        {"generation": 30.1, "trainer": 15.6, "step": 45.9},
        [KV85],
    ),
    Run(
        "1a async 8k",
        "benchmarks.md 2026-11-28 run 1a",
        "qwen2.5-1.5b",
        2,
        1,
        "disaggregated 1+1 async",
        64,
        8192,
        7500,
        {"step": 33.2},
        [KV85, "rollout.max_staleness=2", "rollout.partial_rollout=true"],
        note="max_staleness 2, partial rollouts",
        staleness=2,
    ),
    Run(
        "2 co4k 7B",
        "benchmarks.md 2026-11-28 run 2",
        "qwen2.5-7b",
        4,
        2,
        "colocated",
        128,
        4096,
        3883,
        {"generation": 23.25, "trainer": 13.40, "weight sync": 0.686, "step": 37.46},
        [KV30],
    ),
    Run(
        "5 di SmolLM2 2 nodes",
        "benchmarks.md 2026-11-28 run 5",
        "smollm2",
        4,
        2,
        "disaggregated 2+2",
        256,
        1024,
        1017,
        {"generation": 1.75, "trainer": 4.26, "weight sync": 0.153, "step": 6.20},
        [KV85, "engine.max_num_seqs=128"],
    ),
    *(
        Run(
            f"placement {row}",
            "benchmarks.md 2026-11-22 (examples/arith_grpo.yaml)",
            "smollm2",
            2,
            1,
            layout,
            512,
            64,
            15,
            dict(zip(PHASES, seconds, strict=True)),
            ARITH,
            prompt=70,
            n=16,
        )
        for row, layout, seconds in (
            ("colocated", "colocated", (0.52, 1.37, 0.159, 2.05)),
            ("disaggregated", "disaggregated 1+1", (0.48, 1.18, 0.021, 1.71)),
        )
    ),
    Run(
        "fsdp2 two GPUs",
        "benchmarks.md 2026-11-23 (bench/fsdp_two_gpus.py, fused kernels off)",
        "smollm2",
        2,
        1,
        "colocated",
        256,
        256,
        149,
        {"trainer": 0.507},
        PIPE_KEYS,
        prompt=96,
        trainer_only=True,
    ),
    *(
        Run(
            f"3 {row} 15B MoE",
            "benchmarks.md 2026-11-28 run 3",
            "qwen3-moe-15b-a1.8b",
            4,
            1,
            "colocated",
            128,
            2048,
            1815,
            dict(zip(PHASES, seconds, strict=True)),
            [KV30, "cluster.offload_engine_weights=true", *keys],
            note=note,
        )
        for row, seconds, keys, note in (
            ("fsdp", (14.47, 3.92, 0.470, 19.09), [], ""),
            ("ep", (14.45, 4.47, 0.496, 19.66), ["train.expert_model_parallel_size=2"], ""),
            ("ep-rr", (14.62, 4.60, 0.517, 19.97), ["train.expert_model_parallel_size=2"], "routing replay"),
        )
    ),
    *(
        Run(
            f"pipeline {row} ({call})",
            f"results/pipeline/h200x4.txt call {call}",
            **PIPE,  # type: ignore[arg-type]
            measured={"trainer": seconds, **({PEAK: PIPE_PEAKS[row]} if call == 2 else {})},
            keys=[*PIPE_KEYS, *keys],
            own_vocab=True,
            trainer_only=True,
            note=note,
            baseline=None if row == "fsdp" else f"pipeline fsdp ({call})",
        )
        for row, call, seconds, keys, note in (
            ("fsdp", 1, 1.085, [], ""),
            ("pp2", 1, 1.176, ["train.pipeline_model_parallel_size=2"], ""),
            (
                "pp2-vpp2",
                1,
                1.123,
                ["train.pipeline_model_parallel_size=2", "train.virtual_pipeline_model_parallel_size=2"],
                "",
            ),
            ("pp4", 1, 1.370, ["train.pipeline_model_parallel_size=4"], ""),
            ("fsdp", 2, 0.796, [], ""),
            ("pp2-tp2", 2, 1.488, ["train.pipeline_model_parallel_size=2", "train.tensor_model_parallel_size=2"], ""),
            ("tp2", 2, 1.472, ["train.tensor_model_parallel_size=2"], ""),
            (
                "tp2-sp",
                2,
                1.722,
                ["train.tensor_model_parallel_size=2", "train.sequence_parallel=true"],
                "sequence parallel",
            ),
        )
    ),
]


def predict(run: Run, folder: Path) -> tuple[LayoutPlan, dict[str, float]]:
    """The plan of ``run``'s layout and its predicted seconds by :data:`PHASES` (trainer-only runs: the trainer)."""
    path = model(folder, run.arch, run.own_vocab)
    cfg = grpo(path, run.seqs, run.length, *run.keys, n=run.n)
    keys = dict(candidates(run.gpus, run.nodes))[run.layout]
    train = {k: _value(v) for k, v in (x.split("=", 1) for x in run.keys) if k.startswith("train.")}
    lengths = [run.mean] * run.seqs
    p = _plan_one(cfg, path, GPUS["h200"], run.prompt, run.layout, keys, lengths, only=train, staleness=run.staleness)
    if p.problem is not None:
        raise SystemExit(f"{run.name}: the planner says it does not fit: {p.problem}")
    t = p.times
    out = {"trainer": t["log-probs"] + t["training"]}
    if run.trainer_only and p.workload is not None:  # the training step's peak without an engine beside it
        out[PEAK] = M.train_breakdown(M.with_(p.workload, colocated=False)).total / M.GIB
    if not run.trainer_only:
        out.update({"generation": t["generation"], "weight sync": t["weight sync"], "step": p.step})
    return p, out


def _value(v: str) -> int | bool:
    return v == "true" if v in ("true", "false") else int(v)


def rows(folder: Path) -> list[tuple[Run, str, str, float, float]]:
    """(run, its layout in words, phase, predicted, measured) for every measured phase of :data:`RUNS`."""
    out = []
    predicted: dict[str, float] = {}
    for run in RUNS:
        plan, pred = predict(run, folder)
        predicted[run.name] = pred["trainer"]
        words = run.layout + "".join(
            f" {k.removeprefix('train.').replace('_model_parallel_size', '')}={v}"
            for k, v in plan.keys.items()
            if k.startswith("train.") and "parallel" in k and v not in (1, False)
        )
        for phase in (*PHASES, PEAK):
            if phase in run.measured:
                out.append((run, words, phase, pred[phase], run.measured[phase]))
        if run.baseline is not None:  # the same call's FSDP run, measured, plus what the layout adds, predicted
            base = next(r for r in RUNS if r.name == run.baseline)
            rel = base.measured["trainer"] + pred["trainer"] - predicted[run.baseline]
            out.append((run, words, RELATIVE, rel, run.measured["trainer"]))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--markdown", action="store_true", help="a Markdown table")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        table = rows(Path(tmp))
    if args.markdown:
        print("| run | layout (H200s) | phase | predicted | measured | predicted / measured |")
        print("| --- | --- | --- | ---: | ---: | ---: |")
    else:
        print(f"{'run':<22} {'layout (H200s)':<34} {'phase':<12} {'pred':>8} {'meas':>8} {'ratio':>6}")
    for run, words, phase, pred, meas in table:
        r = pred / meas
        flag = "" if 0.75 <= r <= 1.25 else " *"
        if args.markdown:
            print(f"| {run.name} | {words} | {phase} | {_sec(pred)} | {_sec(meas)} | {r:.2f}{flag} |")
        else:
            print(f"{run.name:<22} {words:<34} {phase:<12} {_sec(pred):>8} {_sec(meas):>8} {r:>6.2f}{flag}")
    print('(* outside 25%; docs/benchmarks.md, "The planner on several GPUs", says why)')


if __name__ == "__main__":
    main()
