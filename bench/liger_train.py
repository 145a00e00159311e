"""Liger-Kernel on a training micro-batch (issue 28), one process, one GPU.

One policy-gradient micro-batch (forward, PPO-clip loss over every token, backward) of a model with
random weights (default: Qwen2.5-1.5B's architecture, 151,936-entry vocabulary), fp32 parameters
under bf16 autocast with gradient checkpointing, as reinforge's trainer runs it. Rows of
``--row-len`` tokens, ``tokens / row-len`` rows per micro-batch. Variants, each a fresh model:

* ``eager``             RMSNorm / RoPE / SiLU-and-multiply / MoE permutation in eager PyTorch; LM head ->
                        bf16 logits [N, V] -> the chunked PyTorch log-probs (``algo/logprobs.py``).
* ``fused``             ``model.fused_kernels``: Liger-Kernel's RMSNorm, RoPE and SiLU-mul with
                        gradients (``models/fused.py``), the log-prob and MoE permutation kernels
                        (``algo/fused_logprobs.py``, ``models/moe_dispatch.py``).
* ``fused+liger_loss``  the same kernels; the LM head and the loss as Liger's
                        ``LigerFusedLinearGRPOLoss`` (chunked over rows: the [N, V] logits are never
                        all in memory).
* ``fused+no_checkpointing``  ``fused`` without gradient checkpointing (every layer's activations
                        kept: no recomputation, more memory).
* ``fused+compile``     ``fused`` with every decoder layer compiled by inductor (``model.torch_compile``).
* ``fused+torch_paths`` ``fused`` with the log-probs and the MoE token permutation in PyTorch (chunked
                        log-probs; advanced indexing), as before their Triton kernels (2026-11-28).

``--profile`` adds, after each variant's timings, the profiler's table of one more step: the 25
kernels with the most GPU time (self CUDA time, summed by name) and the step's total.

At commit ed393e6 (before the project dropped its own backward kernels for Liger's) the script
also measured those kernels ("ours"): docs/benchmarks.md has that table.

Prints tokens/s, the share of the bf16 peak (model FLOPs: 6 x parameters x tokens plus causal
attention, over the GPU's dense bf16 peak from ``reinforge/plan/hardware.py``: 989 TFLOP/s on an H100 SXM or
H200; recomputation under checkpointing not counted),
and the peak memory of the step (parameters and gradients included).

    PYTHONPATH=. python bench/liger_train.py [--arch qwen2.5-1.5b] [--tokens 8192 16384] [--row-len 1024]
"""

from __future__ import annotations

import argparse
import functools
import gc
import statistics
import sys
import time

import torch

sys.path.insert(0, "bench")
from archs import active_params, hf_config  # noqa: E402

from reinforge.algo.logprobs import token_log_probs  # noqa: E402
from reinforge.models import moe_dispatch  # noqa: E402
from reinforge.models import transformer as T  # noqa: E402
from reinforge.plan.hardware import detect  # noqa: E402

VARIANTS = ("eager", "fused", "fused+liger_loss", "fused+no_checkpointing", "fused+compile", "fused+torch_paths")
EPS = 0.2
FUSED_DISPATCH = moe_dispatch._fused


def torch_paths(variant: str) -> bool:
    """Whether ``variant`` takes the PyTorch log-probs and MoE permutation instead of their kernels."""
    return variant == "eager" or variant.endswith("torch_paths")


def ppo_clip(lp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
    ratio = torch.exp(lp - old)
    return -torch.minimum(ratio * adv, ratio.clamp(1 - EPS, 1 + EPS) * adv).mean()


def build(arch: str, variant: str, device: torch.device) -> T.CausalLM:
    torch.manual_seed(0)
    with torch.device("meta"):  # allocated once, on the GPU (an 8B model's CPU init takes minutes)
        model = T.CausalLM(hf_config(arch))
    model.to_empty(device=device)
    if model.args.tie_word_embeddings:  # to_empty allocates each module's tensor: tie them again
        model.lm_head.weight = model.model.embed_tokens.weight
    model.init_weights()
    model.init_rope()
    model.gradient_checkpointing = not variant.endswith("no_checkpointing")
    model.train()
    model.set_variant(T.Variant(fused_kernels=variant.startswith("fused")))
    if variant.endswith("compile"):
        model.compile_layers()
    return model


def step_fn(model: T.CausalLM, variant: str, ids: torch.Tensor, old: torch.Tensor, adv: torch.Tensor):
    """One forward + backward; returns the loss."""
    targets = ids[:, 1:]
    with torch.autocast("cuda", torch.bfloat16):
        hidden = model.forward_hidden(ids)[:, :-1]
        if variant.endswith("liger_loss"):
            from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

            loss_fn = LigerFusedLinearGRPOLoss(
                beta=0.0,
                use_ref_model=False,
                epsilon_low=EPS,
                epsilon_high=EPS,
                loss_type="bnpo",
                compiled=True,
                chunk_size=1,
            )
            out = loss_fn(hidden, model.lm_head.weight, targets, torch.ones_like(targets), adv, old_per_token_logps=old)
            loss = out[0] if isinstance(out, tuple) else out
        else:
            logits = model.lm_head(hidden.reshape(-1, hidden.shape[-1]))
            lp, _ = token_log_probs(logits, targets.reshape(-1), fused=not torch_paths(variant))
            loss = ppo_clip(lp, old.reshape(-1), adv.repeat_interleave(targets.shape[1]))
    loss.backward()
    return loss.detach()


def model_flops(cfg, n_params: int, tokens: int, row_len: int) -> float:
    """6 x active parameters x tokens + causal attention (QK^T and PV, forward and backward: 6 x layers x
    row_len x heads x head_dim per token)."""
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    attn = 6 * cfg.num_hidden_layers * row_len * cfg.num_attention_heads * head_dim
    return tokens * (6 * n_params + attn)


def kernel_table(run, rows: int = 25) -> str:
    """The profiler's table of one call of ``run``: the ``rows`` kernels with the most GPU time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        run()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=rows, max_name_column_width=60)


def measure(
    arch: str, variant: str, tokens: int, row_len: int, steps: int, device: torch.device, profile: bool = False
) -> dict:
    model = build(arch, variant, device)
    moe_dispatch._fused = (lambda t: False) if torch_paths(variant) else FUSED_DISPATCH
    rows = tokens // row_len
    g = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(0, model.args.vocab_size, (rows, row_len), device=device, generator=g)
    old = -torch.rand(rows, row_len - 1, device=device, generator=g) * 10
    adv = torch.randn(rows, device=device, generator=g)
    n_params = active_params(model)
    torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for _ in range(steps + 2):
        model.zero_grad(set_to_none=False)
        torch.cuda.synchronize()
        t = time.perf_counter()
        losses.append(float(step_fn(model, variant, ids, old, adv)))
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    peak = torch.cuda.max_memory_allocated() / 2**30
    table = kernel_table(functools.partial(step_fn, model, variant, ids, old, adv)) if profile else None
    del model
    gc.collect()
    torch.cuda.empty_cache()
    s = statistics.median(times[2:])
    return dict(
        variant=variant,
        tokens=tokens,
        s=s,
        tok_s=tokens / s,
        peak_gib=peak,
        loss=losses[-1],
        table=table,
        flops=model_flops(hf_config(arch), n_params, tokens, row_len),
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="qwen2.5-1.5b")
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384])
    ap.add_argument("--row-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--profile", action="store_true", help="print each variant's kernel table (one more step)")
    args = ap.parse_args()
    device = torch.device("cuda")
    name = torch.cuda.get_device_name()
    known = detect(device)
    peak = known.bf16_flops if known is not None and known.bf16_flops else float("nan")  # (the planner's table)
    import liger_kernel

    print(
        f"{args.arch}, rows of {args.row_len} tokens, {name}, torch {torch.__version__}, "
        f"liger-kernel {getattr(liger_kernel, '__version__', '?')}"
    )
    print("| tokens/micro-batch | variant | s/step | tokens/s | vs fused | % of bf16 peak | peak GiB | loss |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for tokens in args.tokens:
        rows = []
        for v in args.variants:
            try:
                rows.append(measure(args.arch, v, tokens, args.row_len, args.steps, device, args.profile))
            except Exception as e:  # OOM, or a torch.compile failure inside Liger's chunked loss
                rows.append(dict(variant=v, tokens=tokens, error=f"{type(e).__name__}: {str(e)[:60]}"))
                gc.collect()
                torch.cuda.empty_cache()
            torch._dynamo.reset()  # Liger's compiled loss: a fresh compile per shape
        base = next((r["tok_s"] for r in rows if r["variant"] == "fused" and "error" not in r), float("nan"))
        for r in rows:
            if "error" in r:
                print(f"| {tokens} | {r['variant']} | {r['error']} | | | | | |")
                continue
            mfu = 100 * r["flops"] / r["s"] / peak
            print(
                f"| {tokens} | {r['variant']} | {r['s']:.3f} | {r['tok_s']:,.0f} | {r['tok_s'] / base:.2f}x | "
                f"{mfu:.1f} | {r['peak_gib']:.1f} | {r['loss']:.4f} |",
                flush=True,
            )
        for r in rows:
            if r.get("table"):
                print(f"\n{args.arch}, {tokens} tokens, {r['variant']}: kernels by GPU time\n{r['table']}", flush=True)


if __name__ == "__main__":
    main()
