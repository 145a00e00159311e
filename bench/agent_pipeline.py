"""The tool-use pipeline end to end (issue 35, docs/agents.md#the-tool-use-pipeline), as a user runs it:

1. ``reinforge eval`` of the base model on the held-out problems (greedy);
2. ``reinforge make-data tool-sft``: ``--sft-examples`` program-written tool-use traces;
3. ``reinforge offline`` (SFT on them, ``examples/offline/agent_sft.yaml``);
4. ``reinforge train`` (GRPO in the environment, ``examples/agent_products.yaml``) from the SFT
   model for ``--rollouts`` rollouts; its evaluation before training is the SFT model's, after it
   the RL model's.

Prints one table: held-out greedy accuracy, the share of responses with a well-formed tool call,
and the share that end with an answer, for the base model, after SFT and after RL, with each
step's wall time. Each step prints its start, its log's path (``<out>/<step>.log``), a progress line
(the log's last line) every 20 s and its end. Overrides after ``--`` go to every step (e.g. ``engine.max_num_seqs=32``);
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


STEPS = 4
REPORT_EVERY_S = 20.0  # a progress line at most this often while a step runs


def last_line(log: Path) -> str:
    """The last non-empty line of ``log`` (a progress bar's ``\\r`` updates count as lines)."""
    try:
        with log.open("rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            tail = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [x.strip() for x in tail.replace("\r", "\n").splitlines() if x.strip()]
    return lines[-1][:160] if lines else ""


def run(name: str, index: int, cmd: list[str], log: Path, every: float = REPORT_EVERY_S) -> float:
    """Run a CLI step, its output to ``log``; print its start, its log's path, a progress line (seconds so
    far and the log's last line, when it changed) at most every ``every`` seconds, and its end. Returns
    its wall seconds; exits naming the log on failure."""
    t = time.perf_counter()
    print(f"[{index}/{STEPS}] {name}: started (log: {log})", flush=True)
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        shown = ""
        while True:
            try:
                code = proc.wait(timeout=every)
                break
            except subprocess.TimeoutExpired:
                line = last_line(log)
                if line and line != shown:
                    print(f"[{index}/{STEPS}] {name}: {time.perf_counter() - t:.0f} s: {line}", flush=True)
                    shown = line
    if code:
        sys.exit(f"{' '.join(cmd[:4])} ... failed (exit {code}): see {log}")
    seconds = time.perf_counter() - t
    print(f"[{index}/{STEPS}] {name}: done in {seconds:.0f} s", flush=True)
    return seconds


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
    print(f"the tool-use pipeline in {STEPS} steps; each step's output goes to its log in {out}/", flush=True)
    seconds["base eval"] = run(
        "base model eval",
        1,
        [*cli, "eval", "-c", RL_CONFIG, "--output-dir", str(out / "base"), *evals, *common],
        out / "base.log",
    )
    seconds["make-data"] = run(
        "make-data tool-sft",
        2,
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
        "SFT (reinforge offline)",
        3,
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
        "RL (reinforge train, with its two evals)",
        4,
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
