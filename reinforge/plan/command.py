"""``reinforge plan``: one GPU's plan (``--gpu``) or every layout over several (``--gpus``, ``--nodes``)
printed; the exit status says whether the training step fits (docs/planner.md)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import Config


def plan_command(cfg: Config, args: argparse.Namespace) -> int:
    """Print the plan of a config: each phase's peak memory and predicted time, and the value chosen
    for each ``auto`` key with its reason; exit 1 when the training step cannot fit (the refusal
    ``reinforge train`` would give)."""
    from ..models.hub import resolve_model_path
    from . import format_plan, named, resolve_config, training_problems

    gpu = named(args.gpu) if args.gpu else "detect"
    if getattr(args, "gpus", None):
        return _plan_layouts(cfg, args, gpu)
    _, plan = resolve_config(cfg, resolve_model_path(cfg.model.path), gpu=gpu, prompt_len=args.prompt_len)
    print(format_plan(plan))
    problems = training_problems(plan)
    for p in problems:
        print(f"refused: {p}")
    return 1 if problems else 0


def _plan_layouts(cfg, args: argparse.Namespace, gpu) -> int:
    """``reinforge plan --gpus N [--nodes K]``: every layout planned, best first; exit 1 when none fits."""
    from ..models.hub import resolve_model_path
    from ..utils.device import resolve_device
    from .hardware import detect
    from .layout import format_layouts, plan_layouts

    if gpu == "detect":
        gpu = detect(resolve_device(cfg.train.device)) if cfg.train.device != "cpu" else None
    if gpu is None or not gpu.knows_speed:
        print("--gpus plans layouts by their predicted time: name a GPU of the planner's table with --gpu (h100, h200)")
        return 2
    plans = plan_layouts(cfg, resolve_model_path(cfg.model.path), gpu, args.gpus, args.nodes, args.prompt_len)
    print(format_layouts(plans, gpu, args.gpus, args.nodes))
    return 1 if plans[0].problem else 0
