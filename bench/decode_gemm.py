"""A dense decoder layer's decode-step kernels without attention: cuBLAS matmuls with separate norm and
SiLU kernels (the engine today) against :func:`reinforge.engine.prologue_linear.prologue_linear`, which
folds the add and norm into the q/k/v and gate/up matmuls and SiLU-and-multiply into the gate/up
matmul's epilogue (eight kernels a layer -> five).

For each model shape and row count: each fused op against its separate kernels (the Triton kernel at
each tile config tried; the output projection as a plain matmul against cuBLAS), then the layer's chain
of kernels captured ``--layers`` times in one CUDA graph (the way the engine replays a step),
microseconds per layer, and the largest difference of the two chains' outputs.
The bandwidth limit beside each row: the layer's weight bytes at the device's copy bandwidth.

    PYTHONPATH=.:bench python bench/decode_gemm.py                 # on a GPU
    PYTHONPATH=.:bench python bench/decode_gemm.py --archs smollm2 --rows 16 256
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from reinforge.engine.prologue_linear import TILE, prologue_linear
from reinforge.models import fused

SHAPES = {  # hidden, q heads, kv heads, head dim, intermediate
    "smollm2": (576, 9, 3, 64, 1536),
    "qwen2.5-1.5b": (1536, 12, 2, 128, 8960),
    "qwen3-8b": (4096, 32, 8, 128, 12288),
}
CONFIGS = [(bm, bn, warps) for bm in (16, 32) for bn in (16, 32, 64) for warps in (4, 8)]  # BM, BN, warps


def graph_time(fn, reps: int = 20, iters: int = 50) -> float:
    """Microseconds per call of ``fn``, captured ``reps`` times in one CUDA graph, median of ``iters``
    replays."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / reps)
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archs", nargs="+", default=["smollm2", "qwen2.5-1.5b"])
    ap.add_argument("--rows", nargs="+", type=int, default=[16, 64, 256])
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--bandwidth", type=float, default=None, help="bytes/s (default: measured copy)")
    args = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    bw = args.bandwidth
    if bw is None:
        a = torch.empty(1 << 28, dtype=torch.uint8, device=dev)
        b = torch.empty_like(a)
        us = graph_time(lambda: b.copy_(a), reps=5, iters=10)
        bw = 2 * a.numel() / (us * 1e-6)
        print(f"device copy bandwidth: {bw / 1e12:.2f} TB/s (read + write)")
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape, std=0.02):
        return (torch.randn(*shape, generator=g, device=dev) * std).to(dt)

    for arch in args.archs:
        Hd, H, KVH, D, inter = SHAPES[arch]
        Wqkv, Wo = rnd((H + 2 * KVH) * D, Hd), rnd(Hd, H * D)
        Wgu, Wd = rnd(2 * inter, Hd), rnd(Hd, inter)
        n1, n2 = (1 + rnd(Hd, std=0.1)), (1 + rnd(Hd, std=0.1))
        attn_in = rnd(max(args.rows), H * D, std=1.0)
        weight_bytes = 2 * (Wqkv.numel() + Wo.numel() + Wgu.numel() + Wd.numel())
        print(
            f"\n## {arch}: hidden {Hd}, q/k/v {Wqkv.shape[0]}, intermediate {inter}; "
            f"weights {weight_bytes / 1e6:.1f} MB a layer"
        )
        print("\n| rows | op (N x K) | separate kernels us | fused Triton us (default tile) | best us | best tile |")
        print("| ---: | --- | ---: | ---: | ---: | --- |")
        for M in args.rows:
            x, res0 = rnd(M, Hd, std=1.0), rnd(M, Hd, std=1.0)
            scratch = res0.clone()
            ops = {  # name: (the separate kernels, the fused one at a tile config)
                f"add + norm + qkv ({Wqkv.shape[0]} x {Hd})": (
                    lambda x=x: F.linear(fused.add_rms_norm(x, scratch, n1, 1e-6), Wqkv),
                    lambda cfg, x=x: prologue_linear(
                        x, Wqkv, prologue="add_rms_norm", norm_weight=n1, residual=res0, config=cfg
                    ),
                ),
                f"add + norm + gate_up + SiLU-mul ({inter} x {Hd})": (
                    lambda x=x: fused.silu_mul_packed(F.linear(fused.add_rms_norm(x, scratch, n2, 1e-6), Wgu)),
                    lambda cfg, x=x: prologue_linear(
                        x, Wgu, prologue="add_rms_norm", norm_weight=n2, residual=res0, gated=True, config=cfg
                    ),
                ),
                f"o, plain ({Hd} x {H * D})": (
                    lambda M=M: F.linear(attn_in[:M], Wo),
                    lambda cfg, M=M: prologue_linear(attn_in[:M], Wo, config=cfg),
                ),
            }
            for name, (sep, fn) in ops.items():
                t_sep = graph_time(sep)
                tri = {}
                for cfg in CONFIGS:
                    try:
                        tri[cfg] = graph_time(lambda fn=fn, cfg=cfg: fn(cfg))
                    except Exception as e:  # a config the compiler rejects (shared memory)
                        print(f"<!-- {name} {cfg}: {type(e).__name__} -->")
                best = min(tri, key=tri.get)
                print(f"| {M} | {name} | {t_sep:.2f} | {tri.get(TILE, float('nan')):.2f} | {tri[best]:.2f} | {best} |")
        print(
            f"\n| rows | eager chain us / layer | fused chain us / layer | ratio | "
            f"weights at {bw / 2e12:.2f} TB/s read | max diff / max value |"
        )
        print("| ---: | ---: | ---: | ---: | ---: | ---: |")
        for M in args.rows:
            x0, res0 = rnd(M, Hd, std=1.0), rnd(M, Hd, std=1.0)
            attn = rnd(M, H * D, std=1.0)  # stands in for attention's output
            scratch = res0.clone()

            def eager(x0=x0, res=scratch, attn=attn):  # (updates res in place, as the engine)
                h = fused.add_rms_norm(x0, res, n1, 1e-6)
                F.linear(h, Wqkv)
                o = F.linear(attn, Wo)  # (attention's place: not timed)
                h = fused.add_rms_norm(o, res, n2, 1e-6)
                gu = F.linear(h, Wgu)
                return F.linear(fused.silu_mul_packed(gu), Wd), res

            def fused_chain(x0=x0, res0=res0, attn=attn):
                qkv, res = prologue_linear(x0, Wqkv, prologue="add_rms_norm", norm_weight=n1, eps=1e-6, residual=res0)
                o = F.linear(attn, Wo)
                h, res = prologue_linear(
                    o, Wgu, prologue="add_rms_norm", norm_weight=n2, eps=1e-6, residual=res, gated=True
                )
                return F.linear(h, Wd), res

            te = graph_time(eager, reps=args.layers)
            tf = graph_time(fused_chain, reps=args.layers)
            (ye, re_), (yf, rf) = eager(res=res0.clone()), fused_chain()
            diff = max(
                ((ye.float() - yf.float()).abs().max() / ye.float().abs().max()).item(),
                ((re_.float() - rf.float()).abs().max() / re_.float().abs().max()).item(),
            )
            limit = weight_bytes / (bw / 2) * 1e6
            print(f"| {M} | {te:.2f} | {tf:.2f} | {te / tf:.2f}x | {limit:.2f} | {diff:.3g} |")


if __name__ == "__main__":
    main()
