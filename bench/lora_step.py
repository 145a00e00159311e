"""Memory and speed of a GRPO training step with and without LoRA (random weights of a real architecture).

One trainer process (``TrainWorker``, the same code the RL loop runs) takes the same synthetic
rollout (``--samples`` samples of ``--prompt-len`` + ``--response-len`` tokens, random advantages)
with a KL loss to the reference model, so the reference pass runs too (with LoRA: the base with the
adapters disabled, no second copy of the weights). Prints a table: peak GPU memory of the step,
seconds per step (median of the steps after the first), trainable parameters.

    python bench/lora_step.py                                  # on a GPU: Qwen2.5-1.5B architecture
    python bench/lora_step.py --arch smollm2 --samples 8 --device cpu --steps 2   # a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from archs import ARCHS, write_random_model
from scored import random_groups


def make_rollout(n: int, prompt_len: int, response_len: int, vocab: int):
    """``n`` scored samples in groups of 2, random tokens and rewards (the trainer computes the advantages)."""
    return random_groups([(prompt_len, response_len)] * n, vocab)


def run(folder: Path, lora_rank: int, args) -> dict[str, float]:
    from reinforge.config import load_config
    from reinforge.train.worker import TrainWorker

    overrides = [
        f"model.path={folder}",
        f"train.device={args.device}",
        f"train.max_tokens_per_gpu={args.max_tokens}",
        "algo.use_kl_loss=true",
        "algo.kl_loss_coef=0.01",
        "train.lr=1e-6",
        f"model.gradient_checkpointing={str(args.gradient_checkpointing).lower()}",
    ]
    if lora_rank:
        overrides += [f"model.lora_rank={lora_rank}", f"model.lora_alpha={2 * lora_rank}"]
    cfg = load_config(None, overrides)
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    worker = TrainWorker(cfg, folder)
    trainable = sum(p.numel() for p in worker.actor.model.parameters() if p.requires_grad)
    from reinforge.train.rollout_share import RolloutBatch

    groups = make_rollout(args.samples, args.prompt_len, args.response_len, ARCHS[args.arch]["vocab_size"])
    times = []
    for step in range(args.steps):
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        worker.score(RolloutBatch(groups, step))  # the reference's log-probs (KL loss), the advantages
        worker.train(step)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
    del worker
    tokens = args.samples * (args.prompt_len + args.response_len)
    step_s = statistics.median(times[1:]) if len(times) > 1 else times[0]
    return {"peak_gib": peak, "step_s": step_s, "tokens_per_s": tokens / step_s, "trainable_m": trainable / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="qwen2.5-1.5b", choices=sorted(ARCHS))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--response-len", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=16384, help="train.max_tokens_per_gpu")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--ranks", type=int, nargs="+", default=[0, 16, 64], help="LoRA ranks; 0 = full fine-tuning")
    ap.add_argument("--gradient-checkpointing", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / args.arch
        write_random_model(args.arch, folder)
        rows = []
        for r in args.ranks:
            try:
                rows.append((r, run(folder, r, args)))
            except torch.OutOfMemoryError:
                rows.append((r, None))
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    dev = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    print(
        f"\n{args.arch}, {dev}, {args.samples} samples x ({args.prompt_len} + {args.response_len}) tokens, "
        f"max_tokens_per_gpu {args.max_tokens}, KL to the reference, gradient checkpointing "
        f"{args.gradient_checkpointing}"
    )
    print(
        f"| {'mode':12s} | {'trainable (M)':>13s} | {'peak memory (GiB)':>17s} | {'s / step':>8s} | {'tokens/s':>9s} |"
    )
    print(f"| {'-' * 12} | {'-' * 13}: | {'-' * 17}: | {'-' * 8}: | {'-' * 9}: |")
    for r, m in rows:
        mode = f"LoRA r={r}" if r else "full"
        if m is None:
            print(f"| {mode:12s} | {'':>13s} | {'out of memory':>17s} | {'-':>8s} | {'-':>9s} |")
            continue
        print(
            f"| {mode:12s} | {m['trainable_m']:13.1f} | {m['peak_gib']:17.2f} | {m['step_s']:8.2f} | "
            f"{m['tokens_per_s']:9.0f} |"
        )


if __name__ == "__main__":
    main()
