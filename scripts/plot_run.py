#!/usr/bin/env python3
"""Plot a run's reward curve and held-out accuracy: scripts/plot_run.py RUN_DIR OUT.png [--title T].

Every run writes the same plot to RUN_DIR/curves.png when it ends (reinforge.eval.summary.plot_run);
this script redraws it with another title, window or metric."""

import argparse

from reinforge.eval.summary import plot_run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("out")
    ap.add_argument("--title", default="")
    ap.add_argument("--smooth", type=int, default=10, help="moving-average window over rollouts")
    ap.add_argument(
        "--reward-key",
        default="rollout/reward_mean",
        help="metric to plot (DAPO: rollout/generated_reward_mean, all generated samples)",
    )
    args = ap.parse_args()
    if plot_run(args.run_dir, args.out, curve_key=args.reward_key, smooth=args.smooth, title=args.title) is None:
        raise SystemExit("nothing plotted: matplotlib missing or no metrics logged")


if __name__ == "__main__":
    main()
