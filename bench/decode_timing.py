"""Steady-state decode speed of the embedded engine, shared by the model families' GPU benches.

Timing the difference of two ``generate`` calls (N and 1 new tokens) leaves the prefill in both and mixes in
whatever differs between them (prefix-cache hits, graph captures, admission); this times decode steps alone.
"""

from __future__ import annotations

import time

import torch


def steady_decode_rate(engine, prompts: list[list[int]], new: int, steps: int) -> float:
    """Generated tokens/s of the steady state: every prompt admitted and prefilled, two steps run (the CUDA
    graphs of this shape captured), then ``steps`` engine steps timed (``new`` must outlast them: each step
    makes up to ``engine.config.sync_interval`` tokens per sequence). The requests are aborted afterwards."""
    from reinforge.records import GenerateRequest, SamplingParams

    params = SamplingParams(max_new_tokens=new, temperature=1.0, ignore_eos=True)
    requests = [GenerateRequest(p, params) for p in prompts]
    for r in requests:
        engine.add_request(r)
    while engine.scheduler.waiting:
        engine.step()
    for _ in range(2):
        engine.step()
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    n0, t0 = int(engine.runner.gen_lens.sum()), time.perf_counter()
    for _ in range(steps):
        engine.step()
    sync()
    n1, t1 = int(engine.runner.gen_lens.sum()), time.perf_counter()
    engine.abort(*[r.request_id for r in requests])
    return (n1 - n0) / (t1 - t0)
