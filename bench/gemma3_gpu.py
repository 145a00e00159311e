"""Gemma 3 (``gemma3_text``) on a GPU (issue 53): a Gemma-3-12B-shaped model (random bf16 weights, layers cut:
5 local sliding-window layers to 1 global, window 1024) in the embedded engine and the trainer.

    PYTHONPATH=. python bench/gemma3_gpu.py --quick          # < 3 minutes on one H100 / H200
    PYTHONPATH=. python bench/gemma3_gpu.py --layers 12 --seqs 16 64 256 --contexts 4096 8192 32768

Prints one row per (sequences, context): the engine's decode tokens/s (bf16, CUDA graphs, Triton paged decode
with the sliding window, the local layers' keys in per-slot rings) and the bandwidth limit beside it: the bytes
one decode step must read (weights once, plus each sequence's keys and values: the global layers' whole context,
the local layers' last ``window`` tokens) over the GPU's HBM bandwidth (reinforge.plan.hardware). Decode is timed
in the steady state, about ``--decode`` tokens per sequence (bench/family_timing.py: every sequence prefilled, the
graphs captured, engine steps timed alone). Rows whose KV cache does not fit are skipped and said so. Then the bf16
engine-vs-trainer log-prob difference and trainer forward+backward tokens/s, native against the transformers fallback.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from family_timing import steady_decode_rate, train_speed

# Gemma-3-12B's text config (google/gemma-3-12b-pt), layers cut by --layers
GEMMA3_12B = dict(
    model_type="gemma3_text",
    vocab_size=262208,
    hidden_size=3840,
    intermediate_size=15360,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=256,
    query_pre_attn_scalar=256,
    sliding_window=1024,
    max_position_embeddings=131072,
    rms_norm_eps=1e-6,
    hidden_activation="gelu_pytorch_tanh",
    tie_word_embeddings=True,
    rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    },
)


def gemma3_folder(out: Path, layers: int) -> Path:
    cfg = dict(GEMMA3_12B, num_hidden_layers=layers)
    cfg["layer_types"] = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)]
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def step_bytes(model, seqs: int, context: float) -> float:
    """Bytes one decode step reads: the weights once, and each sequence's K and V (bf16) over its visible keys."""
    a = model.args
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    per_layer = 2 * a.num_kv_heads * a.head_dim * 2
    keys = sum(min(context, w) if w else context for w in (a.window(i) for i in range(a.num_layers)))
    return weights + seqs * per_layer * keys


def decode_row(model, seqs: int, context: int, decode: int, bandwidth: float) -> dict:
    from reinforge.config import EngineConfig
    from reinforge.engine import EmbeddedEngine

    try:
        engine = EmbeddedEngine(model, EngineConfig(max_num_seqs=seqs), max_model_len=context + decode + 72)
    except (MemoryError, ValueError, torch.OutOfMemoryError) as e:
        return {"skipped": str(e)[:120]}
    if engine.runner.layout.num_slots < seqs or engine.runner.layout.num_blocks * engine.runner.layout.block_size < (
        seqs * (context + decode + 72)
    ):
        del engine
        torch.cuda.empty_cache()
        return {"skipped": "the KV pool holds fewer sequences at this context"}
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 200000, (context,), generator=g).tolist() for _ in range(seqs)]
    tok_s = steady_decode_rate(engine, prompts, decode + 64, max(1, decode // 8))
    limit = seqs / (step_bytes(model, seqs, context + 8 + decode / 2) / bandwidth)
    del engine
    torch.cuda.empty_cache()
    return {"decode_tok_s": round(tok_s), "limit_tok_s": round(limit), "of_limit": round(tok_s / limit, 3)}


def logprob_mismatch(model, context: int, new: int = 64) -> dict:
    """bf16 engine log-probs against the trainer's forward over the same tokens (one sequence past the window)."""
    from reinforge.config import EngineConfig
    from reinforge.engine import EmbeddedEngine
    from reinforge.models.transformer import Variant
    from reinforge.records import GenerateRequest, SamplingParams

    engine = EmbeddedEngine(model, EngineConfig(max_num_seqs=4), max_model_len=context + new + 8)
    p = torch.randint(10, 200000, (context,), generator=torch.Generator().manual_seed(1)).tolist()
    ((r,),) = engine.generate([GenerateRequest(p, SamplingParams(max_new_tokens=new, ignore_eos=True))])
    del engine
    with torch.no_grad():
        variant = model.variant
        model.set_variant(Variant())
        ids = torch.tensor([p + r.token_ids], device="cuda")
        logits = model(ids)[0, len(p) - 1 : -1].float()
        model.set_variant(variant)
    ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r.token_ids, device="cuda")[:, None])[:, 0].cpu()
    diff = (ref - torch.tensor(r.log_probs)).abs()
    return {"logprob_diff_mean": diff.mean().item(), "logprob_diff_max": diff.max().item()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="16 and 64 sequences at 4k and 8k, 6 layers")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--seqs", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--contexts", type=int, nargs="+", default=[4096, 8192, 32768])
    ap.add_argument("--decode", type=int, default=64, help="decode steps timed per row")
    ap.add_argument("--train-tokens", type=int, default=8192)
    args = ap.parse_args()
    if args.quick:
        args.layers, args.seqs, args.contexts, args.decode, args.train_tokens = 6, [16, 64], [4096, 8192], 32, 4096
    from reinforge.models.loading import build_model
    from reinforge.plan.hardware import detect

    dev = torch.device("cuda")
    gpu = detect(dev)
    bandwidth = gpu.bandwidth if gpu is not None and gpu.bandwidth else 3.35e12  # (unknown GPU: an H100's)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, f"HBM {bandwidth / 1e12:.2f} TB/s", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = gemma3_folder(Path(tmp) / "m", args.layers)
        positions = max(*args.contexts, 2048) + args.decode + 128
        model = build_model(folder, torch.bfloat16, dev, random_init=True, max_positions=positions)
        print(f"Gemma-3-12B shape, {args.layers} of 48 layers (5 local : 1 global, window 1024), random bf16 weights")
        print(f"{'seqs':>5} {'context':>8} {'decode tok/s':>13} {'limit tok/s':>12} {'of limit':>9}")
        for context in args.contexts:
            for seqs in args.seqs:
                row = decode_row(model, seqs, context, args.decode, bandwidth)
                if "skipped" in row:
                    print(f"{seqs:>5} {context:>8}  skipped: {row['skipped']}", flush=True)
                else:
                    print(
                        f"{seqs:>5} {context:>8} {row['decode_tok_s']:>13} {row['limit_tok_s']:>12} "
                        f"{row['of_limit']:>9.1%}",
                        flush=True,
                    )
        print("log-probs (bf16, engine vs trainer, 2k prompt + 64):", logprob_mismatch(model, 2048), flush=True)
        del model
        torch.cuda.empty_cache()
        if args.train_tokens:
            print(
                f"train ({args.train_tokens} tokens):", train_speed(folder, args.train_tokens, high=200000), flush=True
            )


if __name__ == "__main__":
    main()
