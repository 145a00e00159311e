"""FSDP2 over 2 GPUs (NCCL) against one GPU, with the fused training kernels on and off: loss,
gradient norm and weights after a few actor steps on the same synthetic GRPO-shaped data, and the
median step time. Random weights of a real architecture (no download).

    python bench/fsdp_two_gpus.py [--arch smollm2] [--samples 256] [--steps 4]

Prints one row per (ranks, fused kernels): the last step's loss and gradient norm, the largest
relative difference of any parameter's L2 norm from the one-GPU eager run, and s/step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from archs import write_random_model  # noqa: E402
from scored import random_groups  # noqa: E402

from tests.ranks import spawn_ranks  # noqa: E402


def make_data(n: int, vocab: int, seed: int = 0):
    """``n`` scored samples in groups of 2: 64-128-token prompts, 32-256-token responses, random rewards."""
    g = torch.Generator().manual_seed(seed)
    shapes = [
        (int(torch.randint(64, 129, (1,), generator=g)), int(torch.randint(32, 257, (1,), generator=g)))
        for _ in range(n)
    ]
    return random_groups(shapes, vocab, seed)


def weight_norm(name: str, t: torch.Tensor) -> float:
    return float(t.float().norm())


def worker(rank, world, port, overrides, path, data, steps, device, queue, summarize=weight_norm):
    """One trainer rank: ``steps`` training steps of ``data`` (scored groups; each step's score and train
    timed together); rank 0 puts (last metrics, median step seconds, {name: summarize(name, full weight)},
    every rank's peak GPU memory in GiB (nan on a CPU)) on ``queue``."""
    from reinforge.config import load_config
    from reinforge.train.rollout_share import RolloutBatch
    from reinforge.train.worker import TrainWorker

    cuda = device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    cfg = load_config(None, overrides + [f"train.device={f'cuda:{rank}' if cuda else 'cpu'}"])
    w = TrainWorker(cfg, path, rank=rank, world_size=world, master_port=port)
    metrics, times = [], []
    for r in range(steps):
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        w.score(RolloutBatch(data, r))
        metrics.append(w.train(r))
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    peaks = w.parallel.gather_objects(torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"))
    summary = {n: summarize(n, t) for n, t in w.named_weights()}  # full tensors: every rank iterates (FSDP)
    if rank == 0:
        queue.put((metrics[-1], statistics.median(times[1:] or times), summary, peaks))
    w.parallel.barrier()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="smollm2")
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16384)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run over gloo ranks (the kernels are CUDA-only)")
    args = ap.parse_args()
    if args.device == "cuda" and torch.cuda.device_count() < 2:
        raise SystemExit("needs 2 GPUs")
    folder = Path(tempfile.mkdtemp()) / args.arch
    write_random_model(args.arch, folder)
    from archs import ARCHS

    data = make_data(args.samples, ARCHS[args.arch]["vocab_size"])
    rows = []
    for world in (1, 2):
        for fused in ("false", "true"):
            overrides = [
                f"model.path={folder}",
                "train.lr=1e-5",
                f"train.max_tokens_per_gpu={args.max_tokens}",
                f"model.fused_kernels={fused}",
                "train.packing=sequences",
            ]
            m, step_s, norms, _ = spawn_ranks(
                worker, world, (overrides, str(folder), data, args.steps, args.device), timeout=900
            )
            rows.append((world, fused, m["train/loss"], m["train/grad_norm"], step_s, norms))
    ref = rows[0][5]
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    print(f"\n{args.arch}, {args.samples} samples, {args.steps} actor steps, {where}")
    print(
        "| ranks | fused kernels | loss (last step) | grad norm | max rel. diff of a weight norm vs 1 rank eager "
        "| s/step |"
    )
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for world, fused, loss, gn, step_s, norms in rows:
        diff = max(abs(norms[k] - ref[k]) / max(ref[k], 1e-12) for k in ref)
        print(f"| {world} | {fused} | {loss:.6f} | {gn:.4f} | {diff:.2e} | {step_s:.3f} |")


if __name__ == "__main__":
    main()
