"""The same GRPO work in TRL's GRPOTrainer and in reinforge, in one process; prints the ratio.

Work per optimizer step (defaults = issue #13's measurement): reasoning-gym ``gsm_symbolic``,
``--prompts`` prompts x ``--n`` samples, up to ``--max-new-tokens`` new tokens at temperature 1, the
reasoning-gym scorer as reward (the same function and the same chat prompts in both), GRPO
advantages, one optimizer step per rollout (AdamW, lr 1e-6), no KL term (beta 0), bf16 on CUDA /
fp32 on CPU, SmolLM2-135M-Instruct.

* TRL: ``GRPOTrainer`` with transformers ``generate`` (no vLLM), ``generation_batch_size`` = the
  whole rollout, ``per_device_train_batch_size`` x ``gradient_accumulation_steps`` = the rollout,
  so each optimizer step generates once and trains once.
* reinforge: ``RLLoop.rollout_step`` (generation on the embedded engine, reward, training, weight
  sync), once per ``train.packing`` given in ``--packing``.

Timing: wall time per optimizer step (TRL: ``on_step_begin`` -> ``on_step_end``, which includes
its generation; reinforge: the whole rollout step), median of steps 3 and later.

    python bench/grpo_vs_trl.py                       # on a GPU; needs trl (and datasets)
    python bench/grpo_vs_trl.py --prompts 2 --n 2 --max-new-tokens 16 --steps 3   # a CPU smoke run
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from pathlib import Path

import torch
from trl_timer import step_timer

SYSTEM = "Answer the question. Provide your final answer between <answer> and </answer> tags."


def reinforge_overrides(args, model: Path, out: Path, packing: str) -> list[str]:
    return [
        f"model.path={model}",
        f"data.prompt_data=reasoning_gym:{args.task}",
        f"data.num_prompts={args.num_data}",
        "data.n_eval_prompts=0",
        f"data.system_prompt={SYSTEM}",
        f"rollout.rollout_batch_size={args.prompts}",
        f"rollout.n_samples_per_prompt={args.n}",
        f"rollout.rollout_max_response_len={args.max_new_tokens}",
        f"engine.max_num_seqs={args.prompts * args.n}",
        "reward.type=reasoning_gym",
        "train.lr=1e-6",
        f"train.num_rollout={args.steps}",
        f"train.packing={packing}",
        f"train.max_tokens_per_gpu={args.max_tokens_per_gpu}",
        f"model.torch_compile={str(args.torch_compile).lower()}",
        f"model.fused_kernels={args.fused_kernels}",
        "algo.use_kl_loss=false",
        f"run.output_dir={out}",
        "run.progress=false",
        "run.tensorboard=false",
        "eval.eval_before_train=false",
        "run.save_interval=null",
    ]


def time_reinforge(args, model: Path, out: Path, packing: str) -> tuple[list[float], list[dict[str, float]]]:
    from reinforge.config import load_config
    from reinforge.loop import RLLoop

    loop = RLLoop(load_config(None, reinforge_overrides(args, model, out, packing)))
    times, metrics = [], []
    for step in range(args.steps):
        t = time.perf_counter()
        metrics.append(loop.rollout_step(step)[0])
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    loop.close()
    return times, metrics


def trl_dataset(args, model: Path, out: Path):
    """The prompts reinforge trains on, in TRL's conversational form, with the reasoning-gym entry."""
    from datasets import Dataset

    from reinforge.config import load_config
    from reinforge.data.sources import load_source

    cfg = load_config(None, reinforge_overrides(args, model, out, "none"))
    d = cfg.data
    records = load_source(d.prompt_data, size=d.num_prompts, seed=d.seed, task_kwargs=d.task_kwargs)
    ENTRIES[:] = [r.metadata["reasoning_gym"] for r in records]  # entries hold Fractions: kept here, by index
    return Dataset.from_list(
        [
            {"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": r.prompt}], "entry_index": i}
            for i, r in enumerate(records)
        ]
    )


ENTRIES: list[dict] = []


def trl_reward(prompts, completions, entry_index, **_):
    """reasoning-gym's scorer on the extracted answer: reinforge's ``reasoning_gym`` reward."""
    from reinforge.reward.extract import extract_answer
    from reinforge.reward.functions import _rg_scorer

    out = []
    for c, i in zip(completions, entry_index):
        text = c[0]["content"] if isinstance(c, list) else c
        info = ENTRIES[i]
        out.append(float(_rg_scorer(info["task"])(extract_answer(text, "tag_or_last_number"), info["entry"])))
    return out


def time_trl(args, model: Path, out: Path) -> list[float]:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    times: list[float] = []
    cuda = torch.cuda.is_available()
    rollout = args.prompts * args.n
    micro = min(args.trl_micro_batch, rollout)
    config = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=rollout // micro,
        generation_batch_size=rollout,
        num_generations=args.n,
        max_completion_length=args.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        beta=0.0,
        num_iterations=1,
        learning_rate=1e-6,
        lr_scheduler_type="constant",
        max_steps=args.steps,
        logging_steps=1000,
        save_strategy="no",
        report_to="none",
        bf16=cuda,
        use_cpu=not cuda,
        dataloader_num_workers=0,
        seed=0,
        use_vllm=False,
        log_completions=False,
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32),
        reward_funcs=trl_reward,
        args=config,
        train_dataset=trl_dataset(args, model, out),
        processing_class=AutoTokenizer.from_pretrained(model, padding_side="left"),
        callbacks=[step_timer(times)],
    )
    trainer.train()
    return times


def add_work_args(ap: argparse.ArgumentParser, steps: int) -> None:
    """The work's options, which :func:`reinforge_overrides` reads (``bench/grpo_step_profile.py`` too)."""
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--task", default="gsm_symbolic")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--num-data", type=int, default=2000)


def main() -> None:
    ap = argparse.ArgumentParser()
    add_work_args(ap, steps=6)
    ap.add_argument(
        "--trl-micro-batch",
        type=int,
        nargs="+",
        default=[32],
        help="TRL per_device_train_batch_size (one TRL run each)",
    )
    ap.add_argument(
        "--max-tokens-per-gpu",
        type=int,
        nargs="+",
        default=[16384],
        help="reinforge train.max_tokens_per_gpu (one run per value and packing)",
    )
    ap.add_argument("--torch-compile", action="store_true", help="reinforge model.torch_compile=true")
    ap.add_argument(
        "--fused-kernels",
        nargs="+",
        default=["true"],
        choices=["true", "false"],
        help="reinforge model.fused_kernels values (one run each)",
    )
    ap.add_argument("--packing", nargs="+", default=["none", "sequences"], help="reinforge train.packing values")
    ap.add_argument("--skip-trl", action="store_true")
    args = ap.parse_args()
    from reinforge.models.hub import resolve_model_path

    model = resolve_model_path(args.model)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        for max_tokens, fused, packing in itertools.product(args.max_tokens_per_gpu, args.fused_kernels, args.packing):
            torch.manual_seed(0)
            run = argparse.Namespace(**{**vars(args), "max_tokens_per_gpu": max_tokens, "fused_kernels": fused})
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            try:
                times, metrics = time_reinforge(run, model, d / f"reinforge-{packing}-{max_tokens}-{fused}", packing)
            except torch.OutOfMemoryError as e:  # a micro-batch budget too large for this GPU: the next row
                print(f"reinforge {packing} {max_tokens}: out of memory ({e})", flush=True)
                torch.cuda.empty_cache()
                continue
            gen, train, reward = (
                statistics.median(m.get(f"time/{k}", float("nan")) for m in metrics[2:] or metrics)
                for k in ("generate", "train", "reward")
            )
            name = (
                f"reinforge ({packing}, {max_tokens}{', compiled' if args.torch_compile else ''}"
                f"{', eager kernels' if fused == 'false' else ''})"
            )
            rows.append((name, times, gen, train, reward))
            peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan")
            print(rows[-1], f"peak GiB {peak:.1f}", flush=True)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        for micro in [] if args.skip_trl else args.trl_micro_batch:
            torch.manual_seed(0)
            run = argparse.Namespace(
                **{
                    **vars(args),
                    "trl_micro_batch": micro,  # (its prompts: reinforge's config)
                    "max_tokens_per_gpu": args.max_tokens_per_gpu[0],
                    "fused_kernels": args.fused_kernels[0],
                }
            )
            rows.append(
                (
                    f"TRL GRPOTrainer (micro-batch {micro})",
                    time_trl(run, model, d / f"trl-{micro}"),
                    float("nan"),
                    float("nan"),
                    float("nan"),
                )
            )
            print(rows[-1], flush=True)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU, {torch.get_num_threads()} threads"
    print(
        f"\nGRPO step: {args.task}, {args.prompts} prompts x {args.n} samples, <= {args.max_new_tokens} new tokens, "
        f"{model.name}, {device}"
    )
    print(f"| {'trainer':40s} | median s/step (steps 3+) | generate s | reward s | train s | all steps |")
    print(f"| {'-' * 40} | {'-' * 24}: | {'-' * 10}: | {'-' * 8}: | {'-' * 7}: | --- |")
    for name, times, gen, train, reward in rows:
        med = statistics.median(times[2:] or times)
        steps = " ".join(f"{t:.2f}" for t in times)
        print(f"| {name:40s} | {med:24.3f} | {gen:10.2f} | {reward:8.3f} | {train:7.2f} | {steps} |")
    trl = [(n, statistics.median(t[2:] or t)) for n, t, *_ in rows if n.startswith("TRL")]
    for name, times, *_ in rows:
        for trl_name, trl_s in [] if name.startswith("TRL") else trl:
            print(f"speed-up of {name} over {trl_name}: {trl_s / statistics.median(times[2:] or times):.2f}x")


if __name__ == "__main__":
    main()
