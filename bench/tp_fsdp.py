"""Tensor parallelism x FSDP2 against FSDP2 alone on the same ranks (issue 26): loss, gradient norm and
weights after a few actor steps on bench/fsdp_two_gpus.py's synthetic GRPO-shaped data.

Layouts (``--world`` ranks, default 4): one process; FSDP2 over all ranks (the reference); then each
``--tp`` value t: ``world / t`` data x ``t`` tensor (FSDP2 over the data ranks; t = world: tensor
parallelism alone). Random weights of ``--arch`` (default Qwen3-dense-0.5B's shape: 8 query / 4 key-value
heads, so t = 2 and 4 divide them). Per layout: the last step's loss and gradient norm, and two
distances of the weights after the last step from the reference's, over every parameter tensor w:
the largest relative difference of ||w||, and the largest |<w - w_ref, g>| / ||w_ref|| (g a fixed
seeded Gaussian of w's shape: the weight difference along a random direction, relative to the
weight's size, which also catches permuted or misplaced shards) with the parameter it occurs in, and
the median s/step.

    PYTHONPATH=.:bench python bench/tp_fsdp.py --world 4 --tp 2 4 --steps 4                 # 4 GPUs, NCCL
    PYTHONPATH=.:bench python bench/tp_fsdp.py --world 4 --tp 2 4 --steps 2 --samples 8 --tiny --device cpu  # gloo
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from archs import ARCHS, tiny_overrides, write_random_model  # noqa: E402
from fsdp_two_gpus import make_data  # noqa: E402
from fsdp_two_gpus import worker as fsdp_worker  # noqa: E402

from tests.ranks import spawn_ranks  # noqa: E402


def fingerprint(name: str, w: torch.Tensor) -> tuple[float, float]:
    """(||w||, <w, g>) with g ~ N(0, 1) of w's shape, seeded by the parameter's name (fp64 sums)."""
    g = torch.Generator().manual_seed(sum(name.encode()) * 7919 + w.numel())
    w = w.detach().double().cpu().flatten()
    return float(w.norm()), float((w * torch.randn(w.numel(), generator=g, dtype=torch.float64)).sum())


def worker(rank, world, port, overrides, path, data, steps, device, queue):
    """bench/fsdp_two_gpus.py's rank, each weight summarised by :func:`fingerprint`."""
    fsdp_worker(rank, world, port, overrides, path, data, steps, device, queue, summarize=fingerprint)


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def projection_diff(prints: dict, ref: dict) -> tuple[float, str]:
    """The largest |<w - w_ref, g>| / ||w_ref|| over the parameters, and that parameter's name."""
    return max((abs(prints[k][1] - ref[k][1]) / max(ref[k][0], 1e-12), k) for k in ref)


def main(argv: list[str] | None = None) -> list[tuple]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="qwen3-dense-0.5b")
    ap.add_argument("--tiny", action="store_true", help="shrink the architecture (CPU dry run)")
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--tp", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16384)
    ap.add_argument("--device", default="cuda", help="cpu: gloo ranks")
    ap.add_argument(
        "--adam-eps",
        type=float,
        default=1e-8,
        help="train.adam_eps; 1e-3 keeps Adam's updates proportional to the gradient, so that the "
        "reduction-order noise of near-zero gradients (whose first Adam step is ~lr x sign) does "
        "not show as lr-sized weight differences",
    )
    args = ap.parse_args(argv)
    if args.device == "cuda" and torch.cuda.device_count() < args.world:
        raise SystemExit(f"needs {args.world} GPUs, found {torch.cuda.device_count()}")
    folder = Path(tempfile.mkdtemp()) / args.arch
    write_random_model(args.arch, folder, **(tiny_overrides(args.arch) if args.tiny else {}))
    data = make_data(args.samples, ARCHS[args.arch]["vocab_size"])
    base = [
        f"model.path={folder}",
        "train.lr=1e-5",
        f"train.adam_eps={args.adam_eps}",
        f"train.max_tokens_per_gpu={args.max_tokens}",
        "train.packing=sequences",
    ]
    layouts = [(1, 1), (args.world, 1)] + [(args.world, t) for t in args.tp]
    rows = []
    for world, tp in layouts:
        m, step_s, prints, _ = spawn_ranks(
            worker,
            world,
            (base + [f"train.tensor_model_parallel_size={tp}"], str(folder), data, args.steps, args.device),
            timeout=1800,
        )
        rows.append((world, tp, m["train/loss"], m["train/grad_norm"], step_s, prints))
        print(f"ranks {world} tp {tp}: loss {m['train/loss']:.6f} grad norm {m['train/grad_norm']:.4f}", flush=True)
    ref = rows[1][5]
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu (gloo)"
    print(
        f"\n{args.arch}{' (tiny)' if args.tiny else ''}, {args.samples} samples, {args.steps} actor steps, "
        f"adam_eps {args.adam_eps:g}, {where}; "
        f"reference: FSDP2 over {args.world} ranks"
    )
    print(
        "| ranks | layout | loss (last step) | grad norm | max rel. diff of a weight norm "
        "| max weight diff along a random direction / norm (where) | s/step |\n"
        "| ---: | --- | ---: | ---: | ---: | --- | ---: |"
    )
    for world, tp, loss, gn, step_s, prints in rows:
        dn = max(rel(prints[k][0], ref[k][0]) for k in ref)
        dp, where = projection_diff(prints, ref)
        layout = "one process" if world == 1 else (f"{world // tp} data x {tp} tensor" if tp > 1 else f"FSDP2 {world}")
        print(f"| {world} | {layout} | {loss:.6f} | {gn:.4f} | {dn:.2e} | {dp:.2e} ({where}) | {step_s:.3f} |")
    return rows


if __name__ == "__main__":
    main()
