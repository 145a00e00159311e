"""The train-vs-rollout log-prob difference of a mixture-of-experts model with and without rollout
routing replay (issue 25), one GPU, bf16.

The engine (bf16 weights, CUDA graphs) samples ``--seqs`` responses of ``--new-tokens`` tokens from
random prompts at temperature 1, recording each response token's experts. The trainer's copy (fp32
parameters under bf16 autocast, as reinforge trains) then recomputes the log-probs of those tokens
three ways: its own routing; the engine's routes replayed (``Routing.replay``: the recorded experts
at the positions that predict response tokens, the router elsewhere); and, as the floor, the dense
model of the same active size without routing. Random weights at two initialisation scales
(``initializer_range``): at transformers' 0.02 a random 24-layer network amplifies rounding
differences layer after layer (its log-probs differ by ~0.6 nats between bf16 and fp32 even for
the dense model), so the smaller scale is the one that resembles a trained model's stability.

    PYTHONPATH=.:bench python bench/routing_replay.py [--arch qwen3-moe-2.6b-a0.5b] [--init 0.02 0.005]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from archs import write_random_model

from reinforge.algo.mismatch import mismatch_stats
from reinforge.config import EngineConfig
from reinforge.engine import EmbeddedEngine
from reinforge.models.loading import build_model
from reinforge.models.moe import Routing
from reinforge.records import GenerateRequest, SamplingParams

DEVICE = "cuda"


def generate(folder: Path, seqs: int, new_tokens: int, record: bool):
    model = build_model(folder, torch.bfloat16, torch.device(DEVICE))
    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(0, model.args.vocab_size, (int(n),), generator=g).tolist()
        for n in torch.randint(32, 97, (seqs,), generator=g)
    ]
    eng = EmbeddedEngine(
        model,
        EngineConfig(max_num_seqs=seqs, kv_cache_memory_fraction=0.3),
        max_model_len=128 + new_tokens,
        record_routes=record,
    )
    sp = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True)
    results = [r for (r,) in eng.generate([GenerateRequest(p, sp) for p in prompts])]
    eng.shutdown()
    del model, eng
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return prompts, results


@torch.no_grad()
def recompute(folder: Path, prompts, results, replay: bool) -> torch.Tensor:
    """Trainer log-prob minus engine log-prob of every response token, [total tokens] fp32."""
    model = build_model(folder, torch.float32, torch.device(DEVICE)).eval()
    diffs = []
    for p, r in zip(prompts, results):
        ids = torch.tensor([p + r.token_ids], device=DEVICE)
        P, n = len(p), len(r.token_ids)
        routing = None
        if replay:
            table = {}
            for j, layer in enumerate(model.args.moe_layers):
                t = torch.full((P + n, model.args.num_experts_per_tok), -1, dtype=torch.long, device=DEVICE)
                t[P - 1 : P - 1 + n] = r.routed_experts[:, j].to(DEVICE, torch.long)
                table[layer] = t
            routing = Routing(replay=table)
        with torch.autocast(DEVICE, torch.bfloat16):
            logits = model(ids, routing=routing)[0, P - 1 : P - 1 + n].float()
        lp = logits.log_softmax(-1).gather(1, ids[0, P : P + n, None])[:, 0].cpu()
        diffs.append(lp - torch.tensor(r.log_probs))
    del model
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return torch.cat(diffs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="qwen3-moe-2.6b-a0.5b")
    ap.add_argument("--dense", default="qwen3-dense-0.5b")
    ap.add_argument("--init", type=float, nargs="+", default=[0.02, 0.005])
    ap.add_argument("--seqs", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=512)
    ap.add_argument("--layers", type=int, default=0, help="override num_hidden_layers (a CPU smoke run: 2)")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    shrink = {"num_hidden_layers": args.layers, "vocab_size": 4096} if args.layers else {}
    keys = (
        "logprob_abs_diff_p50",
        "logprob_abs_diff_p99",
        "logprob_abs_diff_max",
        "importance_weight_min",
        "importance_weight_max",
    )
    print(
        f"{torch.cuda.get_device_name() if DEVICE == 'cuda' else 'CPU'}, torch {torch.__version__}; "
        f"{args.seqs} x {args.new_tokens} tokens; "
        "bf16 engine vs fp32 trainer under bf16 autocast"
    )
    print("| initializer_range | model | routing in the trainer | mean abs diff | " + " | ".join(keys) + " |")
    print("| ---: | --- | --- | ---: |" + " ---: |" * len(keys))
    with tempfile.TemporaryDirectory() as tmp:
        for std in args.init:
            for arch, modes in ((args.arch, (False, True)), (args.dense, (False,))):
                folder = Path(tmp) / f"{arch}-{std}"
                write_random_model(arch, folder, initializer_range=std, **shrink)
                prompts, results = generate(folder, args.seqs, args.new_tokens, record=arch == args.arch)
                for replay in modes:
                    d = recompute(folder, prompts, results, replay)
                    s = mismatch_stats(d)
                    how = "-" if arch == args.dense else ("engine's routes replayed" if replay else "its own router")
                    print(
                        f"| {std} | {arch} | {how} | {d.abs().mean():.4f} | "
                        + " | ".join(f"{s[k]:.4g}" for k in keys)
                        + " |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
