"""Kernel-time breakdown of the engine's decode step at 1024 sequences (GPU; eager, so the profiler
sees each kernel). Random weights of the given architectures (bench/archs.py).

    PYTHONPATH=. python bench/profile_decode.py smollm2,qwen2.5-0.5b
"""

import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, "bench")
from archs import write_random_model
from torch.profiler import ProfilerActivity, profile

from reinforge.config import EngineConfig
from reinforge.engine import EmbeddedEngine
from reinforge.engine.attention import bucket as _bucket
from reinforge.models.loading import build_model
from reinforge.records import GenerateRequest, SamplingParams

dev = torch.device("cuda")
for arch in sys.argv[1].split(","):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "m"
        write_random_model(arch, folder)
        model = build_model(folder, torch.bfloat16, dev).eval()
    g = torch.Generator().manual_seed(0)
    ps = [torch.randint(100, 40000, (96,), generator=g).tolist() for _ in range(128)]
    eng = EmbeddedEngine(
        model, EngineConfig(max_num_seqs=1024, kv_cache_memory_fraction=0.5, cuda_graph=False), max_model_len=96 + 256
    )
    sp = SamplingParams(max_new_tokens=256, temperature=1.0, ignore_eos=True)
    for p in ps:
        eng.add_request(GenerateRequest(p, sp, n=8))
    for _ in range(12):  # to ~96 + 96 context
        eng.step()
    torch.cuda.synchronize()
    sched = eng.scheduler
    running = sched.occupied()
    B = _bucket(max(running) + 1, eng.num_slots)
    # the key range the engine's step would use for 8 more tokens (engine.py's decode loop)
    Lk = eng.runner.Decode.key_range(max(sched.len_bound[s] for s in running) + 8, sched.layout)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(8):
            eng.runner.decode(B, Lk, False)
        torch.cuda.synchronize()
    print(arch, "B", B)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=22, max_name_column_width=70))
