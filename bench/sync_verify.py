"""What the weight-sync checksums cost (issue 51): both sides' checksums of a model's tensors.

    PYTHONPATH=. python bench/sync_verify.py --device cuda --arch llama-8b   # Llama-3-8B shapes, bf16
    PYTHONPATH=. python bench/sync_verify.py --device cpu --arch smollm2      # SmolLM2-135M shapes

Random tensors of the architecture's shapes (the checksum reads bytes: values do not matter) in
``--dtype``; cut into buckets of ``--bucket-mb`` as the weight sync does; each bucket checksummed with
:func:`reinforge.weights.verify.checksums` (one host read per bucket). The sender side with an fp32
master copy also casts to the engine's dtype (``--sender-fp32``). Prints seconds per sync side and
GB/s. A run's own numbers: the ``sync/verify_seconds`` metric (both sides and the comparison) and the
``verify`` / ``weight_checksums`` trace spans.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from reinforge.weights.buckets import bucket_by_bytes
from reinforge.weights.verify import checksums

ARCHS = {  # hidden, intermediate, layers, heads, kv heads, vocab
    "smollm2": (576, 1536, 30, 9, 3, 49152),
    "qwen3-1.7b": (2048, 6144, 28, 16, 8, 151936),
    "llama-8b": (4096, 14336, 32, 32, 8, 128256),
}


def shapes(arch: str) -> list[tuple[str, tuple[int, ...]]]:
    h, i, n, heads, kv, vocab = ARCHS[arch]
    d = h // heads
    out = [("model.embed_tokens.weight", (vocab, h))]
    for layer in range(n):
        p = f"model.layers.{layer}."
        out += [
            (p + "self_attn.q_proj.weight", (heads * d, h)),
            (p + "self_attn.k_proj.weight", (kv * d, h)),
            (p + "self_attn.v_proj.weight", (kv * d, h)),
            (p + "self_attn.o_proj.weight", (h, heads * d)),
            (p + "mlp.gate_proj.weight", (i, h)),
            (p + "mlp.up_proj.weight", (i, h)),
            (p + "mlp.down_proj.weight", (h, i)),
            (p + "input_layernorm.weight", (h,)),
            (p + "post_attention_layernorm.weight", (h,)),
        ]
    return out + [("model.norm.weight", (h,)), ("lm_head.weight", (vocab, h))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--arch", default="llama-8b", choices=list(ARCHS))
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--sender-fp32", action="store_true", help="the sender holds fp32 and casts to --dtype")
    ap.add_argument("--bucket-mb", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    held = torch.float32 if args.sender_fp32 else dtype
    named = [(n, torch.randn(s, device=device, dtype=held)) for n, s in shapes(args.arch)]
    nbytes = sum(t.numel() * torch.empty((), dtype=dtype).element_size() for _, t in named)

    def one() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for bucket in bucket_by_bytes(named, args.bucket_mb << 20):
            checksums((t for _, t in bucket), dtype)
        return time.perf_counter() - start

    one()  # warm-up (the position weights, allocator)
    times = sorted(one() for _ in range(args.repeats))
    best = times[0]
    print(
        json.dumps(
            {
                "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                "arch": args.arch,
                "dtype": args.dtype,
                "sender_fp32": args.sender_fp32,
                "tensors": len(named),
                "GB": round(nbytes / 1e9, 3),
                "seconds_per_side": round(best, 4),
                "GB_per_s": round(nbytes / 1e9 / best, 1),
                "all_seconds": [round(t, 4) for t in times],
            }
        )
    )


if __name__ == "__main__":
    main()
