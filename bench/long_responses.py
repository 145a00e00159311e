"""Long responses on real architectures (random weights): generation, packed vs padded training,
chunked vs unchunked log-probs. Prints one table per part.

For each ``--archs`` x ``--lengths`` (new tokens per response):

* **generation**: the embedded engine holds ``--seqs`` sequences at the full context
  (``--prompt-len`` + length); the prompts are ``length - --window`` tokens long and the engine
  samples ``--window`` new tokens (EOS ignored), so the table gives decode tokens/s at the
  context of a response's last tokens (the slowest part of a long generation; a full 8k-token
  generation would take minutes per row) and the prefill tokens/s; peak memory is the whole
  engine's (weights + the KV cache of every sequence at full length).
* **training**: one GRPO step (``TrainWorker``, the RL loop's code, gradient checkpointing, bf16
  autocast, fp32 master weights) on ``--train-samples`` samples whose response lengths are spread
  uniformly over [length / 8, length] (reasoning rollouts are uneven), ``train.packing`` none vs
  sequences at the same ``max_tokens_per_gpu``; tokens/s counts real (unpadded) tokens.
* **log-prob pass**: peak memory of the trainer's no-grad log-prob pass over one micro-batch of
  ``--logprob-tokens`` response tokens with ``train.log_prob_chunk_size`` 2048 vs unchunked.

    python bench/long_responses.py                       # on a GPU: Qwen2.5-0.5B / 1.5B x 4096 / 8192
    python bench/long_responses.py --device cpu --archs smollm2 --lengths 64 --seqs 4 --window 8 \
        --train-samples 4 --max-tokens 256 --logprob-tokens 128      # a smoke run
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
import traceback
from pathlib import Path

import torch
from archs import ARCHS, write_random_model
from scored import random_groups


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")


def kv_gib(eng, blocks: int) -> float:
    """GiB of ``blocks`` blocks of the engine's KV cache (keys and values, all layers)."""
    from reinforge.engine.kv_cache import bytes_per_block

    a = eng.model.args
    return (
        blocks
        * bytes_per_block(
            a.num_layers, a.num_kv_heads, a.head_dim, eng.scheduler.layout.block_size, eng.runner.kv_dtype
        )
        / 2**30
    )


def bench_generation(
    folder: Path, length: int, args, device: torch.device, kv_cache_dtype: str = "auto"
) -> dict[str, float]:
    from reinforge.config import EngineConfig
    from reinforge.engine import EmbeddedEngine
    from reinforge.models.loading import build_model
    from reinforge.records import GenerateRequest, SamplingParams

    reset_peak(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_model(folder, dtype, device).eval()
    vocab = model.args.vocab_size
    g = torch.Generator().manual_seed(0)
    prompt_len = args.prompt_len + length - args.window
    prompts = [torch.randint(100, vocab - 100, (prompt_len,), generator=g).tolist() for _ in range(args.seqs)]
    eng = EmbeddedEngine(
        model,
        EngineConfig(
            max_num_seqs=args.seqs,
            kv_cache_memory_fraction=0.9,
            cuda_graph=device.type == "cuda",
            kv_cache_dtype=kv_cache_dtype,
        ),
        max_model_len=args.prompt_len + length,
    )
    sp = SamplingParams(max_new_tokens=args.window, temperature=1.0, ignore_eos=True)
    eng.generate([GenerateRequest(prompts[0][:64], SamplingParams(max_new_tokens=8, ignore_eos=True))])  # warm-up
    sync(device)
    groups = [eng.add_request(GenerateRequest(p, sp)) for p in prompts]
    t = time.perf_counter()
    while (
        eng.scheduler.waiting and eng.scheduler.free
    ):  # prefill every prompt that has a slot first (generate() interleaves prefill batches with decoding)
        eng._admit()
    sync(device)
    prefill_s = time.perf_counter() - t
    eng.step()  # the first decode steps at this context, untimed: they capture its CUDA graph
    sync(device)
    warm = 1 + eng.config.sync_interval  # tokens per sequence before the timing: the prefill's and that step's
    t = time.perf_counter()
    while eng.has_unfinished():
        eng.step()
    sync(device)
    decode_s = time.perf_counter() - t
    new = sum(len(r.token_ids) for g in groups for r in g.results) - args.seqs * warm
    # the physical limit of a decode step: every weight and every cached key/value read once
    a, elem = model.args, eng.runner.kv_dtype.itemsize
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kv_bytes = args.seqs * (args.prompt_len + length) * a.num_layers * a.num_kv_heads * a.head_dim * 2 * elem
    step_ms = 1e3 * decode_s / (args.window - warm)
    limit_ms = 1e3 * (weight_bytes + kv_bytes) / (args.peak_tbs * 1e12)
    out = {
        "slots": eng.num_slots,
        "prefill_tok_s": args.seqs * prompt_len / prefill_s,
        "decode_tok_s": new / decode_s,
        "step_ms": step_ms,
        "limit_ms": limit_ms,
        "share": limit_ms / step_ms,
        "peak_gib": peak_gib(device),
        "kv_gib": kv_gib(eng, eng.scheduler.allocator.num_blocks),
        "kv_held_gib": kv_gib(eng, eng.scheduler.allocator.peak_used),
        "preempted": eng.num_preemptions,
    }
    eng.shutdown()
    del eng, model
    return out


def bench_paging(folder: Path, length: int, args, device: torch.device, pool_share: float) -> dict[str, float]:
    """Responses of lengths spread over [length / 8, length] (EOS ignored), with the KV-cache pool
    capped at ``pool_share`` of what every sequence at full length would need (the engine
    preempts and recomputes when it runs dry): tokens/s, KV memory held, preemptions."""
    from reinforge.config import EngineConfig
    from reinforge.engine import EmbeddedEngine
    from reinforge.models.loading import build_model
    from reinforge.records import GenerateRequest, SamplingParams

    reset_peak(device)
    model = build_model(folder, torch.bfloat16 if device.type == "cuda" else torch.float32, device).eval()
    g = torch.Generator().manual_seed(0)
    vocab = model.args.vocab_size
    prompts = [torch.randint(100, vocab - 100, (args.prompt_len,), generator=g).tolist() for _ in range(args.seqs)]
    lengths = spread(args.seqs, length)
    L = args.prompt_len + length
    full = args.seqs * -(-L // 16)
    eng = EmbeddedEngine(
        model,
        EngineConfig(
            max_num_seqs=args.seqs,
            kv_block_size=16,
            kv_cache_memory_fraction=0.9,
            num_kv_blocks=int(full * pool_share),
            cuda_graph=device.type == "cuda",
        ),
        max_model_len=L,
    )
    eng.generate([GenerateRequest(prompts[0][:64], SamplingParams(max_new_tokens=8, ignore_eos=True))])  # warm-up
    reqs = [
        GenerateRequest(p, SamplingParams(max_new_tokens=n, temperature=1.0, ignore_eos=True))
        for p, n in zip(prompts, lengths)
    ]
    sync(device)
    t = time.perf_counter()
    eng.generate(reqs)
    sync(device)
    dt = time.perf_counter() - t
    out = {
        "tok_s": sum(lengths) / dt,
        "s": dt,
        "kv_pool_gib": kv_gib(eng, eng.scheduler.allocator.num_blocks),
        "kv_held_gib": kv_gib(eng, eng.scheduler.allocator.peak_used),
        "preempted": eng.num_preemptions,
        "peak_gib": peak_gib(device),
    }
    eng.shutdown()
    del eng, model
    return out


def spread(n: int, length: int) -> list[int]:
    """``n`` response lengths spread uniformly over [length / 8, length]."""
    return [max(1, round(length / 8 + (length - length / 8) * i / max(n - 1, 1))) for i in range(n)]


def rollout(lengths: list[int], prompt_len: int, vocab: int, seed: int = 0):
    """Scored samples of these response lengths in groups of 2, random tokens and rewards."""
    return random_groups([(prompt_len, R) for R in lengths], vocab, seed)


def worker(folder: Path, device: torch.device, args, **overrides):
    from reinforge.config import load_config
    from reinforge.train.worker import TrainWorker

    o = {
        "model.path": folder,
        "train.device": device.type,
        "train.max_tokens_per_gpu": args.max_tokens,
        "model.gradient_checkpointing": "true",
        "train.lr": 1e-6,
        **overrides,
    }
    return TrainWorker(load_config(None, [f"{k}={v}" for k, v in o.items()]), folder)


def bench_training(folder: Path, length: int, packing: str, args, device: torch.device) -> dict[str, float]:
    reset_peak(device)
    w = worker(folder, device, args, **{"train.packing": packing})
    from reinforge.train.rollout_share import RolloutBatch

    groups = rollout(spread(args.train_samples, length), args.prompt_len, ARCHS[args.arch_now]["vocab_size"])
    samples = [s for g in groups for s in g]
    tokens = sum(len(s.tokens) for s in samples)
    times = []
    for step in range(args.train_steps):
        sync(device)
        t = time.perf_counter()
        w.score(RolloutBatch(groups, step))
        w.train(step)
        sync(device)
        times.append(time.perf_counter() - t)
    mbs, _ = w.actor.rank_micro_batches(samples, list(range(len(samples))))
    padded = sum(mb.input_ids.numel() for mb in mbs)
    out = {
        "step_s": min(times[1:] or times),
        "tok_s": tokens / min(times[1:] or times),
        "peak_gib": peak_gib(device),
        "micro_batches": len(mbs),
        "padding": 1 - tokens / padded,
    }
    del w, mbs
    return out


def bench_logprob_memory(folder: Path, chunk: int, args, device: torch.device) -> dict[str, float]:
    reset_peak(device)
    w = worker(
        folder,
        device,
        args,
        **{"train.log_prob_chunk_size": chunk, "train.max_tokens_per_gpu": args.logprob_tokens + args.prompt_len},
    )
    (sample, _), *_ = rollout([args.logprob_tokens, 1], args.prompt_len, ARCHS[args.arch_now]["vocab_size"])
    base = peak_gib(device)
    reset_peak(device)
    t = time.perf_counter()
    w.actor.compute_log_probs([sample])
    sync(device)
    out = {"peak_gib": peak_gib(device), "weights_gib": base, "s": time.perf_counter() - t}
    del w
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--archs", nargs="+", default=["qwen2.5-0.5b", "qwen2.5-1.5b"], choices=sorted(ARCHS))
    ap.add_argument("--lengths", nargs="+", type=int, default=[4096, 8192])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seqs", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--window", type=int, default=128, help="decode steps timed at the end of the context")
    ap.add_argument("--peak-tbs", type=float, default=3.35, help="HBM bandwidth, TB/s (H100 SXM: 3.35)")
    ap.add_argument("--train-samples", type=int, default=32)
    ap.add_argument("--train-steps", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=16384, help="train.max_tokens_per_gpu")
    ap.add_argument("--logprob-tokens", type=int, default=16384)
    ap.add_argument(
        "--kv-cache-dtypes",
        nargs="+",
        default=["auto"],
        help="generation: engine.kv_cache_dtype values to run (auto, fp8, ...)",
    )
    ap.add_argument(
        "--parts",
        nargs="+",
        default=["generation", "training", "logprob"],
        choices=["generation", "paging", "training", "logprob"],
    )
    ap.add_argument(
        "--pool-shares",
        nargs="+",
        type=float,
        default=[1.0, 0.4, 0.2],
        help="paging: KV pool sizes as shares of the full-length need",
    )
    args = ap.parse_args()
    device = torch.device(args.device)
    gen, train, lp, paging = [], [], [], []

    def attempt(fn, *a):
        try:
            return fn(*a)
        except torch.OutOfMemoryError:
            return "out of memory"
        except Exception as e:  # a failed row is reported, the table goes on
            traceback.print_exc()
            return f"error: {type(e).__name__}"

    with tempfile.TemporaryDirectory() as tmp:
        for arch in args.archs:
            args.arch_now = arch
            folder = Path(tmp) / arch
            write_random_model(arch, folder, max_position_embeddings=max(32768, 2 * max(args.lengths)))
            for length in args.lengths:
                if "generation" in args.parts:
                    for kvd in args.kv_cache_dtypes:
                        gen.append((arch, length, kvd, attempt(bench_generation, folder, length, args, device, kvd)))
                        print(gen[-1], flush=True)
                if "paging" in args.parts:
                    for share in args.pool_shares:
                        paging.append((arch, length, share, attempt(bench_paging, folder, length, args, device, share)))
                        print(paging[-1], flush=True)
                if "training" in args.parts:
                    for packing in ("none", "sequences"):
                        train.append(
                            (arch, length, packing, attempt(bench_training, folder, length, packing, args, device))
                        )
                        print(train[-1], flush=True)
            if "logprob" in args.parts:
                for chunk in (2048, 1 << 30):
                    lp.append((arch, chunk, attempt(bench_logprob_memory, folder, chunk, args, device)))
                    print(lp[-1], flush=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"\n{name}, torch {torch.__version__}")

    def cell(r, key, fmt):
        return format(r[key], fmt) if isinstance(r, dict) else r

    if gen:
        print(
            f"\nGeneration: {args.seqs} sequences, context {args.prompt_len} + length; decode timed over the last "
            f"{args.window} tokens"
        )
        print(f"(limit: weights + every cached K/V read once per step at {args.peak_tbs} TB/s)")
        print(
            "| arch | new tokens | KV cache | slots | prefill tok/s | decode tok/s | ms/step | limit ms | "
            "share of limit | KV pool GiB | KV held GiB | peak GiB |"
        )
        print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for arch, length, kvd, r in gen:
            print(
                f"| {arch} | {length} | {kvd} | {cell(r, 'slots', 'd')} | {cell(r, 'prefill_tok_s', ',.0f')} | "
                f"{cell(r, 'decode_tok_s', ',.0f')} | {cell(r, 'step_ms', '.2f')} | {cell(r, 'limit_ms', '.2f')} | "
                f"{cell(r, 'share', '.0%')} | {cell(r, 'kv_gib', '.1f')} | {cell(r, 'kv_held_gib', '.1f')} | "
                f"{cell(r, 'peak_gib', '.1f')} |"
            )
    if paging:
        print(
            f"\nPaged KV cache: {args.seqs} sequences, responses uniform in [L/8, L] (EOS ignored), 16-token blocks, "
            "the pool capped at a share of what all sequences at full length need"
        )
        print("| arch | max new tokens | pool share | generation tok/s | s | KV pool GiB | KV held GiB | preempted |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for arch, length, share, r in paging:
            print(
                f"| {arch} | {length} | {share:.0%} | {cell(r, 'tok_s', ',.0f')} | {cell(r, 's', '.1f')} | "
                f"{cell(r, 'kv_pool_gib', '.1f')} | {cell(r, 'kv_held_gib', '.1f')} | {cell(r, 'preempted', 'd')} |"
            )
    if train:
        print(
            f"\nTraining: {args.train_samples} samples, responses uniform in [L/8, L], prompt {args.prompt_len}, "
            f"max_tokens_per_gpu {args.max_tokens}, gradient checkpointing"
        )
        print("| arch | max new tokens | train.packing | micro-batches | padding | real tok/s | s/step | peak GiB |")
        print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
        for arch, length, packing, r in train:
            pad = f"{r['padding']:.0%}" if isinstance(r, dict) else r
            print(
                f"| {arch} | {length} | {packing} | {cell(r, 'micro_batches', 'd')} | {pad} | "
                f"{cell(r, 'tok_s', ',.0f')} | {cell(r, 'step_s', '.2f')} | {cell(r, 'peak_gib', '.1f')} |"
            )
    if lp:
        print(f"\nLog-prob pass (no grad) over {args.logprob_tokens} response tokens in one micro-batch")
        print("| arch | log_prob_chunk_size | peak GiB | of which weights before the pass | s |")
        print("| --- | --- | ---: | ---: | ---: |")
        for arch, chunk, r in lp:
            c = "unchunked" if chunk >= 1 << 30 else str(chunk)
            print(
                f"| {arch} | {c} | {cell(r, 'peak_gib', '.2f')} | {cell(r, 'weights_gib', '.2f')} | "
                f"{cell(r, 's', '.2f')} |"
            )


if __name__ == "__main__":
    main()
