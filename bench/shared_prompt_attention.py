"""Attention of shared-prompt rows (train.packing=shared_prompt), forward + backward, on one GPU: the
[T, T] mask (SDPA), and varlen flash attention over each response's gathered ``[prompt, response]`` keys
with the gather done by advanced indexing (backward: ``index_put_`` with accumulation, which sorts) or by
``index_select`` (backward: ``index_add_``). SmolLM2's attention shape (9 heads, 3 key-value heads, head
dim 64), bf16; each row a prompt and ``--n`` responses of 32-256 tokens. Prints ms per layer (median).

    python bench/shared_prompt_attention.py [--rows 16] [--n 8] [--prompt-len 100 2048]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from reinforge.models.packing import PackedAttention, _varlen, shared_prompt_keys


def layout(rows: int, n: int, prompt: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """doc_ids [rows, T] and shared [rows, T] of ``rows`` shared-prompt rows (padding -1 at the end)."""
    g = torch.Generator().manual_seed(0)
    docs = []
    for _ in range(rows):
        d = [0] * prompt
        for k in range(n):
            d += [k + 1] * int(torch.randint(32, 257, (1,), generator=g))
        docs.append(d)
    T = max(len(d) for d in docs)
    doc = torch.tensor([d + [-1] * (T - len(d)) for d in docs], device=device)
    return doc, doc == 0


def run(fn, q, k, v, repeat: int = 10) -> float:
    times = []
    for i in range(repeat + 2):
        x = [t.detach().requires_grad_() for t in (q, k, v)]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*x).float().square().sum().backward()
        end.record()
        torch.cuda.synchronize()
        if i >= 2:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, nargs="+", default=[100, 2048])
    args = ap.parse_args()
    dev = torch.device("cuda")
    varlen_attn, causal, has_gqa = _varlen()[:3]
    extra = {"enable_gqa": True} if has_gqa else {}
    print("| prompt | rows x T | masked SDPA ms | varlen, gather by indexing ms | varlen, index_select ms |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for P in args.prompt_len:
        doc, shared = layout(args.rows, args.n, P, dev)
        B, T = doc.shape
        q = torch.randn(B, T, 9, 64, device=dev, dtype=torch.bfloat16)
        k, v = (torch.randn(B, T, 3, 64, device=dev, dtype=torch.bfloat16) for _ in range(2))
        mask = PackedAttention(doc, shared, varlen=False)
        cu, longest = mask.cu_seqlens()
        index, cu_k, longest_k = shared_prompt_keys(doc, shared, cu)

        def varlen(q, k, v, select: bool):
            if not has_gqa:
                k, v = (x.repeat_interleave(3, dim=2) for x in (k, v))
            k, v = k.reshape(B * T, -1, 64), v.reshape(B * T, -1, 64)
            k, v = (k.index_select(0, index), v.index_select(0, index)) if select else (k[index], v[index])
            o = varlen_attn(q.reshape(B * T, 9, 64), k, v, cu, cu_k, longest, longest_k, **causal, **extra)
            return o.view(B, T, 9, 64)

        ms = [
            run(lambda q, k, v: mask.attend(0, q, k, v), q, k, v),
            run(lambda q, k, v: varlen(q, k, v, False), q, k, v),
            run(lambda q, k, v: varlen(q, k, v, True), q, k, v),
        ]
        print(f"| {P} | {B} x {T} | " + " | ".join(f"{m:.3f}" for m in ms) + " |", flush=True)


if __name__ == "__main__":
    main()
