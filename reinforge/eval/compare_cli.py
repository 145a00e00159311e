"""``reinforge compare``'s command line (the statistics are :mod:`reinforge.eval.compare`'s)."""

from __future__ import annotations

import argparse
from typing import Any

from ..config.fields import ConfigError
from .compare import comparison_table, load_arm


def add_compare_parser(sub: Any) -> None:
    """The ``compare`` subcommand on ``sub`` (argparse's subparsers)."""
    cmp = sub.add_parser(
        "compare",
        help="accuracies with 95%% intervals and paired differences with p-values of evaluations on the same problems",
        description="Compare evaluations of the same problems (eval/<label>.jsonl files or run directories; "
        "several runs of one arm, e.g. seeds, comma-separated): each accuracy with a 95%% interval, and each "
        "later evaluation's paired difference with the first, its 95%% interval, a paired-bootstrap p-value "
        "(runs resampled as a second level) and, for one run per arm, McNemar's exact p-value; 'not "
        "distinguishable' where the interval contains 0 (docs/distillation.md#reinforge-compare).",
    )
    cmp.add_argument("evaluations", nargs="+", metavar="EVAL", help="an eval .jsonl file, a run directory, or A,B,C")
    cmp.add_argument(
        "--sampled", action="store_true", help="score each problem by its sampled completions (pass@1), not greedy"
    )
    cmp.add_argument("--threshold", type=float, default=1.0, help="a completion is correct at reward >= this (1.0)")
    cmp.add_argument("--resamples", type=int, default=10000, help="bootstrap resamples (default 10000)")
    cmp.add_argument("--seed", type=int, default=0, help="the bootstrap's seed")
    cmp.set_defaults(func=compare_command)


def compare_command(args: argparse.Namespace) -> int:
    """``reinforge compare``: the table of :func:`~reinforge.eval.compare.comparison_table`.

    Raises:
        ConfigError: fewer than two evaluations, or one that cannot be read (named).
    """
    if len(args.evaluations) < 2:
        raise ConfigError("reinforge compare needs at least two evaluations (EVAL_A EVAL_B [...])")
    try:
        arms = [load_arm(e, args.threshold, args.sampled) for e in args.evaluations]
        print(
            comparison_table(arms, args.resamples, args.seed, "sampled pass@1" if args.sampled else "greedy accuracy")
        )
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(str(e)) from None
    return 0
