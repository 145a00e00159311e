"""The same DPO step in TRL's DPOTrainer and in reinforge, in one process; prints the ratio.

Same model (SmolLM2-135M-Instruct, or --model), same pairs (conversational, written here from a
seed), same batch (--batch pairs per optimizer step, no gradient accumulation), same max length,
same optimizer settings (AdamW, lr 1e-6), sigmoid DPO with beta 0.1, the reference model run on
every step in both (no precomputed reference log-probs), fp32 on CPU / bf16 on CUDA.

    python bench/dpo_vs_trl.py --steps 8            # needs `pip install trl`

Timing: wall time of each optimizer step (TRL: on_step_begin -> on_step_end; reinforge: the
trainer's step), median of steps 3 and later.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
from trl_timer import step_timer


def write_pairs(path: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    words = "the answer is that we add both numbers and then check the result carefully once more".split()
    with path.open("w") as f:
        for _ in range(n):
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            filler = " ".join(rng.choice(words) for _ in range(rng.randint(30, 50)))
            f.write(
                json.dumps(
                    {
                        "prompt": [{"role": "user", "content": f"What is {a} + {b}? Think about it and answer."}],
                        "chosen": [{"role": "assistant", "content": f"{filler}. <answer>{a + b}</answer>"}],
                        "rejected": [
                            {"role": "assistant", "content": f"{filler}. <answer>{a + b + rng.randint(1, 9)}</answer>"}
                        ],
                    }
                )
                + "\n"
            )


def time_trl(model_path: Path, data: Path, batch: int, steps: int, max_length: int, out: Path) -> list[float]:
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    times: list[float] = []
    cuda = torch.cuda.is_available()
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_path)
    args = DPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        max_steps=steps,
        learning_rate=1e-6,
        beta=0.1,
        loss_type="sigmoid",
        max_length=max_length,
        precompute_ref_log_probs=False,
        logging_steps=1000,
        save_strategy="no",
        report_to="none",
        bf16=cuda,
        use_cpu=not cuda,
        dataloader_num_workers=0,
        seed=0,
        lr_scheduler_type="constant",
    )
    ds = load_dataset("json", data_files=str(data), split="train")
    DPOTrainer(model=model, args=args, train_dataset=ds, processing_class=tok, callbacks=[step_timer(times)]).train()
    return times


def time_reinforge(model_path: Path, data: Path, batch: int, steps: int, max_length: int, out: Path) -> list[float]:
    from reinforge.config import load_config
    from reinforge.offline_loop import OfflineLoop

    cfg = load_config(
        None,
        [
            f"model.path={model_path}",
            "offline.method=dpo",
            f"offline.train_data={data}",
            f"offline.global_batch_size={batch}",
            f"offline.max_length={max_length}",
            "offline.beta=0.1",
            "offline.precompute_ref_log_probs=false",
            "offline.shuffle=false",
            "train.lr=1e-6",
            f"run.output_dir={out}",
            "run.progress=false",
            "run.tensorboard=false",
            f"train.max_tokens_per_gpu={2 * batch * max_length}",
        ],
    )
    loop = OfflineLoop(cfg)
    times = []
    for step in range(steps):
        t = time.perf_counter()
        loop.trainer.step(loop.train_set.examples, loop.step_ids(step), loop.ref)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    loop.close()
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-length", type=int, default=256)
    args = ap.parse_args()
    from reinforge.models.hub import resolve_model_path

    model = resolve_model_path(args.model)
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        data = d / "pairs.jsonl"
        write_pairs(data, args.batch * args.steps)
        torch.manual_seed(0)
        ours = time_reinforge(model, data, args.batch, args.steps, args.max_length, d / "reinforge")
        torch.manual_seed(0)
        trl = time_trl(model, data, args.batch, args.steps, args.max_length, d / "trl")
    m_ours, m_trl = statistics.median(ours[2:]), statistics.median(trl[2:])
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU, {torch.get_num_threads()} threads"
    print(f"\nDPO step, {args.batch} pairs, max_length {args.max_length}, {model.name}, {device}")
    print("trainer    | median s/step (steps 3+) | all steps")
    print(f"TRL        | {m_trl:24.3f} | {' '.join(f'{t:.2f}' for t in trl)}")
    print(f"reinforge  | {m_ours:24.3f} | {' '.join(f'{t:.2f}' for t in ours)}")
    print(f"speed-up (TRL / reinforge): {m_trl / m_ours:.2f}x")


if __name__ == "__main__":
    main()
