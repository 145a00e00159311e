"""RMSNorm forward + backward in training: reinforge's ``fused.rms_norm`` (what the trainer uses with
``model.fused_kernels``), Liger-Kernel's ``LigerRMSNormFunction`` (what it used before), PyTorch's
``F.rms_norm`` and the eager Llama formula, at a trainer's shapes (tokens of a micro-batch x hidden).
Inputs bf16 (a matmul's output), the weight fp32 (the trainer's master copy under autocast) except in
the ``bf16 weight`` rows. Each row: the median of ``--reps`` CUDA-graph-free timings of forward +
backward, the bytes the pass must move (x, dy read twice and dx written in bf16) at ``--peak-tbs``,
and the largest difference of dx and dweight from an fp32 reference (relative to the reference's
largest value).

    python bench/rms_norm_train.py                      # on a GPU
    python bench/rms_norm_train.py --device cpu --shapes 64x32 --reps 2    # a smoke run (no Liger rows)
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def eager(x, w, eps):
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def liger(x, w, eps):
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    return LigerRMSNormFunction.apply(x, w, eps, 0.0, "llama", False)


def reinforge_fused(x, w, eps):
    from reinforge.models import fused

    return fused.rms_norm(x, w, eps)


def torch_fused(x, w, eps):
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def torch_autocast(x, w, eps):
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        return F.rms_norm(x, (x.shape[-1],), w, eps)


def timed(fn, x, w, dy, eps, reps, dev):
    ts = []
    for i in range(reps + 3):
        xg = x.detach().requires_grad_()
        wg = w.detach().requires_grad_()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        y = fn(xg, wg, eps)
        y.backward(dy.to(y.dtype))
        if dev.type == "cuda":
            torch.cuda.synchronize()
        if i >= 3:
            ts.append(time.perf_counter() - t)
    return statistics.median(ts), xg.grad, wg.grad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shapes", default="65536x576,16384x1536,16384x4096")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--peak-tbs", type=float, default=4.8, help="memory bandwidth limit, TB/s (H200: 4.8)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    eps = 1e-5
    fns = [("eager (Llama casting)", eager, False), ("torch F.rms_norm", torch_fused, False)]
    fns += [("torch F.rms_norm, autocast", torch_autocast, False), ("torch F.rms_norm, bf16 weight", torch_fused, True)]
    if dev.type == "cuda":
        fns[1:1] = [("reinforge fused.rms_norm", reinforge_fused, False), ("Liger LigerRMSNormFunction", liger, False)]
    print(f"{torch.cuda.get_device_name() if dev.type == 'cuda' else 'CPU'}, torch {torch.__version__}")
    print("| tokens x hidden | kernel | fwd+bwd ms | share of the bandwidth limit | dx err | dw err |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for shape in args.shapes.split(","):
        M, N = (int(v) for v in shape.split("x"))
        g = torch.Generator(device=dev).manual_seed(0)
        x = torch.randn(M, N, device=dev, generator=g).to(torch.bfloat16)
        w = 1 + 0.1 * torch.randn(N, device=dev, generator=g)
        dy = torch.randn(M, N, device=dev, generator=g).to(torch.bfloat16)
        xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
        (xr.float().double() * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + eps) * wr).backward(dy.double())
        limit = 5 * M * N * 2 / (args.peak_tbs * 1e12)  # x, y, dy, x again, dx: bf16
        for name, fn, bf16_w in fns:
            try:
                s, dx, dw = timed(fn, x, w.to(torch.bfloat16) if bf16_w else w, dy, eps, args.reps, dev)
            except Exception as e:  # noqa: BLE001 - a row that cannot run says why
                print(f"| {M} x {N} | {name} | failed: {type(e).__name__}: {str(e)[:80]} | | | |")
                continue
            ex = ((dx.double() - xr.grad).abs().max() / xr.grad.abs().max()).item()
            ew = ((dw.double() - wr.grad).abs().max() / wr.grad.abs().max()).item()
            print(f"| {M} x {N} | {name} | {s * 1e3:.3f} | {limit / s:.0%} | {ex:.1e} | {ew:.1e} |")


if __name__ == "__main__":
    main()
