#!/usr/bin/env python3
"""Plot a run's reward curve and held-out accuracy: scripts/plot_run.py RUN_DIR OUT.png [--title T]."""

import argparse
import json
from pathlib import Path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("out")
    ap.add_argument("--title", default="")
    ap.add_argument("--smooth", type=int, default=10, help="moving-average window over rollouts")
    ap.add_argument("--reward-key", default="rollout/reward_mean",
                    help="metric to plot (DAPO: rollout/generated_reward_mean, all generated samples)")
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = Path(args.run_dir)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if args.reward_key in r]
    x = [r["rollout_id"] + 1 for r in train]
    y = [r[args.reward_key] for r in train]
    w = max(1, args.smooth)
    smooth = [sum(y[max(0, i - w + 1):i + 1]) / len(y[max(0, i - w + 1):i + 1]) for i in range(len(y))]
    evals = [r for r in rows if "eval/greedy_accuracy" in r]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    ax.plot(x, y, color="tab:blue", alpha=0.25, lw=0.8, label="rollout reward (mean)")
    ax.plot(x, smooth, color="tab:blue", lw=1.8, label=f"rollout reward ({w}-rollout average)")
    if evals:
        ax.plot([r["step"] for r in evals], [r["eval/greedy_accuracy"] for r in evals], "o-", color="tab:red",
                lw=1.8, label="held-out greedy accuracy")
        if "eval/pass@1" in evals[0]:
            ax.plot([r["step"] for r in evals], [r["eval/pass@1"] for r in evals], "s--", color="tab:orange",
                    lw=1.2, ms=4, label="held-out sampled pass@1")
    ax.set_xlabel("rollout")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    ax.set_title(args.title)
    fig.tight_layout()
    fig.savefig(args.out)


if __name__ == "__main__":
    main()
