"""Where a GRPO training step's time goes (GPU): 32 prompts x 8 samples of SmolLM2 (random weights),
100-token prompts shared by each group of 8, responses spread over [32, 256] (the work of
``bench/grpo_vs_trl.py``); prints the step times, the number of kernel launches, the CPU and GPU
time of each phase of the step (micro-batch building, forward, log-probs, backward, optimizer) and
the profiler's tables by GPU and by CPU time.

    PYTHONPATH=. python bench/profile_train.py [--packing shared_prompt] [--prompt-len 100] [--compile]
        [--overrides k=v ...]
"""

import argparse
import functools
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, "bench")
import long_responses as lr  # noqa: E402
from archs import write_random_model  # noqa: E402

import reinforge.train.actor as actor_mod  # noqa: E402
import reinforge.train.step as step_mod  # noqa: E402
from reinforge.train.model_trainer import ModelTrainer  # noqa: E402

PHASES = ("micro_batches", "forward", "log_probs", "backward", "optimizer_step")


def labelled(name, fn):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        with record_function(name):
            return fn(*a, **k)

    return wrapper


def label_phases() -> None:
    ModelTrainer.micro_batches = labelled("micro_batches", ModelTrainer.micro_batches)
    ModelTrainer.optimizer_step = labelled("optimizer_step", ModelTrainer.optimizer_step)
    step_mod.response_outputs = labelled("forward", step_mod.response_outputs)
    actor_mod.token_log_probs = labelled("log_probs", actor_mod.token_log_probs)
    torch.Tensor.backward = labelled("backward", torch.Tensor.backward)


def grouped_rollout(prompts: int, n: int, prompt_len: int, max_len: int, vocab: int):
    """``prompts`` groups of ``n`` scored samples (random rewards); the samples of a prompt share its tokens;
    lengths spread over [max/8, max]."""
    from reinforge.records import Sample

    g = torch.Generator().manual_seed(0)
    lengths = lr.spread(prompts * n, max_len)
    groups = []
    for p in range(prompts):
        samples = []
        prompt = torch.randint(10, vocab - 10, (prompt_len,), generator=g).tolist()
        for j in range(n):
            R = lengths[(p * n + j) * 7919 % len(lengths)]
            tokens = prompt + torch.randint(10, vocab - 10, (R,), generator=g).tolist()
            samples.append(
                Sample(
                    prompt=f"p{p}",
                    tokens=tokens,
                    response_length=R,
                    loss_mask=[1] * R,
                    rollout_log_probs=[-1.0] * R,
                    group_index=p,
                    reward=float(torch.randn(1, generator=g)),
                )
            )
        groups.append(samples)
    return groups


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--packing", default="shared_prompt")
    ap.add_argument("--max-tokens", type=int, default=16384)
    ap.add_argument("--compile", action="store_true", help="model.torch_compile=true")
    ap.add_argument("--steps", type=int, default=3, help="untimed warm-up steps before the timed ones")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompts", type=int, default=32, help="prompts of 8 samples each")
    ap.add_argument("--prompt-len", type=int, default=100, help="prompt tokens (shared by the 8 samples of a prompt)")
    ap.add_argument("--overrides", nargs="*", default=[], help="extra config overrides key=value")
    args = ap.parse_args()
    dev = torch.device(args.device)
    label_phases()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "m"
        write_random_model("smollm2", folder)
        over = {
            "train.packing": args.packing,
            "model.gradient_checkpointing": "false",
            "model.torch_compile": str(args.compile).lower(),
        }
        over.update(kv.split("=", 1) for kv in args.overrides)
        w = lr.worker(folder, dev, args, **over)
        from reinforge.train.rollout_share import RolloutBatch

        groups = grouped_rollout(args.prompts, 8, args.prompt_len, 256, 49152)
        samples = [s for g in groups for s in g]
        times = []
        for i in range(args.steps + 3):
            lr.sync(dev)
            t = time.perf_counter()
            w.score(RolloutBatch(groups, i))
            w.train(i)
            lr.sync(dev)
            times.append(time.perf_counter() - t)
        print(
            f"{args.packing}{' compiled' if args.compile else ''}: step s",
            " ".join(f"{x:.3f}" for x in times),
            f"median of last 3 {sorted(times[-3:])[1]:.3f}",
            flush=True,
        )
        mbs, _ = w.actor.rank_micro_batches(samples, list(range(len(samples))))
        print("micro-batches", len(mbs), "shapes", [tuple(mb.input_ids.shape) for mb in mbs])
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            t = time.perf_counter()
            w.score(RolloutBatch(groups, 99))
            w.train(99)
            lr.sync(dev)
            print("profiled step s", round(time.perf_counter() - t, 3))
        ev = p.key_averages()
        launches = sum(e.count for e in ev if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"))
        gpu = sum(e.self_device_time_total for e in ev) / 1e6
        print(f"kernel launches {launches}, GPU kernel time {gpu:.3f} s")
        print("| phase | calls | CPU s | GPU s |\n| --- | ---: | ---: | ---: |")
        for e in ev:
            if e.key in PHASES:
                print(f"| {e.key} | {e.count} | {e.cpu_time_total / 1e6:.3f} | {e.device_time_total / 1e6:.3f} |")
        print(ev.table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=60))
        print(ev.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))


if __name__ == "__main__":
    main()
