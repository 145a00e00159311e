"""Host (CPU) work of a small GRPO step that does not depend on the device: laying out the micro-batches
(``plan_rows`` + ``build``, per ``train.packing`` layout), the GRPO advantages, the per-sample
rollout log-prob tensors. The work of bench/grpo_vs_trl.py and bench/profile_train.py: 32 prompts x 8
samples, 100-token prompts, responses spread over [32, 256] tokens. Prints a table of milliseconds
(best of ``--repeat``). Run it against another checkout with ``PYTHONPATH=that/checkout``.

    PYTHONPATH=. python bench/host_work.py [--prompts 32] [--n 8] [--prompt-len 100] [--repeat 20]
"""

from __future__ import annotations

import argparse
import time

import torch

from reinforge.config import load_config
from reinforge.records import Sample
from reinforge.train.batching import build, plan_rows
from reinforge.train.rollout_advantages import compute_advantages


def samples(prompts: int, n: int, prompt_len: int, max_len: int = 256, vocab: int = 49152) -> list[list[Sample]]:
    """``prompts`` groups of ``n`` samples sharing their prompt, responses over [max_len / 8, max_len]."""
    g = torch.Generator().manual_seed(0)
    groups = []
    for p in range(prompts):
        prompt = torch.randint(10, vocab, (prompt_len,), generator=g).tolist()
        group = []
        for j in range(n):
            R = max_len // 8 + (p * n + j) * 7919 % (max_len - max_len // 8)
            group.append(
                Sample(
                    prompt=f"p{p}",
                    tokens=prompt + torch.randint(10, vocab, (R,), generator=g).tolist(),
                    response_length=R,
                    loss_mask=[1] * R,
                    rollout_log_probs=torch.randn(R, generator=g).tolist(),
                    reward=float(j % 2),
                    group_index=p,
                )
            )
        groups.append(group)
    return groups


def best_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=100)
    ap.add_argument("--max-tokens", type=int, default=65536, help="train.max_tokens_per_gpu")
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    groups = samples(args.prompts, args.n, args.prompt_len)
    flat = [s for g in groups for s in g]
    tokens, rlen, masks = [s.tokens for s in flat], [s.response_length for s in flat], [s.loss_mask for s in flat]
    idx = list(range(len(flat)))
    algo = load_config(None, []).algo
    adv = compute_advantages(algo, groups, 256).advantages
    per_token = {"advantages": adv, "rollout_log_probs": [torch.tensor(s.rollout_log_probs) for s in flat]}
    rows = [("advantages (GRPO)", lambda: compute_advantages(algo, groups, 256))]
    for layout in ("none", "sequences", "shared_prompt"):

        def lay_out(layout=layout):
            for r in plan_rows(tokens, rlen, idx, layout, args.max_tokens):
                build(tokens, rlen, masks, r, 0, per_token, layout == "shared_prompt")

        rows.append((f"micro-batches, {layout}", lay_out))
    n = f"{len(flat)} samples ({args.prompts} x {args.n})"
    print(f"{n}, prompts of {args.prompt_len} tokens, best of {args.repeat}")
    print("| host work | ms |\n| --- | ---: |")
    for name, fn in rows:
        print(f"| {name} | {best_ms(fn, args.repeat):.1f} |")


if __name__ == "__main__":
    main()
