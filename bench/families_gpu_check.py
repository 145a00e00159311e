"""The 2026 families on a GPU, correctness first: a tiny random model of each published config (reinforge's
``check-model --random-tiny`` maker: width 64, sliding windows of at most 8 tokens, 8 experts) run on CUDA,
native trainer against transformers and the embedded engine (CUDA graphs, Triton / fla kernels) against the
trainer, in fp32 and bf16. The bf16 full-width benches (``bench/*_gpu.py``) report a mismatch; this table says
whether it is the kernels' or only bf16's.

    PYTHONPATH=. python bench/families_gpu_check.py [--families gpt_oss gemma3 ...] [--prompt 40] [--new 24]

Columns: ``logits_vs_hf`` max |logit diff| native vs transformers (same dtype, same GPU); ``engine_vs_trainer``
mean and max |log-prob diff| of the engine's sampled tokens against the trainer's forward of the same text (the
prompt longer than the windows, so the ring caches wrap); ``replayed_*`` the same with the engine's experts replayed
in the trainer (mixture-of-experts families): a difference that replay removes is routing near ties, not kernels.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from gemma3_gpu import GEMMA3_12B  # noqa: E402
from gpt_oss_gpu import GPT_OSS_20B  # noqa: E402
from hybrid_gpu import QWEN3_5_9B  # noqa: E402
from mla_gpu import MOONLIGHT  # noqa: E402

CONFIGS = {"qwen3_5": QWEN3_5_9B, "deepseek_v3": MOONLIGHT, "gemma3": GEMMA3_12B, "gpt_oss": GPT_OSS_20B}


def check(folder: Path, dtype: torch.dtype, prompt: int, new: int, dev: torch.device, seqs: int = 4) -> dict:
    from transformers import AutoModelForCausalLM

    from reinforge.config import EngineConfig
    from reinforge.engine import EmbeddedEngine
    from reinforge.models.loading import build_model, model_logits
    from reinforge.records import GenerateRequest, SamplingParams

    native = build_model(folder, dtype, dev).eval()
    vocab = native.args.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, vocab, (prompt + 3 * i,), generator=g).tolist() for i in range(seqs)]
    ids = torch.tensor([prompts[0]], device=dev)
    ref = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype).to(dev).eval()
    with torch.no_grad():
        hf_diff = (model_logits(native, ids).float() - ref(input_ids=ids, use_cache=False).logits.float()).abs().max()
    del ref
    moe = list(native.args.moe_layers or ())
    engine = EmbeddedEngine(
        native, EngineConfig(max_num_seqs=seqs), max_model_len=prompt + 3 * seqs + new + 8, record_routes=bool(moe)
    )
    params = SamplingParams(max_new_tokens=new, temperature=1.0, ignore_eos=True)
    results = engine.generate([GenerateRequest(p, params) for p in prompts])
    engine.shutdown()
    diffs, replayed = [], []
    with torch.no_grad():
        for p, (r,) in zip(prompts, results):
            toks = torch.tensor([p + list(r.token_ids)], device=dev)
            target = torch.tensor(r.token_ids, device=dev)[:, None]
            engine_lp = torch.tensor(r.log_probs)
            logits = model_logits(native, toks)[0, len(p) - 1 : -1].float()
            diffs.append((torch.log_softmax(logits, -1).gather(-1, target)[:, 0].cpu() - engine_lp).abs())
            if moe:  # the trainer with the engine's experts (rollout routing replay): what is left is not routing
                logits = native(toks, routing=replay_of(r.routed_experts, len(p), toks.shape[1], moe))[0]
                logits = logits[len(p) - 1 : -1].float()
                replayed.append((torch.log_softmax(logits, -1).gather(-1, target)[:, 0].cpu() - engine_lp).abs())
    d = torch.cat(diffs)
    row = dict(
        dtype=str(dtype).removeprefix("torch."),
        logits_vs_hf=float(hf_diff),
        engine_vs_trainer_mean=float(d.mean()),
        engine_vs_trainer_max=float(d.max()),
    )
    if replayed:
        row.update(replayed_mean=float(torch.cat(replayed).mean()), replayed_max=float(torch.cat(replayed).max()))
    return row


def replay_of(routes: torch.Tensor, prompt: int, total: int, moe_layers: list[int]):
    """``Routing(replay=...)`` for one sequence of ``total`` tokens: the engine's experts ``routes``
    [response, layers, k] at the positions that predicted each response token, -1 (the router decides) elsewhere."""
    from reinforge.models.moe import Routing

    replay = {}
    for i, layer in enumerate(moe_layers):
        ids = torch.full((total, routes.shape[-1]), -1, dtype=torch.long)
        ids[prompt - 1 : prompt - 1 + routes.shape[0]] = routes[:, i].long()
        replay[layer] = ids
    return Routing(replay=replay)


def main() -> None:
    from reinforge.check_model import write_tiny_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", nargs="+", default=sorted(CONFIGS), choices=sorted(CONFIGS))
    ap.add_argument("--prompt", type=int, default=40)
    ap.add_argument("--new", type=int, default=24)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of the script")
    ap.add_argument(
        "--torch-rule",
        action="store_true",
        help="prefill and trainer through the torch chunked gated delta rule, not fla's chunk kernel (whose "
        "fp32 dots run in TF32): whether the hybrid's fp32 engine-vs-trainer gap is that kernel's precision",
    )
    args = ap.parse_args()
    if args.torch_rule:
        import reinforge.models.linear_attention as la

        la._fla = lambda: None
    dev = torch.device(args.device)
    print(torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch", torch.__version__, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.families:
            src = Path(tmp) / f"{name}.json"
            src.write_text(json.dumps(CONFIGS[name]))
            folder = write_tiny_model(src, Path(tmp) / name)
            for dtype in (torch.float32, torch.bfloat16):
                try:
                    row = check(folder, dtype, args.prompt, args.new, dev)
                except Exception as e:  # noqa: BLE001 (a table row per family, whatever breaks)
                    row = dict(dtype=str(dtype), error=f"{type(e).__name__}: {str(e)[:300]}")
                print(json.dumps(dict(family=name, **row)), flush=True)


if __name__ == "__main__":
    main()
