"""Where a GRPO training step's time goes (GPU): 256 samples of SmolLM2 (random weights), 100-token
prompts, responses spread over [32, 256], `train.packing: shared_prompt`; prints the step time and
the profiler's tables by GPU and by CPU time.

    PYTHONPATH=. python bench/profile_train.py
"""
import sys, tempfile, time, torch
from pathlib import Path
sys.path.insert(0, "bench")
from archs import write_random_model
import long_responses as lr
from torch.profiler import profile, ProfilerActivity
class A: pass
args = A(); args.max_tokens = 16384; args.prompt_len = 100
dev = torch.device("cuda")
with tempfile.TemporaryDirectory() as tmp:
    folder = Path(tmp) / "m"
    write_random_model("smollm2", folder)
    for packing in ("shared_prompt",):
        w = lr.worker(folder, dev, args, **{"train.packing": packing, "model.gradient_checkpointing": "false"})
        data = lr.rollout(lr.spread(256, 256), 100, 49152)
        for i in range(2):
            torch.cuda.synchronize(); t = time.perf_counter(); w.train_actor(data, i); torch.cuda.synchronize()
            print(packing, "step s", time.perf_counter() - t, flush=True)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            t = time.perf_counter(); w.train_actor(data, 2); torch.cuda.synchronize(); print(packing, "profiled", time.perf_counter() - t)
        print(p.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=50))
        print(p.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=50))
