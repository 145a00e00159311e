"""FP8 rollout weights (``engine.quantization=fp8``, issue 36 item 5): the embedded engine's decode speed with
and without them, and what they do to the engine's log-probs (the trainer-vs-engine mismatch).

**Decode table**: random weights of each ``--archs`` shape (bench/archs.py), ``--seqs`` sequences of
``--prompt-len`` random tokens each generating exactly ``--new-tokens`` tokens (``ignore_eos``), the engine in
``--engine-dtype`` with ``engine.quantization`` null and fp8 (same process, same GPU). Each shape runs twice,
the second is timed (its CUDA graphs were captured by the first); the prefill is timed apart. Columns:
decode tokens/s and the step time; the weight bytes one decode step reads (every parameter except an untied
embedding, whose rows are gathered; fp8 layers with their scales); the **weights-read limit** (the tokens/s
if a step did nothing but read those bytes once at the GPU's HBM bandwidth: seqs x bandwidth / bytes); the
weights + KV limit (plus the keys and values cached at the mean context of the timed steps) and the share
of it reached.

**Mismatch table**: mean and p99 of ``|log p_trainer - log p_engine|`` per generated token (the trainer in
fp32 holding the engine's own weights before quantization; sampling at temperature 1), engine without and
with fp8 weights: random weights of the first arch (random prompts), and with ``--real PATH`` a real Hugging
Face folder (reasoning-gym ``basic_arithmetic`` prompts in its chat template when it has a tokenizer).

    PYTHONPATH=.:bench python bench/fp8_weights.py                                 # GPU (H100 / H200)
    PYTHONPATH=.:bench python bench/fp8_weights.py --real ~/.cache/reinforge/models/smollm2-135m-instruct
    PYTHONPATH=.:bench python bench/fp8_weights.py --device cpu --tiny --archs smollm2 --seqs 2 4 \\
        --prompt-len 8 --new-tokens 6 --mismatch-prompts 2                        # CPU, tiny shape (tests)
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from pathlib import Path

import torch
from archs import ARCHS, hf_config, tiny_overrides

QUANTIZATIONS = (None, "fp8")  # engine.quantization: null, fp8


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_model(arch: str, tiny: bool, dtype: torch.dtype, device: torch.device, max_len: int):
    """reinforge's model of ``arch`` with random weights (the family's init, seed 0) in ``dtype``."""
    from reinforge.models.loading import build_model

    with tempfile.TemporaryDirectory() as d:
        hf_config(arch, **(tiny_overrides(arch) if tiny else {})).save_pretrained(d)
        return build_model(d, dtype, device, random_init=True, max_positions=max(max_len, 1024))


def step_bytes(model) -> tuple[int, int]:
    """(weight bytes one decode step reads, KV bytes per cached token) of an engine's model."""
    from reinforge.engine.fp8 import fp8_summary

    total = sum(p.numel() * p.element_size() for p in model.parameters())  # a tied LM head counted once
    if not model.args.tie_word_embeddings:
        emb = model.model.embed_tokens.weight
        total -= emb.numel() * emb.element_size()  # only the batch's rows are read
    total += fp8_summary(model).get("bytes", 0)
    a = model.args
    return total, 2 * a.num_layers * a.num_kv_heads * a.head_dim * model.model.embed_tokens.weight.element_size()


def engine_for(model, seqs: int, max_len: int, quantization: str | None, device: torch.device):
    from reinforge.config import EngineConfig
    from reinforge.engine import EmbeddedEngine

    cfg = EngineConfig(
        max_num_seqs=seqs, kv_cache_memory_fraction=0.5, cuda_graph=device.type == "cuda", quantization=quantization
    )
    return EmbeddedEngine(model, cfg, max_model_len=max_len, seed=0)


def time_decode(eng, seqs: int, args, vocab: int, device: torch.device) -> dict[str, float]:
    """Generate ``seqs`` x ``new_tokens`` twice (the first captures the graphs); time the second's prefill
    and decode steps."""
    from reinforge.records import GenerateRequest, SamplingParams

    g = torch.Generator().manual_seed(seqs)
    prompts = [torch.randint(100, vocab - 100, (args.prompt_len,), generator=g).tolist() for _ in range(seqs)]
    sp = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, ignore_eos=True)
    eng.generate([GenerateRequest(p, sp) for p in prompts])
    sync(device)
    groups = [eng.add_request(GenerateRequest(p, sp)) for p in prompts]
    t = time.perf_counter()
    while eng.scheduler.waiting and eng.scheduler.free:
        eng._admit()
    sync(device)
    prefill_s = time.perf_counter() - t
    t = time.perf_counter()
    while eng.has_unfinished():
        eng.step()
    sync(device)
    decode_s = time.perf_counter() - t
    new = sum(len(r.token_ids) for gr in groups for r in gr.results) - seqs  # the first token came from the prefill
    return {
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "tok_s": new / decode_s,
        "step_ms": 1e3 * decode_s / (args.new_tokens - 1),
    }


def decode_rows(arch: str, args, device: torch.device, dtype: torch.dtype, bandwidth: float | None) -> list[tuple]:
    max_len = args.prompt_len + args.new_tokens
    rows = []
    for q in QUANTIZATIONS:
        model = random_model(arch, args.tiny, dtype, device, max_len)  # the same weights each time (seed 0)
        eng = engine_for(model, max(args.seqs), max_len, q, device)
        weights, kv_token = step_bytes(model)
        kernel = getattr(eng.fp8, "kernel", "-")
        for seqs in args.seqs:
            r = time_decode(eng, seqs, args, model.args.vocab_size, device)
            kv = seqs * (args.prompt_len + args.new_tokens / 2) * kv_token
            lim_w = seqs * bandwidth / weights if bandwidth else None
            lim_wkv = seqs * bandwidth / (weights + kv) if bandwidth else None
            label = str(dtype).removeprefix("torch.") if q is None else f"fp8 ({kernel})"
            rows.append((arch, seqs, label, r, weights, lim_w, lim_wkv))
        eng.shutdown()
        del eng, model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def prompts_for(folder: Path | None, n: int, length: int, vocab: int) -> list[list[int]]:
    if folder is not None and (folder / "tokenizer.json").exists():
        from kv_cache_mismatch import prompts

        from reinforge.models.loading import load_tokenizer

        return prompts(load_tokenizer(folder), n)
    g = torch.Generator().manual_seed(1)
    return [torch.randint(100, vocab - 100, (length,), generator=g).tolist() for _ in range(n)]


@torch.no_grad()
def mismatch(base, trainer, ps: list[list[int]], args, device: torch.device, quantization: str | None) -> torch.Tensor:
    """|trainer - engine| log-prob of every generated token, the engine built on ``base`` (quantized in place)."""
    from reinforge.records import GenerateRequest, SamplingParams

    eng = engine_for(base, len(ps) * args.samples, max(map(len, ps)) + args.new_tokens, quantization, device)
    sp = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, ignore_eos=True)
    diffs = []
    for p, group in zip(ps, eng.generate([GenerateRequest(p, sp, n=args.samples) for p in ps])):
        for r in group:
            ids = torch.tensor([p + r.token_ids], device=device)
            lp = torch.log_softmax(trainer(ids)[0, len(p) - 1 : -1].float(), -1)
            ref = lp.gather(-1, ids[0, len(p) :, None])[:, 0].cpu()
            diffs.append((ref - torch.tensor(r.log_probs)).abs())
    eng.shutdown()
    return torch.cat(diffs)


def mismatch_rows(label: str, load, ps, args, device, dtype) -> list[tuple]:
    """``load(dtype)`` builds the model; the trainer is its fp32 copy, each engine gets its own copy."""
    base = load(dtype)
    trainer = copy.deepcopy(base).float().eval()
    rows = []
    for q in QUANTIZATIONS:
        d = mismatch(copy.deepcopy(base) if q is None else base, trainer, ps, args, device, q)
        name = str(dtype).removeprefix("torch.") if q is None else "fp8"
        rows.append((label, name, len(d), d.mean().item(), torch.quantile(d, 0.99).item(), d.max().item()))
    del base, trainer
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--archs", nargs="+", default=["qwen2.5-1.5b", "qwen2.5-7b"], choices=sorted(ARCHS))
    ap.add_argument("--tiny", action="store_true", help="the archs shrunk to 2 layers of width 64 (CPU tests)")
    ap.add_argument("--seqs", nargs="+", type=int, default=[16, 64, 128, 256])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--engine-dtype", choices=["bf16", "fp32"], default=None, help="default: bf16 on CUDA, fp32 on CPU")
    ap.add_argument("--bandwidth-tbs", type=float, default=None, help="HBM TB/s (default: the planner's GPU table)")
    ap.add_argument("--real", type=Path, default=None, help="a Hugging Face folder for the real-weights mismatch row")
    ap.add_argument("--mismatch-prompts", type=int, default=32)
    ap.add_argument("--samples", type=int, default=4, help="samples per prompt in the mismatch table")
    ap.add_argument("--skip-decode", action="store_true")
    args = ap.parse_args(argv)
    from reinforge.models.loading import build_model
    from reinforge.plan.hardware import detect

    device = torch.device(args.device)
    edt = args.engine_dtype or ("bf16" if device.type == "cuda" else "fp32")
    dtype = torch.bfloat16 if edt == "bf16" else torch.float32
    gpu = detect(device)
    bandwidth = args.bandwidth_tbs * 1e12 if args.bandwidth_tbs else (gpu.bandwidth if gpu else None)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    hbm = f"HBM {bandwidth / 1e12:.2f} TB/s" if bandwidth else "HBM bandwidth unknown (no limits)"
    print(f"\n{name}, torch {torch.__version__}, engine {edt}; {hbm}")

    if not args.skip_decode:
        rows = [row for arch in args.archs for row in decode_rows(arch, args, device, dtype, bandwidth)]
        print(f"\nDecode: {args.prompt_len}-token prompts, {args.new_tokens} new tokens each, random weights")
        print(
            "| arch | seqs | weights | decode tok/s | step ms | weight GiB read / step | weights-read limit tok/s "
            "| weights+KV limit tok/s | share of weights+KV limit |"
        )
        print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for arch, seqs, label, r, wb, lw, lwkv in rows:
            lim = f"{lw:,.0f}" if lw else "-"
            limkv = f"{lwkv:,.0f}" if lwkv else "-"
            share = f"{r['tok_s'] / lwkv:.0%}" if lwkv else "-"
            print(
                f"| {arch}{' (tiny)' if args.tiny else ''} | {seqs} | {label} | {r['tok_s']:,.0f} | "
                f"{r['step_ms']:.2f} | {wb / 2**30:.3f} | {lim} | {limkv} | {share} |"
            )

    arch = args.archs[0]
    max_len = 64 + args.new_tokens
    vocab = hf_config(arch).vocab_size
    ps = prompts_for(None, args.mismatch_prompts, min(args.prompt_len, 64), vocab)
    mrows = mismatch_rows(
        f"{arch}{' (tiny)' if args.tiny else ''}, random weights",
        lambda dt: random_model(arch, args.tiny, dt, device, max_len),
        ps,
        args,
        device,
        dtype,
    )
    if args.real is not None:
        real_ps = prompts_for(args.real, args.mismatch_prompts, 64, hf_config(arch).vocab_size)
        mrows += mismatch_rows(
            f"{args.real.name}, real weights",
            lambda dt: build_model(args.real, dt, device),
            real_ps,
            args,
            device,
            dtype,
        )
    print(f"\nTrainer (fp32) vs engine ({edt}) log-probs: {args.samples} samples x {args.new_tokens} tokens, T=1")
    print("| model | engine weights | tokens | mean abs diff | p99 | max |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for label, q, n, mean, p99, mx in mrows:
        print(f"| {label} | {q} | {n:,} | {mean:.4g} | {p99:.4g} | {mx:.4g} |")


if __name__ == "__main__":
    main()
