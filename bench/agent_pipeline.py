"""The tool-use pipeline end to end (issue 35, docs/agents.md#the-tool-use-pipeline), as a user runs it:

1. ``reinforge eval`` of the base model on the held-out problems (greedy);
2. ``reinforge make-data tool-sft``: ``--sft-examples`` program-written tool-use traces;
3. ``reinforge offline`` (SFT on them, ``examples/offline/agent_sft.yaml``);
4. ``reinforge train`` (GRPO in the environment, ``examples/agent_products.yaml``) from the SFT
   model for ``--rollouts`` rollouts; its evaluation before training is the SFT model's, after it
   the RL model's.

Prints one table: held-out greedy accuracy, the share of responses with a well-formed tool call,
and the share that end with an answer, for the base model, after SFT and after RL, with each
step's wall time. Overrides after ``--`` go to every step (e.g. ``engine.max_num_seqs=32``);
``--rl`` overrides go to the RL step only.

    python bench/agent_pipeline.py --out runs/agent_pipeline --sft-examples 2000 --rollouts 40 --eval-prompts 256
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

RL_CONFIG = "examples/agent_products.yaml"
SFT_CONFIG = "examples/offline/agent_sft.yaml"
COLUMNS = [
    ("greedy accuracy", "eval/greedy_accuracy"),
    ("well-formed call", "eval/agent/well_formed_call"),
    ("final answer", "eval/agent/final_answer"),
    ("turns", "eval/agent/turns"),
]


def run(cmd: list[str], log: Path) -> float:
    """Run a CLI step, its output to ``log``; returns its wall seconds. Raises on failure."""
    t = time.perf_counter()
    with log.open("w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode:
        sys.exit(f"{' '.join(cmd[:4])} ... failed (exit {r.returncode}): see {log}")
    return time.perf_counter() - t


def eval_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sft-examples", type=int, default=2000)
    ap.add_argument("--rollouts", type=int, default=40)
    ap.add_argument("--eval-prompts", type=int, default=256)
    ap.add_argument("--rl", nargs="*", default=[], help="overrides of the RL step only")
    ap.add_argument("overrides", nargs="*", help="overrides of every step (after --)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cli = [sys.executable, "-m", "reinforge"]
    common = list(args.overrides)
    evals = [f"data.n_eval_prompts={args.eval_prompts}", "eval.n_samples_per_eval_prompt=0", "eval.pass_k=[]"]
    seconds = {}
    seconds["base eval"] = run(
        [*cli, "eval", "-c", RL_CONFIG, "--output-dir", str(out / "base"), *evals, *common], out / "base.log"
    )
    seconds["make-data"] = run(
        [
            *cli,
            "make-data",
            "tool-sft",
            "-c",
            RL_CONFIG,
            "--out",
            str(out / "sft.jsonl"),
            "--num-prompts",
            str(args.sft_examples),
            *common,
        ],
        out / "make_data.log",
    )
    seconds["SFT"] = run(
        [
            *cli,
            "offline",
            "-c",
            SFT_CONFIG,
            f"offline.train_data={out / 'sft.jsonl'}",
            f"run.output_dir={out / 'sft'}",
            "run.overwrite=true",
            "run.progress=false",
            *common,
        ],
        out / "sft.log",
    )
    sft_model = out / "sft" / "checkpoints" / (out / "sft" / "checkpoints" / "latest").read_text().strip() / "model"
    seconds["RL (with its two evals)"] = run(
        [
            *cli,
            "train",
            "-c",
            RL_CONFIG,
            f"model.path={sft_model}",
            f"run.output_dir={out / 'rl'}",
            "run.overwrite=true",
            "run.progress=false",
            f"train.num_rollout={args.rollouts}",
            f"eval.eval_interval={max(args.rollouts, 1)}",
            *evals,
            *common,
            *args.rl,
        ],
        out / "rl.log",
    )
    base = eval_rows(out / "base" / "eval.jsonl")[-1]
    rl_evals = eval_rows(out / "rl" / "eval.jsonl")
    rows = [("base model", base), ("after SFT", rl_evals[0]), (f"after RL ({args.rollouts} rollouts)", rl_evals[-1])]
    print(f"\nheld-out problems: {args.eval_prompts} ({RL_CONFIG}, greedy); SFT examples: {args.sft_examples}\n")
    print("| model | " + " | ".join(c for c, _ in COLUMNS) + " |")
    print("| --- |" + " ---: |" * len(COLUMNS))
    for name, row in rows:
        print(f"| {name} | " + " | ".join(f"{row.get(k, float('nan')):.3f}" for _, k in COLUMNS) + " |")
    print("\n| step | seconds |\n| --- | ---: |")
    for k, v in seconds.items():
        print(f"| {k} | {v:.0f} |")
    print(f"| total | {sum(seconds.values()):.0f} |")
    (out / "table.json").write_text(json.dumps({"rows": {n: r for n, r in rows}, "seconds": seconds}, indent=1))


if __name__ == "__main__":
    main()
