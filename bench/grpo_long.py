"""GRPO end to end at long responses on one GPU, as a user would run it (issue 24's measurement).

A 1.39B Qwen2-architecture model (Qwen2.5-1.5B's layers with SmolLM2's 49k vocabulary and tokenizer,
random weights), random 0/1 rewards (so every group has a spread and every sample trains), GRPO
colocated on one GPU (engine and trainer in one process; the engine sleeps while the trainer trains),
gradient checkpointing, ``train.packing=sequences``. For each ``--lengths`` value L: ``rollout_batch_size``
x ``n_samples_per_prompt`` sequences of up to L new tokens (EOS not ignored), ``--steps`` rollout steps;
the last step is reported (the first captures CUDA graphs and compiles kernels).

Columns: sequences, mean response length, generation seconds and its tokens/s, log-prob + training
seconds, the whole step, generated tokens per second per GPU (the trained samples' response tokens /
step seconds; with ``--over-sampling --carry-over`` a carried sample's tokens were partly generated in
the step before).

    PYTHONPATH=.:bench python bench/grpo_long.py --lengths 8192 16384 --tokenizer DIR   # on a GPU
    PYTHONPATH=.:bench python bench/grpo_long.py --lengths 32 --seqs 4 --n 2 --device cpu --arch smollm2 \
        --tokenizer DIR                                                                    # a CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import tempfile
from pathlib import Path

import torch

# sequences per rollout by response length: the table (the KV cache of one H100 bounds them; an fp8
# cache holds twice as many: `--seqs 128` at 16384, docs/benchmarks.md)
SEQS = {8192: 128, 16384: 64, 32768: 16}


def random_reward(sample) -> float:
    """0 or 1 at random (seeded by the response): every GRPO group has a spread, every sample trains."""
    return float(random.Random(hash(tuple(sample.tokens[-8:]))).random() < 0.5)


def write_model(
    folder: Path,
    tokenizer: Path,
    max_positions: int,
    arch: str,
    own_vocab: bool = False,
    weights: bool = True,
    tiny: bool = False,
    **overrides,
) -> None:
    """A random model of ``arch`` with SmolLM2's tokenizer: its 49,152-entry vocabulary and tied
    embeddings, or (``own_vocab``) the architecture's own (ids the tokenizer lacks decode to nothing).
    ``weights`` False: config.json only (the run sets ``model.random_init``: a 30B model's 61 GB would not
    fit the device's disk). ``tiny``: check-model's tiny random model of the architecture (CPU smoke runs of any
    family). ``overrides``: more config values (e.g. archs.tiny_overrides)."""
    from archs import hf_config, write_random_model

    shape = {} if own_vocab else {"vocab_size": 49152, "tie_word_embeddings": True}
    shape.update(overrides)
    if tiny:  # the family's shape shrunk by check-model's maker (width 64, 4 layers, <= 8 experts): a CPU run
        from reinforge.check_model import write_tiny_model

        src = folder.parent / f"{folder.name}-config"
        hf_config(arch, max_position_embeddings=max_positions, **shape).save_pretrained(src)
        write_tiny_model(src, folder, layers=4)  # (4: a hybrid keeps one attention layer in 4)
    elif weights:
        write_random_model(arch, folder, max_position_embeddings=max_positions, **shape)
    else:
        hf_config(arch, max_position_embeddings=max_positions, **shape).save_pretrained(folder)
    for f in tokenizer.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template", "generation_config")):
            shutil.copy(f, folder / f.name)


def write_prompts(path: Path, n: int) -> None:
    topics = ["the sea", "a city at night", "an old machine", "a long journey", "the mountains", "a library"]
    with path.open("w") as f:
        for i in range(n):
            f.write(
                json.dumps(
                    {"prompt": f"Write a very long story about {topics[i % len(topics)]} ({i}).", "label": "none"}
                )
                + "\n"
            )


def workload_overrides(
    model: Path,
    data: Path,
    out: Path,
    *,
    length: int,
    seqs: int,
    n: int,
    max_num_seqs: int,
    kv_fraction: float,
    max_tokens: int,
    steps: int,
) -> list[str]:
    """The config of this benchmark's GRPO workload (random rewards, packed sequences, gradient
    checkpointing, no eval or checkpoints), shared with bench/grpo_ray.py."""
    return [
        f"model.path={model}",
        "model.gradient_checkpointing=true",
        f"data.prompt_data={data}",
        "data.n_eval_prompts=0",
        "data.apply_chat_template=true",
        f"rollout.rollout_batch_size={seqs // n}",
        f"rollout.n_samples_per_prompt={n}",
        f"rollout.rollout_max_response_len={length}",
        f"engine.max_num_seqs={max_num_seqs}",
        f"engine.kv_cache_memory_fraction={kv_fraction}",
        "reward.type=custom",
        "reward.function_path=grpo_long:random_reward",
        "train.packing=sequences",
        f"train.max_tokens_per_gpu={max_tokens or max(16384, length + 256)}",
        "train.lr=1e-6",
        f"train.num_rollout={steps}",
        f"run.output_dir={out}",
        "run.progress=false",
        "run.tensorboard=false",
        "eval.eval_before_train=false",
        "run.save_final=false",
        "run.save_interval=null",
    ]


def run(
    length: int, seqs: int, n: int, args, model: Path, data: Path, out: Path, kv_cache_dtype: str = "auto"
) -> dict[str, float]:
    from reinforge.config import load_config
    from reinforge.loop import RLLoop

    overrides = workload_overrides(
        model,
        data,
        out,
        length=length,
        seqs=seqs,
        n=n,
        max_num_seqs=seqs,
        kv_fraction=args.kv_fraction,
        max_tokens=args.max_tokens,
        steps=args.steps,
    )
    overrides += [f"train.device={args.device}", f"engine.kv_cache_dtype={kv_cache_dtype}"]
    if args.over_sampling:
        over = math.ceil(seqs // n * args.over_sampling)
        overrides += [
            f"rollout.over_sampling_batch_size={over}",
            f"engine.max_num_seqs={over * n}",
            f"rollout.partial_rollout={str(args.carry_over).lower()}",
        ]
    overrides += args.set
    loop = RLLoop(load_config(None, overrides))
    cuda = torch.cuda.is_available() and args.device.startswith("cuda")
    try:
        metrics = []
        for i in range(args.steps):
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            metrics.append(loop.rollout_step(i)[0])
            m = metrics[-1]  # each step as it ends: a run cut at its time limit still shows what it measured
            peak_step = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
            print(
                f"step {i}: generate {m['time/generate']:.1f} s ({m['perf/generate_tokens_per_s']:,.0f} tok/s), "
                f"logprob {m['time/logprob']:.1f} s, train {m.get('time/train', 0.0):.1f} s "
                f"({m['perf/train_tokens_per_s']:,.0f} tok/s), sync {m['time/sync']:.2f} s, "
                f"offload {m.get('time/offload', 0.0):.1f} s, "
                f"verify {m.get('sync/verify_seconds', float('nan')):.3f} s "
                f"(verified {m.get('sync/verified', float('nan')):g}), probe {m.get('sync/probe_seconds', 0.0):.2f} s, "
                f"step {m['time/rollout_step']:.1f} s, mean response {m['rollout/response_len_mean']:,.0f}, "
                f"peak {peak_step:.1f} GiB",
                flush=True,
            )
        peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")  # of the last step
    finally:
        loop.close()
    m = metrics[-1]
    generated = m["rollout/response_len_mean"] * m["rollout/num_samples"]
    gen_s = m["time/generate"]
    train_s = m["time/logprob"] + m.get("time/train", 0.0)
    return {
        "seqs": m["rollout/num_samples"],
        "mean_len": m["rollout/response_len_mean"],
        "gen_s": gen_s,
        "gen_tok_s": generated / gen_s,
        "train_s": train_s,
        "step_s": m["time/rollout_step"],
        "tok_s_gpu": generated / m["time/rollout_step"],
        "train_tok_s": m["perf/train_tokens_per_s"],
        "sync_s": m["time/sync"],
        "verify_s": m.get("sync/verify_seconds", float("nan")),
        "offload_s": m.get("time/offload", 0.0),
        "peak_gib": peak,
        **{
            k[len("train/") :]: v
            for k, v in m.items()
            if k.startswith(("train/logprob_abs_diff", "train/importance_weight"))
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", nargs="+", type=int, default=[8192, 16384, 32768])
    ap.add_argument("--seqs", type=int, default=0, help="sequences per rollout (0: 128 / 64 / 16 by length)")
    ap.add_argument("--n", type=int, default=8, help="samples per prompt")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument(
        "--max-tokens",
        type=int,
        default=0,
        help="train.max_tokens_per_gpu (0: max(16384, L + 256): the [tokens, vocab] logits of a larger "
        "micro-batch do not fit beside the engine's KV cache, which stays in local mode)",
    )
    ap.add_argument("--kv-fraction", type=float, default=0.3, help="engine.kv_cache_memory_fraction")
    ap.add_argument("--tokenizer", type=Path, required=True, help="a folder with SmolLM2's tokenizer files")
    ap.add_argument("--device", default="cuda")
    ap.add_argument(
        "--over-sampling",
        type=float,
        default=0.0,
        help="rollout.over_sampling_batch_size as a multiple of the prompts (0: off): the step stops "
        "once rollout_batch_size groups are complete",
    )
    ap.add_argument("--carry-over", action="store_true", help="rollout.partial_rollout: continue unfinished samples")
    ap.add_argument(
        "--kv-cache-dtypes",
        nargs="+",
        default=["auto"],
        help="engine.kv_cache_dtype values to run at each length (auto, fp8, ...)",
    )
    ap.add_argument("--arch", default="qwen2.5-1.5b", help="bench/archs.py name (smollm2 for a CPU smoke run)")
    ap.add_argument("--set", nargs="*", default=[], help="further config overrides (key=value)")
    ap.add_argument(
        "--own-vocab", action="store_true", help="the architecture's own vocabulary (default: SmolLM2's 49,152, tied)"
    )
    ap.add_argument(
        "--random-init",
        action="store_true",
        help="no weights on disk: trainer and engine draw them (model.random_init; for models the disk cannot hold)",
    )
    ap.add_argument("--tiny", action="store_true", help="the family's tiny random model (width 64, 4 layers): CPU")
    ap.add_argument(
        "--fallback",
        action="store_true",
        help="run the architecture on the transformers fallback (its family unregistered in this process: the "
        "native-vs-fallback ratio)",
    )
    args = ap.parse_args()
    if args.fallback:
        from archs import ARCHS

        from reinforge.models.families import FAMILIES

        FAMILIES._entries.pop(ARCHS[args.arch]["model_type"])
        args.set = ["train.packing=auto", *args.set]  # (packed sequences need a native family: auto says which)
    if args.random_init:
        args.set = [*args.set, "model.random_init=true"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = tmp / "model"
        positions = max(32768, max(args.lengths) + 512)
        write_model(
            model, args.tokenizer, positions, args.arch, args.own_vocab, weights=not args.random_init, tiny=args.tiny
        )
        write_prompts(tmp / "prompts.jsonl", 512)
        for length in args.lengths:
            seqs = args.seqs or SEQS.get(length, 64)
            for kvd in args.kv_cache_dtypes:
                try:
                    r = run(length, seqs, args.n, args, model, tmp / "prompts.jsonl", tmp / f"run{length}{kvd}", kvd)
                except Exception as e:  # a failed row is reported, the table goes on
                    r = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                rows.append((length, kvd, r))
                print(length, kvd, r, flush=True)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(f"\n{name}, torch {torch.__version__}; last of {args.steps} steps")
    print(
        "| responses <= | KV cache | sequences | mean length | generation s | generation tok/s | log-prob + train s | "
        "trained tok/s | weight sync s | engine offload s | peak GiB | step s | generated tok/s per GPU |"
    )
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for length, kvd, r in rows:
        if "error" in r:
            print(f"| {length} | {kvd} | {r['error']} |")
            continue
        print(
            f"| {length} | {kvd} | {r['seqs']:.0f} | {r['mean_len']:,.0f} | {r['gen_s']:.1f} | {r['gen_tok_s']:,.0f} | "
            f"{r['train_s']:.1f} | {r['train_tok_s']:,.0f} | {r['sync_s']:.1f} | {r['offload_s']:.1f} | "
            f"{r['peak_gib']:.1f} | {r['step_s']:.1f} | {r['tok_s_gpu']:,.0f} |"
        )
    mismatch = [k for k in rows[0][2] if k.startswith(("logprob_abs_diff", "importance_weight"))] if rows else []
    if mismatch:  # the trainer's log-probs against the engine's, last step (algo/mismatch.py)
        print("\n| responses <= | KV cache | " + " | ".join(mismatch) + " |")
        for length, kvd, r in rows:
            print(f"| {length} | {kvd} | " + " | ".join(f"{r.get(k, float('nan')):.4g}" for k in mismatch) + " |")


if __name__ == "__main__":
    main()
