"""Token log-probs from logits, forward + backward, on one GPU (issue 37 item 3): reinforge's fused
Triton kernels (``reinforge/algo/fused_logprobs.py``) against its chunked PyTorch path and
Liger-Kernel's cross-entropy (``LigerCrossEntropyFunction``, reduction "none": the negative
log-prob; it writes the gradient into the logits during the forward pass, and has no temperature
and no entropy).

bf16 logits [N, V] (default V = 151,936, Qwen's vocabulary) and random targets; the loss is
``sum(lp * g)`` for a random g, so the backward pass is the one a policy-gradient loss drives.
The limit beside each row: the bytes the fused kernels must move (the logits read twice and the
gradient written once, in bf16) at the GPU's memory bandwidth (``reinforge/plan/hardware.py``'s table).

    PYTHONPATH=. python bench/logprobs.py [--tokens 8192 16384] [--vocab 151936] [--entropy]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from reinforge.algo.logprobs import token_log_probs
from reinforge.plan.hardware import detect


def run(variant: str, x: torch.Tensor, targets: torch.Tensor, g: torch.Tensor, entropy: bool) -> None:
    """One forward + backward of ``variant`` on logits ``x`` (Liger's overwrites them: a fresh copy each call)."""
    if variant == "liger":
        from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction

        loss = LigerCrossEntropyFunction.apply(x, targets, None, -100, 0.0, 0.0, "none")
        lp = -(loss[0] if isinstance(loss, tuple) else loss)
        (lp * g).sum().backward()
        return
    lp, ent = token_log_probs(x, targets, 1.0, 2048, with_entropy=entropy, fused=variant == "fused")
    out = (lp * g).sum() + (ent.sum() if entropy else 0)
    torch.autograd.grad(out, x)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--entropy", action="store_true", help="also the entropy (not Liger's)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name()
    gpu = detect(dev)
    bw = gpu.bandwidth if gpu is not None and gpu.bandwidth else float("nan")  # (the planner's GPU table)
    print(f"log-probs forward + backward, bf16 logits, V={args.vocab}, entropy={args.entropy}, {name}")
    print("| tokens | variant | ms | vs chunked | limit ms (3 passes at bandwidth) | % of limit | max abs lp diff |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for n in args.tokens:
        gen = torch.Generator(device=dev).manual_seed(0)
        logits = (torch.randn(n, args.vocab, device=dev, generator=gen) * 2).to(torch.bfloat16).requires_grad_()
        targets = torch.randint(0, args.vocab, (n,), device=dev, generator=gen)
        g = torch.randn(n, device=dev, generator=gen)
        ref = token_log_probs(logits.detach(), targets, fused=False)[0]
        limit = 3 * logits.numel() * 2 / bw * 1e3
        times = {}
        for v in ("chunked", "fused") + (() if args.entropy else ("liger",)):
            ts = []
            for i in range(args.steps + 2):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                x = logits.detach().clone().requires_grad_() if v == "liger" else logits  # (outside the timing)
                a.record()
                run(v, x, targets, g, args.entropy)
                b.record()
                torch.cuda.synchronize()
                if i >= 2:
                    ts.append(a.elapsed_time(b))
            times[v] = statistics.median(ts)
            if v == "liger":
                from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction

                out = LigerCrossEntropyFunction.apply(logits.detach().clone(), targets, None, -100, 0.0, 0.0, "none")
                lp = -(out[0] if isinstance(out, tuple) else out)
            else:
                lp = token_log_probs(logits.detach(), targets, fused=v == "fused")[0]
            diff = float((lp.float() - ref).abs().max())
            print(
                f"| {n} | {v} | {times[v]:.2f} | {times['chunked'] / times[v]:.2f}x | {limit:.2f} | "
                f"{100 * limit / times[v]:.0f} | {diff:.2e} |",
                flush=True,
            )
        del logits


if __name__ == "__main__":
    main()
