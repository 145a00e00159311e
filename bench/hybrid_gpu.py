"""The hybrid family (Qwen3-Next) on a GPU (issue 52): flash-linear-attention's kernel against the pure-torch rule,
then a Qwen3-Next-shaped model (random weights, layers cut) in the embedded engine and the trainer, native against
the transformers fallback.

    PYTHONPATH=. python bench/hybrid_gpu.py --layers 8 --seqs 64 --new-tokens 256

Prints: the kernel's max |difference| from :func:`reinforge.models.linear_attention.chunk_gated_delta_rule`
(fp32 inputs, with and without packed sequences); the engine's decode tokens/s (bf16, CUDA graphs) with the
bandwidth limit beside it (the GPU's HBM bandwidth from reinforge.plan.hardware; weights + the attention layers'
KV + the linear layers' states read once per step);
trainer forward+backward tokens/s, native and transformers; the engine-vs-trainer log-prob difference (bf16).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch


def kernel_check() -> dict[str, float]:
    from reinforge.models.linear_attention import chunk_gated_delta_rule, gated_delta_rule

    g = torch.Generator(device="cuda").manual_seed(0)
    B, T, H, Dk, Dv = 2, 300, 4, 128, 128
    q, k = (torch.nn.functional.normalize(torch.randn(B, T, H, Dk, device="cuda", generator=g), dim=-1) for _ in "qk")
    q = q * Dk**-0.5
    v = torch.randn(B, T, H, Dv, device="cuda", generator=g)
    gate = -torch.rand(B, T, H, device="cuda", generator=g)
    beta = torch.rand(B, T, H, device="cuda", generator=g)
    ref, s_ref = chunk_gated_delta_rule(q, k, v, gate, beta)
    out, s = gated_delta_rule(q, k, v, gate, beta)
    cu = torch.tensor([0, 100, 300, 600], device="cuda", dtype=torch.int32)
    flat = [x.reshape(1, B * T, *x.shape[2:]) for x in (q, k, v, gate, beta)]
    packed, _ = gated_delta_rule(*flat, cu_seqlens=cu)
    parts = [chunk_gated_delta_rule(*(x[:, a:b] for x in flat))[0] for a, b in ((0, 100), (100, 300), (300, 600))]
    return {
        "fla_vs_torch_out": (out.float() - ref).abs().max().item(),
        "fla_vs_torch_state": (s - s_ref).abs().max().item(),
        "fla_packed_vs_torch": (packed.float() - torch.cat(parts, 1)).abs().max().item(),
    }


def qwen3_next_folder(out: Path, layers: int, tokenizer: Path | None) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM  # noqa: F401

    cfg = AutoConfig.for_model("qwen3_next").to_dict()  # Qwen3-Next-80B-A3B's shape
    cfg.update(num_hidden_layers=layers, layer_types=cfg["layer_types"][:layers], vocab_size=151936)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg))
    if tokenizer is not None:
        for f in tokenizer.iterdir():
            if f.name != "config.json":
                (out / f.name).write_bytes(f.read_bytes())
    return out


def bench_model(folder: Path, seqs: int, prompt: int, new: int) -> dict[str, float]:
    from reinforge.config import EngineConfig
    from reinforge.engine import EmbeddedEngine
    from reinforge.models.loading import build_model
    from reinforge.records import GenerateRequest, SamplingParams

    dev = torch.device("cuda")
    model = build_model(folder, torch.bfloat16, dev, random_init=True)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    engine = EmbeddedEngine(model, EngineConfig(max_num_seqs=seqs), max_model_len=prompt + new + 8)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 100000, (prompt,), generator=g).tolist() for _ in range(seqs)]
    params = SamplingParams(max_new_tokens=new, temperature=1.0, ignore_eos=True)
    engine.generate([GenerateRequest(p, SamplingParams(max_new_tokens=8, ignore_eos=True)) for p in prompts[:4]])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    results = engine.generate([GenerateRequest(p, params) for p in prompts])
    torch.cuda.synchronize()
    gen_s = time.perf_counter() - t0
    tokens = sum(len(r.token_ids) for (r,) in results)
    a = model.args
    full = sum(1 for layer in model.model.layers if layer.mixer_name == "self_attn")
    kv_bytes = 2 * full * a.num_kv_heads * a.head_dim * 2 * seqs * (prompt + new / 2)  # mean context, bf16
    states = engine.runner.linear.nbytes() * seqs / engine.runner.layout.num_slots
    expert_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if ".experts." in n)
    E, k = max(a.num_experts, 1), a.num_experts_per_tok
    touched = 1 - (1 - k / E) ** seqs if a.num_experts else 1.0  # share of experts a decode step reads
    active = weight_bytes - expert_bytes + expert_bytes * touched
    step_bytes = active + kv_bytes + 2 * states
    from reinforge.plan.hardware import detect

    gpu = detect(dev)
    bandwidth = gpu.bandwidth if gpu is not None and gpu.bandwidth else 3.35e12  # (unknown GPU: an H100's)
    limit_tok_s = seqs / (step_bytes / bandwidth)
    # engine vs trainer log-probs (bf16), one sequence
    trainer = model  # (the engine's copy: same weights; trainer path = a plain forward)
    p, (r,) = prompts[0], results[0]
    with torch.no_grad():
        trainer.set_variant(type(trainer.variant)())
        logits = trainer(torch.tensor([p + r.token_ids], device=dev))[0, len(p) - 1 : -1].float()
    ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r.token_ids, device=dev)[:, None])[:, 0].cpu()
    diff = (ref - torch.tensor(r.log_probs)).abs()
    del engine
    torch.cuda.empty_cache()
    return {
        "decode_tok_s": tokens / gen_s,
        "limit_tok_s": limit_tok_s,
        "of_limit": tokens / gen_s / limit_tok_s,
        "weights_gib": weight_bytes / 2**30,
        "experts_read_per_step": touched,
        "logprob_diff_mean": diff.mean().item(),
        "logprob_diff_max": diff.max().item(),
    }


def train_speed(folder: Path, tokens: int) -> dict[str, float]:
    from transformers import AutoModelForCausalLM

    from reinforge.models.loading import build_model, model_logits

    dev = torch.device("cuda")
    ids = torch.randint(10, 100000, (1, tokens), device=dev)
    out = {}
    for name in ("native", "transformers"):
        if name == "native":
            model = build_model(folder, torch.bfloat16, dev, random_init=True)
        else:
            torch.manual_seed(0)
            from transformers import AutoConfig

            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=torch.bfloat16).to(dev)
        model.train()
        times = []
        try:
            for i in range(4):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                model_logits(model, ids).float().logsumexp(-1).mean().backward()
                torch.cuda.synchronize()
                if i:
                    times.append(time.perf_counter() - t0)
                model.zero_grad(set_to_none=True)
            out[f"train_tok_s_{name}"] = tokens / sorted(times)[1]
        except RuntimeError as e:  # (transformers' fla backward refuses some Triton versions on Hopper)
            out[f"train_error_{name}"] = str(e)[:160]
        del model
        torch.cuda.empty_cache()
    if "train_tok_s_native" in out and "train_tok_s_transformers" in out:
        out["train_ratio"] = out["train_tok_s_native"] / out["train_tok_s_transformers"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--seqs", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--train-tokens", type=int, default=4096)
    ap.add_argument("--tokenizer", type=Path)
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    print("kernel:", kernel_check(), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = qwen3_next_folder(Path(tmp) / "m", args.layers, args.tokenizer)
        print("engine:", bench_model(folder, args.seqs, args.prompt, args.new_tokens), flush=True)
        print("train:", train_speed(folder, args.train_tokens), flush=True)


if __name__ == "__main__":
    main()
