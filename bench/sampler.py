"""The decode step's sampler alone: ms per call on [B, V] bf16 logits for the unfused torch path
(`sample_tokens`, on an fp32 copy as the engine runs it) and the fused inverse-CDF kernel (CUDA).

    PYTHONPATH=. python bench/sampler.py
"""

import argparse

import torch

from reinforge.engine.sampling import sample_tokens, sample_tokens_fused


def time_ms(fn, reps: int = 50) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--vocab", type=int, nargs="+", default=[49152, 151936])
    args = ap.parse_args()
    seed = torch.tensor([1], device="cuda")
    print("| B | V | torch (fp32) ms | fused ms | one read of the logits at 3 TB/s, ms |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for B in args.batch:
        for V in args.vocab:
            logits = torch.randn(B, V, device="cuda").to(torch.bfloat16)
            temp = torch.ones(B, device="cuda")
            t_torch = time_ms(lambda: sample_tokens(logits.float(), temp))
            t_fused = time_ms(lambda: sample_tokens_fused(logits, temp, seed))
            print(f"| {B} | {V} | {t_torch:.3f} | {t_fused:.3f} | {B * V * 2 / 3e9:.3f} |", flush=True)


if __name__ == "__main__":
    main()
