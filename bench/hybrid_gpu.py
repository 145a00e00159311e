"""The hybrid family (Qwen3.5 / Qwen3-Next) on a GPU (issue 52): flash-linear-attention's kernels against the
pure-torch rule, then a Qwen3.5-shaped model (random bf16 weights) in the embedded engine (decode tokens/s
against the bandwidth limit, over sequences x context) and the trainer (native against the transformers model).

    PYTHONPATH=. python bench/hybrid_gpu.py --model qwen3_5_9b --sweep 16x4096,64x4096,64x16384
    PYTHONPATH=. python bench/hybrid_gpu.py --model qwen3_next_80b --layers 8 --sweep 64x128

Prints one JSON line per part and a table: for each (sequences x context) the decode tokens/s of the
steady state (every sequence prefilled, ``--decode-steps`` engine steps timed), its limit (the bytes one
decode step must read at the GPU's HBM bandwidth from reinforge.plan.hardware: the weights a step reads, the
attention layers' keys and values at the mean context, the linear layers' states read and written), and the
share; the same with the torch decode step instead of fla's fused kernel at the first setting; the engine's
log-probs against a plain forward of the same weights (bf16).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from family_timing import steady_decode_rate, train_speed

# the text towers' shapes (config.json of the published checkpoints' text_config, as transformers' defaults)
QWEN3_5_9B = dict(
    model_type="qwen3_5_text",
    hidden_size=4096,
    intermediate_size=12288,
    num_hidden_layers=32,
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=256,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_num_key_heads=16,
    linear_num_value_heads=32,
    vocab_size=248320,
    rms_norm_eps=1e-6,
    max_position_embeddings=40960,
    tie_word_embeddings=False,
    hidden_act="silu",
    attention_bias=False,
    rope_parameters={"rope_theta": 10000000.0, "partial_rotary_factor": 0.25, "rope_type": "default"},
    full_attention_interval=4,
)
QWEN3_5_35B_A3B = dict(
    QWEN3_5_9B,
    model_type="qwen3_5_moe_text",
    hidden_size=2048,
    num_hidden_layers=40,
    num_key_value_heads=2,
    intermediate_size=None,
    num_experts=256,
    num_experts_per_tok=8,
    moe_intermediate_size=512,
    shared_expert_intermediate_size=512,
)
MODELS = {"qwen3_5_9b": QWEN3_5_9B, "qwen3_5_35b_a3b": QWEN3_5_35B_A3B}


def kernel_check() -> dict[str, float]:
    """fla's chunked and fused-recurrent kernels against the torch rule (fp32 inputs)."""
    import torch.nn.functional as F

    from reinforge.models.linear_attention import (
        chunk_gated_delta_rule,
        fla_recurrent,
        gated_delta_rule,
        recurrent_gated_delta_rule,
    )

    g = torch.Generator(device="cuda").manual_seed(0)
    B, T, H, Dk, Dv = 2, 300, 4, 128, 128
    q, k = (F.normalize(torch.randn(B, T, H, Dk, device="cuda", generator=g), dim=-1) for _ in "qk")
    q = q * Dk**-0.5
    v = torch.randn(B, T, H, Dv, device="cuda", generator=g)
    gate = -torch.rand(B, T, H, device="cuda", generator=g)
    beta = torch.rand(B, T, H, device="cuda", generator=g)
    ref, s_ref = chunk_gated_delta_rule(q, k, v, gate, beta)
    out, s = gated_delta_rule(q, k, v, gate, beta)
    # one decode step: fla's fused kernel (norms and gates inside) against the torch step
    raw_q, raw_k = (torch.randn(8, 1, 2, Dk, device="cuda", generator=g) for _ in "qk")
    raw_v = torch.randn(8, 1, 4, Dv, device="cuda", generator=g)
    a, b = (torch.randn(8, 1, 4, device="cuda", generator=g) for _ in "ab")
    A_log, dt_bias = torch.rand(4, device="cuda", generator=g), torch.rand(4, device="cuda", generator=g)
    state = torch.randn(8, 4, Dk, Dv, device="cuda", generator=g)
    o1, s1 = fla_recurrent()(
        raw_q, raw_k, raw_v, g=a, beta=b, scale=Dk**-0.5, initial_state=state, output_final_state=True,
        use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
        use_beta_sigmoid_in_kernel=True,
    )  # fmt: skip
    qn = F.normalize(raw_q[:, 0], dim=-1, eps=1e-6).repeat_interleave(2, 1) * Dk**-0.5
    kn = F.normalize(raw_k[:, 0], dim=-1, eps=1e-6).repeat_interleave(2, 1)
    gg = -A_log.exp() * F.softplus(a[:, 0] + dt_bias)
    o2, s2 = recurrent_gated_delta_rule(qn, kn, raw_v[:, 0], gg, b[:, 0].sigmoid(), state)
    from reinforge.engine.linear_state import fla_step_kernels, recurrent_step_in_place
    from reinforge.models.linear_attention import GatedRMSNorm

    kernel, gated_norm = fla_step_kernels()
    s3 = state.clone()
    o3 = recurrent_step_in_place(
        kernel, raw_q[:, 0], raw_k[:, 0], raw_v[:, 0], a[:, 0], b[:, 0], A_log, dt_bias, s3, Dk**-0.5
    )
    zz = torch.randn(8 * 4, Dv, device="cuda", generator=g)
    norm = GatedRMSNorm(Dv, 1e-6).cuda()
    norm.weight.data.uniform_(0.5, 1.5)
    fused_norm = gated_norm(o2.reshape(-1, Dv), zz, norm.weight, None, activation="silu", eps=1e-6)
    return {
        "in_place_vs_torch_out": (o3 - o2).abs().max().item(),
        "in_place_vs_torch_state": (s3 - s2).abs().max().item(),
        "fla_gated_norm_vs_torch": (fused_norm - norm(o2.reshape(-1, Dv), zz)).abs().max().item(),
        "fla_chunk_vs_torch_out": (out.float() - ref).abs().max().item(),
        "fla_chunk_vs_torch_state": (s - s_ref).abs().max().item(),
        "fla_recurrent_vs_torch_out": (o1[:, 0] - o2).abs().max().item(),
        "fla_recurrent_vs_torch_state": (s1 - s2).abs().max().item(),
    }


def model_folder(out: Path, cfg: dict, layers: int | None, tokenizer: Path | None) -> Path:
    cfg = dict(cfg)
    if layers:
        cfg["num_hidden_layers"] = layers
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg))
    if tokenizer is not None:
        for f in tokenizer.iterdir():
            if f.name != "config.json":
                (out / f.name).write_bytes(f.read_bytes())
    return out


def step_limit(model, engine, seqs: int, context: float, bandwidth: float) -> float:
    """Tokens/s at the bandwidth limit: ``seqs`` tokens per step over the bytes a step reads."""
    a = model.args
    named = dict(model.named_parameters())
    weight = sum(p.numel() * p.element_size() for n, p in named.items() if "embed_tokens" not in n)
    if a.tie_word_embeddings:  # the LM head is the embedding: read once per step
        weight += model.model.embed_tokens.weight.numel() * model.model.embed_tokens.weight.element_size()
    experts = sum(p.numel() * p.element_size() for n, p in named.items() if ".experts." in n)
    E, k = max(a.num_experts, 1), a.num_experts_per_tok
    touched = 1 - (1 - k / E) ** seqs if a.num_experts else 1.0  # share of experts a decode step reads
    weight = weight - experts + experts * touched
    kv = 2 * a.num_kv_layers * a.num_kv_heads * a.head_dim * engine.runner.k_pool.element_size() * seqs * context
    states = engine.runner.linear.nbytes() / engine.runner.layout.num_slots * seqs if engine.runner.linear else 0
    return seqs / ((weight + kv + 2 * states) / bandwidth)


def sweep(
    folder: Path, settings: list[tuple[int, int]], steps: int, torch_at_first: bool, profile_at: str = ""
) -> list[dict]:
    from reinforge.config import EngineConfig
    from reinforge.engine import EmbeddedEngine
    from reinforge.models.loading import build_model
    from reinforge.plan.hardware import detect

    dev = torch.device("cuda")
    model = build_model(folder, torch.bfloat16, dev, random_init=True)
    gpu = detect(dev)
    bandwidth = gpu.bandwidth if gpu is not None and gpu.bandwidth else 3.35e12  # (unknown GPU: an H100's)
    rows = []
    g = torch.Generator().manual_seed(0)
    new = 8 * steps + 64
    for i, (seqs, context) in enumerate(settings):
        cfg = EngineConfig(max_num_seqs=seqs, sync_interval=8, kv_cache_memory_fraction=0.9)
        engine = EmbeddedEngine(model, cfg, max_model_len=context + new)
        prompts = [torch.randint(10, 100000, (context,), generator=g).tolist() for _ in range(seqs)]
        kinds = ["fla", "torch"] if i == 0 and torch_at_first and engine.runner.linear is not None else ["fla"]
        for kind in kinds:
            if engine.runner.linear is not None:
                engine.runner.linear.fla_decode = kind == "fla"
                engine.runner.drop_graphs()
            rate = steady_decode_rate(engine, prompts, new, steps, kind == "fla" and profile_at == f"{seqs}x{context}")
            limit = step_limit(model, engine, seqs, context + 4 * steps, bandwidth)
            rows.append(
                dict(seqs=seqs, context=context, decode=kind, tok_s=rate, limit_tok_s=limit, of_limit=rate / limit)
            )
            print(json.dumps(rows[-1]), flush=True)
        engine.shutdown()
        del engine
        torch.cuda.empty_cache()
    return rows


def logprob_mismatch(folder: Path, seqs: int = 8, prompt: int = 512, new: int = 256) -> dict[str, float]:
    """Engine (bf16, CUDA graphs, fla decode) against a plain forward of the same weights (bf16)."""
    from reinforge.config import EngineConfig
    from reinforge.engine import EmbeddedEngine
    from reinforge.models.loading import build_model
    from reinforge.records import GenerateRequest, SamplingParams

    dev = torch.device("cuda")
    model = build_model(folder, torch.bfloat16, dev, random_init=True)
    engine = EmbeddedEngine(model, EngineConfig(max_num_seqs=seqs), max_model_len=prompt + new + 8)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(10, 100000, (prompt,), generator=g).tolist() for _ in range(seqs)]
    params = SamplingParams(max_new_tokens=new, temperature=1.0, ignore_eos=True)
    results = engine.generate([GenerateRequest(p, params) for p in prompts])
    engine.shutdown()
    diffs = []
    model.set_variant(type(model.variant)())  # the trainer's variant
    for p, (r,) in zip(prompts, results):
        with torch.no_grad():
            logits = model(torch.tensor([p + r.token_ids], device=dev))[0, len(p) - 1 : -1].float()
        ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r.token_ids, device=dev)[:, None])[:, 0]
        diffs.append((ref.cpu() - torch.tensor(r.log_probs)).abs())
    d = torch.cat(diffs)
    return {"logprob_diff_mean": d.mean().item(), "logprob_diff_p99": d.quantile(0.99).item(), "max": d.max().item()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=sorted(MODELS), default="qwen3_5_9b")
    ap.add_argument("--layers", type=int, help="cut the model to this many layers (default: all)")
    ap.add_argument("--sweep", default="16x4096,64x4096", help="SEQSxCONTEXT,...")
    ap.add_argument("--decode-steps", type=int, default=8, help="engine steps timed (8 tokens each)")
    ap.add_argument("--train-tokens", type=int, default=0, help="also time the trainer on this many tokens")
    ap.add_argument("--train-layers", type=int, default=8)
    ap.add_argument("--no-mismatch", action="store_true")
    ap.add_argument("--no-torch-step", action="store_true", help="skip the torch decode step at the first setting")
    ap.add_argument("--no-kernel-check", action="store_true")
    ap.add_argument("--profile-at", default="", help="SEQSxCONTEXT: profile that sweep point's steady decode steps")
    ap.add_argument("--tokenizer", type=Path)
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    if not args.no_kernel_check:
        print("kernel:", json.dumps(kernel_check()), flush=True)
    settings = [tuple(int(x) for x in s.split("x")) for s in args.sweep.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        folder = model_folder(Path(tmp) / "m", MODELS[args.model], args.layers, args.tokenizer)
        rows = sweep(
            folder, settings, args.decode_steps, torch_at_first=not args.no_torch_step, profile_at=args.profile_at
        )
        if not args.no_mismatch:
            print("mismatch:", json.dumps(logprob_mismatch(folder)), flush=True)
        if args.train_tokens:
            small = model_folder(Path(tmp) / "t", MODELS[args.model], args.train_layers, args.tokenizer)
            print("train:", json.dumps(train_speed(small, args.train_tokens)), flush=True)
    print(f"\n{args.model}{f' ({args.layers} layers)' if args.layers else ''}, bf16, {torch.cuda.get_device_name()}")
    print(
        "| sequences | context | decode step | tok/s | limit tok/s | of limit |\n| --- | --- | --- | --- | --- | --- |"
    )
    for r in rows:
        print(f"| {r['seqs']} | {r['context']} | {r['decode']} | {r['tok_s']:,.0f} | {r['limit_tok_s']:,.0f} | "
              f"{r['of_limit']:.0%} |")  # fmt: skip


if __name__ == "__main__":
    main()
