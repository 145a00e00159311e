"""Synchronous vs asynchronous RL at long responses (issue 26): samples/s and tokens/s.

A random-weight model of ``--arch`` (default Qwen2.5-1.5B's layers with SmolLM2's 49k vocabulary and
tokenizer, as bench/grpo_long.py), "write a very long story" prompts, random 0/1 rewards (every group
has a spread, every sample trains), responses up to ``--length`` new tokens (EOS not ignored), Ray
disaggregated by default (``cluster.actor_num_gpus_per_node=1``, ``cluster.rollout_num_gpus=1``).
Each ``--staleness`` value runs in its own process through bench/async_vs_sync.py (``0`` is the
synchronous loop; ``--partial-rollout`` continues interrupted samples in the asynchronous runs).

    PYTHONPATH=.:bench python bench/async_long.py --length 8192 --seqs 128 --num-rollout 8 \\
        --staleness 0 1 2 4 --partial-rollout --tokenizer DIR --output-dir out/async_8k      # 2 GPUs
    PYTHONPATH=.:bench python bench/async_long.py --tiny --length 16 --seqs 4 --n 2 --num-rollout 2 \\
        --staleness 0 2 --partial-rollout --tokenizer DIR --output-dir /tmp/al train.device=cpu  # CPU dry run

Trailing ``key=value`` arguments override the config of every run (e.g. a colocated placement).
Output: ``--output-dir``/``table.md`` and ``results.json`` (bench/async_vs_sync.py's columns).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import async_vs_sync  # noqa: E402
from archs import tiny_overrides  # noqa: E402
from grpo_long import write_model, write_prompts  # noqa: E402


def build_model(folder: Path, arch: str, tokenizer: Path, max_positions: int, tiny: bool, weights: bool = True) -> None:
    """A random ``arch`` model (``tiny``: shrunk for CPU) with SmolLM2's vocabulary and tokenizer files
    (:func:`grpo_long.write_model`; ``weights`` False: config.json only, the run sets ``model.random_init``)."""
    write_model(folder, tokenizer, max_positions, arch, weights=weights, **(tiny_overrides(arch) if tiny else {}))


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="qwen2.5-1.5b", help="bench/archs.py name")
    ap.add_argument("--tiny", action="store_true", help="shrink the architecture to 2 layers of width 64 (CPU)")
    ap.add_argument("--length", type=int, default=8192, help="rollout.rollout_max_response_len")
    ap.add_argument("--seqs", type=int, default=128, help="sequences per rollout (prompts x --n)")
    ap.add_argument("--n", type=int, default=8, help="samples per prompt")
    ap.add_argument("--num-rollout", type=int, default=8, help="rollouts per run")
    ap.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2, 4])
    ap.add_argument("--partial-rollout", action="store_true")
    ap.add_argument("--kv-fraction", type=float, default=0.85, help="engine.kv_cache_memory_fraction (own GPU)")
    ap.add_argument("--tokenizer", type=Path, required=True, help="a folder with SmolLM2's tokenizer files")
    ap.add_argument("--output-dir", type=Path, required=True)
    ap.add_argument("overrides", nargs="*", help="key=value overrides for every run")
    args = ap.parse_intermixed_args(argv)  # key=value overrides may come between the options
    args.output_dir.mkdir(parents=True, exist_ok=True)
    model, prompts = args.output_dir / "model", args.output_dir / "prompts.jsonl"
    if not (model / "config.json").exists():
        build_model(model, args.arch, args.tokenizer, max(32768, args.length + 1024), args.tiny)
    write_prompts(prompts, 2048)
    config = args.output_dir / "config.yaml"
    config.write_text(f"model:\n  path: {model}\n")
    overrides = [
        "cluster.mode=ray",
        "cluster.colocate=false",
        "cluster.actor_num_gpus_per_node=1",
        "cluster.rollout_num_gpus=1",
        "model.gradient_checkpointing=true",
        f"data.prompt_data={prompts}",
        "data.n_eval_prompts=0",
        "data.apply_chat_template=true",
        f"rollout.rollout_batch_size={args.seqs // args.n}",
        f"rollout.n_samples_per_prompt={args.n}",
        f"rollout.rollout_max_response_len={args.length}",
        f"engine.max_num_seqs={args.seqs}",
        f"engine.kv_cache_memory_fraction={args.kv_fraction}",
        "reward.type=custom",
        "reward.function_path=grpo_long:random_reward",
        "train.packing=sequences",
        f"train.max_tokens_per_gpu={max(16384, args.length + 256)}",
        "train.lr=1e-6",
        "train.num_steps_per_rollout=1",
        *args.overrides,
    ]
    argv2 = [
        "--config",
        str(config),
        "--num-rollout",
        str(args.num_rollout),
        "--staleness",
        *map(str, args.staleness),
        "--output-dir",
        str(args.output_dir / "runs"),
    ]
    if args.partial_rollout:
        argv2.append("--partial-rollout")
    return async_vs_sync.main(argv2 + overrides)


if __name__ == "__main__":
    main()
