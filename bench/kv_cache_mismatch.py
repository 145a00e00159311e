"""What an fp8 KV cache does to the engine's log-probs on a trained model: the trainer-vs-engine
difference (``|log p_trainer - log p_engine|`` per response token, the trainer in fp32) for each
``engine.kv_cache_dtype``, on SmolLM2-135M-Instruct (real weights) and real prompts (reasoning-gym's
``basic_arithmetic`` in the chat template), sampled at temperature 1.

Columns: engine dtype, KV cache dtype, mean / p50 / p90 / p99 / max of the difference, and the mean
importance weight ``exp(trainer - engine)`` (what ``algo.use_tis`` corrects; 1 is on-policy).

    PYTHONPATH=. python bench/kv_cache_mismatch.py                      # CPU: fp32 engine, ~2 min
    PYTHONPATH=. python bench/kv_cache_mismatch.py --device cuda --engine-dtypes bf16 fp32
"""

from __future__ import annotations

import argparse

import torch


def prompts(tok, n: int) -> list[list[int]]:
    import reasoning_gym

    data = reasoning_gym.create_dataset("basic_arithmetic", size=n, seed=0)
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": d["question"]}], add_generation_prompt=True, tokenize=False
        )
        for d in data
    ]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=4, help="samples per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--engine-dtypes", nargs="+", default=["fp32"], choices=["fp32", "bf16"])
    ap.add_argument("--kv-cache-dtypes", nargs="+", default=["auto", "fp8", "fp8_e5m2"])
    args = ap.parse_args()
    from reinforge.config import EngineConfig
    from reinforge.engine import EmbeddedEngine
    from reinforge.models.hub import resolve_model_path
    from reinforge.models.loading import build_model, load_tokenizer
    from reinforge.records import GenerateRequest, SamplingParams

    device = torch.device(args.device)
    path = resolve_model_path("smollm2-135m-instruct")
    tok = load_tokenizer(path)
    ps = prompts(tok, args.prompts)
    trainer = build_model(path, torch.float32, device).eval()
    sp = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, stop_token_ids=[tok.eos_token_id])
    rows = []
    for edt in args.engine_dtypes:
        model = build_model(path, torch.bfloat16 if edt == "bf16" else torch.float32, device)
        for kvd in args.kv_cache_dtypes:
            eng = EmbeddedEngine(
                model,
                EngineConfig(max_num_seqs=args.prompts * args.n, kv_cache_dtype=kvd),
                max_model_len=max(map(len, ps)) + args.max_new_tokens,
                tokenizer=tok,
                seed=0,
            )
            diffs = []
            for p, group in zip(ps, eng.generate([GenerateRequest(p, sp, n=args.n) for p in ps])):
                for r in group:
                    ids = torch.tensor([p + r.token_ids], device=device)
                    with torch.no_grad():
                        lp = torch.log_softmax(trainer(ids)[0, len(p) - 1 : -1].float(), -1)
                    ref = lp.gather(-1, ids[0, len(p) :, None])[:, 0].cpu()
                    diffs.append(ref - torch.tensor(r.log_probs))
            d = torch.cat(diffs)
            a = d.abs()
            q = torch.quantile(a, torch.tensor([0.5, 0.9, 0.99]))
            rows.append((edt, kvd, len(a), a.mean().item(), *q.tolist(), a.max().item(), d.exp().mean().item()))
            eng.shutdown()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"\n{name}, torch {torch.__version__}; SmolLM2-135M-Instruct, {args.prompts} prompts x {args.n} samples, "
        f"<= {args.max_new_tokens} tokens, temperature 1"
    )
    print("| engine dtype | KV cache | tokens | mean abs diff | p50 | p90 | p99 | max | mean importance weight |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for edt, kvd, n, mean, p50, p90, p99, mx, iw in rows:
        print(f"| {edt} | {kvd} | {n:,} | {mean:.4f} | {p50:.4f} | {p90:.4f} | {p99:.4f} | {mx:.3f} | {iw:.4f} |")


if __name__ == "__main__":
    main()
