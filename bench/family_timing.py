"""The model families' GPU benches' two timings: steady-state decode of the embedded engine, and the trainer's
forward + backward native against transformers.

Timing the difference of two ``generate`` calls (N and 1 new tokens) leaves the prefill in both and mixes in
whatever differs between them (prefix-cache hits, graph captures, admission); :func:`steady_decode_rate` times
decode steps alone.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch


def steady_decode_rate(engine, prompts: list[list[int]], new: int, steps: int, profile: bool = False) -> float:
    """Generated tokens/s of the steady state: every prompt admitted and prefilled, two steps run (the CUDA
    graphs of this shape captured), then ``steps`` engine steps timed (``new`` must outlast them: each step
    makes up to ``engine.config.sync_interval`` tokens per sequence). The requests are aborted afterwards.
    ``profile``: the timed steps run under torch.profiler and the top 25 CUDA kernels by self time are printed
    (kernels inside CUDA graphs included; the rate is then a little lower than unprofiled)."""
    import contextlib

    from reinforge.records import GenerateRequest, SamplingParams

    params = SamplingParams(max_new_tokens=new, temperature=1.0, ignore_eos=True)
    requests = [GenerateRequest(p, params) for p in prompts]
    for r in requests:
        engine.add_request(r)
    for _ in range(len(requests)):  # prefill steps until every request is admitted (or the cache is full)
        if not engine.scheduler.waiting:
            break
        engine.step()
    running = sum(o is not None for o in engine.scheduler.owner)
    if running < len(requests):
        print(
            f"(only {running} of {len(requests)} sequences fit in the KV cache: the rate is of {running})", flush=True
        )
    for _ in range(2):
        engine.step()
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    prof = contextlib.nullcontext()
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        prof = torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    with prof as p:
        n0, t0 = int(engine.runner.gen_lens.sum()), time.perf_counter()
        for _ in range(steps):
            engine.step()
        sync()
        n1, t1 = int(engine.runner.gen_lens.sum()), time.perf_counter()
    engine.abort(*[r.request_id for r in requests])
    if profile:
        print(f"profile of {steps} steady decode steps, {len(prompts)} sequences, {n1 - n0} tokens, {t1 - t0:.3f} s")
        print(p.key_averages().table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=70))
    return (n1 - n0) / (t1 - t0)


def train_speed(folder: Path, tokens: int, high: int = 100000) -> dict[str, float | str]:
    """Forward + backward tokens/s over one sequence of ``tokens`` random ids in [10, ``high``), bf16 on CUDA, the
    native model against transformers' class of the same folder (random weights both): the median of 3 timed
    repetitions after a warm-up, ``train_tok_s_{native,transformers}`` and their ``train_ratio``. A side that
    cannot be built or run (transformers without the class, a kernel refusing) gives ``train_error_{side}``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from reinforge.models.loading import build_model, model_logits

    dev = torch.device("cuda")
    ids = torch.randint(10, high, (1, tokens), device=dev)
    out: dict[str, float | str] = {}
    for name in ("native", "transformers"):
        model = None
        try:
            if name == "native":
                model = build_model(folder, torch.bfloat16, dev, random_init=True)
            else:
                torch.manual_seed(0)
                cfg = AutoConfig.from_pretrained(folder)
                model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).to(dev)
            model.train()
            times = []
            for i in range(4):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                model_logits(model, ids).float().logsumexp(-1).mean().backward()
                torch.cuda.synchronize()
                if i:
                    times.append(time.perf_counter() - t0)
                model.zero_grad(set_to_none=True)
            out[f"train_tok_s_{name}"] = round(tokens / sorted(times)[1])
        except (RuntimeError, ValueError, KeyError) as e:
            out[f"train_error_{name}"] = f"{type(e).__name__}: {str(e)[:160]}"
        model = None
        torch.cuda.empty_cache()
    native, hf = out.get("train_tok_s_native"), out.get("train_tok_s_transformers")
    if isinstance(native, int) and isinstance(hf, int):
        out["train_ratio"] = round(native / hf, 2)
    return out
