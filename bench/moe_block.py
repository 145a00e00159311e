"""One mixture-of-experts block, forward and backward, as the trainer runs it (issue 37 item 3).

A Qwen3-MoE block (``reinforge.models.moe.SparseMoeBlock``) of a ``bench/archs.py`` architecture
(default: the 2.6B-A0.5B shape: hidden 1024, 64 experts of width 512, 8 per token) on ``--tokens``
tokens, fp32 parameters under bf16 autocast as the trainer holds them; random inputs and a random
output gradient. Each variant times forward + backward (median of ``--steps``) and splits it into
its parts, each timed alone with CUDA events:

* ``router``    the router's matmul, softmax, top-k and gate weights;
* ``cast``      the fp32 -> bf16 copy of every expert's weights (autocast's dtype);
* ``dispatch``  the sort by expert and the gather of the tokens' rows;
* ``experts``   the two grouped matmuls and SiLU-and-multiply (``torch._grouped_mm``);
* ``combine``   the un-permute and the weighted sum of each token's k outputs.

The limit beside each row: the grouped matmuls' FLOPs (forward 2 x 3 x k x H x I per token,
backward twice that) at the GPU's dense bf16 peak (``reinforge/plan/hardware.py``'s table).

Variants of the dispatch and combine (``reinforge.models.moe_dispatch``; the rest is the block's own code):

* ``torch``  PyTorch's advanced indexing: ``x[order // k]``, ``ys[pos]``, ``(ys * w).sum(1)``
             (the backward of the indexing is ``index_put_`` with accumulation, which sorts);
* ``fused``  the Triton kernels, one per direction, a program per token moving its k rows.

    PYTHONPATH=. python bench/moe_block.py [--arch qwen3-moe-2.6b-a0.5b] [--tokens 16384] [--profile]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

sys.path.insert(0, "bench")
from archs import hf_config  # noqa: E402

from reinforge.models import moe_dispatch as D  # noqa: E402
from reinforge.models.moe import SparseMoeBlock  # noqa: E402
from reinforge.plan.hardware import detect  # noqa: E402
from reinforge.utils.triton import triton_available  # noqa: E402

VARIANTS = ("torch", "fused")


FUSED = D._fused


def use(variant: str) -> None:
    """Route ``moe_dispatch``'s functions to the Triton kernels (``fused``) or PyTorch's indexing."""
    D._fused = FUSED if variant == "fused" else (lambda t: False)


def timed(fn, steps: int) -> float:
    """Median seconds of ``fn()`` over ``steps`` calls (CUDA events), after two warm-up calls."""
    out = []
    for i in range(steps + 2):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        if i >= 2:
            out.append(a.elapsed_time(b) / 1e3)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="qwen3-moe-2.6b-a0.5b")
    ap.add_argument("--tokens", type=int, nargs="+", default=[16384])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    dev = torch.device("cuda")
    cfg = hf_config(args.arch)
    H, E, k, I = cfg.hidden_size, cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size
    torch.manual_seed(0)
    block = SparseMoeBlock(H, E, k, I, cfg.norm_topk_prob, 0).to(dev)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.02)
    block.fused = triton_available("cuda")  # SiLU-mul and the permutation as kernels, as the trainer runs them
    known = detect(dev)
    peak = known.bf16_flops if known is not None and known.bf16_flops else float("nan")  # (the planner's table)
    print(
        f"{args.arch} MoE block: H={H}, E={E}, k={k}, I={I}, {torch.cuda.get_device_name()}, torch {torch.__version__}"
    )
    print(
        "| tokens | variant | fwd+bwd ms | router | cast | dispatch | experts | combine | grouped-mm FLOPs at peak ms |"
    )
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for N in args.tokens:
        x = torch.randn(1, N, H, device=dev, requires_grad=True)
        gy = torch.randn(1, N, H, device=dev, dtype=torch.bfloat16)
        limit = 3 * (2 * 3 * k * H * I) * N / peak * 1e3
        for v in args.variants:
            use(v)

            def step():
                with torch.autocast("cuda", torch.bfloat16):
                    y = block(x)
                y.backward(gy)

            total = timed(step, args.steps) * 1e3
            parts = part_times(block, x, args.steps)
            print(
                f"| {N} | {v} | {total:.2f} | "
                + " | ".join(f"{parts[p]:.2f}" for p in ("router", "cast", "dispatch", "experts", "combine"))
                + f" | {limit:.2f} |",
                flush=True,
            )
            if args.profile:
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    step()
                    torch.cuda.synchronize()
                print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=20, max_name_column_width=60))


def part_times(block: SparseMoeBlock, x: torch.Tensor, steps: int) -> dict[str, float]:
    """Forward + backward ms of each part of the block on its own (inputs detached, fresh leaves)."""
    N, H = x.shape[1], x.shape[2]
    xb = x.detach().reshape(N, H).to(torch.bfloat16).requires_grad_()
    k = block.top_k
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
        scores, _ = block.router_scores(x.detach().reshape(N, H))
        ids = block.select(scores)
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    E = block.experts.num_experts
    ends = torch.searchsorted(flat[order], torch.arange(E, device=x.device), right=True)
    gate_up = block.experts.gate_up_proj.detach().to(torch.bfloat16).requires_grad_()
    down = block.experts.down_proj.detach().to(torch.bfloat16).requires_grad_()
    xs, pos = D.dispatch(xb.detach(), order, k)
    xs.requires_grad_()
    ys = block._compute(xs, gate_up, down, ends).detach().requires_grad_()
    w = torch.rand(N, k, device=x.device, dtype=torch.bfloat16).requires_grad_()

    def router():
        with torch.autocast("cuda", torch.bfloat16):
            s, _ = block.router_scores(x.reshape(N, H))
            out = block.gate_weights(s, block.select(s))
        out.sum().backward()

    def cast():
        a, b = block.experts.gate_up_proj.to(torch.bfloat16), block.experts.down_proj.to(torch.bfloat16)
        torch.autograd.backward([a, b], [torch.ones_like(a), torch.ones_like(b)])

    def dispatch():
        o = torch.argsort(flat, stable=True)
        torch.searchsorted(flat[o], torch.arange(E, device=x.device), right=True)
        r, _ = D.dispatch(xb, o, k)
        r.backward(torch.ones_like(r))

    def experts():
        block._compute(xs, gate_up, down, ends).backward(torch.ones_like(xs))

    def combine():
        out = D.combine(ys, pos, w)
        out.backward(torch.ones_like(out))

    parts = {"router": router, "cast": cast, "dispatch": dispatch, "experts": experts, "combine": combine}
    return {name: timed(fn, steps) * 1e3 for name, fn in parts.items()}


if __name__ == "__main__":
    main()
