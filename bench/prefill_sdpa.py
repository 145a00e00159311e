"""The engine's prefill attention (causal SDPA over a right-padded prompt batch) on one GPU, by backend:
the host time of the first call at a batch shape never seen before (a rollout's prompt batch has a new
width whenever its longest prompt differs), and the median time of a repeated call. SmolLM2's shape (9
heads, 3 key-value heads, head dim 64), bf16, ``--prompts`` prompts.

    python bench/prefill_sdpa.py [--prompts 32] [--widths 97 101 113 127 133]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "default": None,
    "flash": [SDPBackend.FLASH_ATTENTION],
    "efficient": [SDPBackend.EFFICIENT_ATTENTION],
    "cudnn": [SDPBackend.CUDNN_ATTENTION],
    "math": [SDPBackend.MATH],
}


def call(q, k, v, backends):
    if backends is None:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    with sdpa_kernel(backends):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--widths", type=int, nargs="+", default=[97, 101, 113, 127, 133])
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    args = ap.parse_args()
    dev = torch.device("cuda")
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {args.prompts} prompts, "
        f"{args.heads}/{args.kv_heads} heads of {args.head_dim}, bf16, causal"
    )
    print("| backend | first call at a new width, ms (median over widths) | repeated call, ms | max abs diff vs math |")
    print("| --- | ---: | ---: | ---: |")
    for j, (name, backends) in enumerate(BACKENDS.items()):
        firsts, steady, diff = [], [], 0.0
        for T0 in args.widths:
            T = T0 + 2 * j  # a width no backend has run yet (a per-shape plan is built at its first call)
            g = torch.Generator(device=dev).manual_seed(T)
            shape = (args.prompts, args.heads, T, args.head_dim)
            q = torch.randn(shape, device=dev, dtype=torch.bfloat16, generator=g)
            k, v = (
                torch.randn(shape[0], args.kv_heads, *shape[2:], device=dev, dtype=torch.bfloat16, generator=g)
                for _ in range(2)
            )
            torch.cuda.synchronize()
            t = time.perf_counter()
            try:
                o = call(q, k, v, backends)
            except RuntimeError as e:
                print(f"| {name} | not available: {str(e).splitlines()[0][:80]} | | |")
                break
            torch.cuda.synchronize()
            firsts.append((time.perf_counter() - t) * 1e3)
            diff = max(diff, (o.float() - call(q, k, v, BACKENDS["math"]).float()).abs().max().item())
            for _ in range(10):
                torch.cuda.synchronize()
                t = time.perf_counter()
                call(q, k, v, backends)
                torch.cuda.synchronize()
                steady.append((time.perf_counter() - t) * 1e3)
        else:
            print(
                f"| {name} | {statistics.median(firsts):.2f} (max {max(firsts):.2f}) | "
                f"{statistics.median(steady):.3f} | {diff:.3g} |"
            )


if __name__ == "__main__":
    main()
