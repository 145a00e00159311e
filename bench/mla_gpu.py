"""The deepseek_v3 family (multi-head latent attention) on a GPU (issue 53): the MLA decode kernel against the
gathered torch path, then a Moonlight-16B-A3B-shaped model (random weights, layers cut: ``--layers``, 4 by
default of its 27, said in the output) in the embedded engine: decode tokens/s at 16-256 sequences x 4k-32k
cached tokens against the bandwidth limit, the bf16 engine-vs-trainer log-prob mismatch, and trainer
forward+backward tokens/s native against the transformers fallback.

    PYTHONPATH=. python bench/mla_gpu.py --quick      # < 3 minutes on one H100 / H200
    PYTHONPATH=. python bench/mla_gpu.py              # 16, 64, 256 sequences x 4k, 8k, 16k, 32k

Decode rows: the engine's runner is given ``seqs`` sequences of ``ctx`` cached tokens each (their blocks
assigned directly, the cache left as allocated: a step reads the same bytes whatever the values) and timed
over ``--steps`` decode steps (CUDA graphs, bf16, the Triton MLA kernel). The limit: the bytes a step must
read at least, over the GPU's HBM bandwidth (reinforge.plan.hardware): the weights a step touches (all
but the routed experts, plus the share of experts ``seqs`` tokens pick) + the latent cache, ``layers x seqs x
ctx x (kv_lora_rank + qk_rope_head_dim) x 2`` bytes. ``of_limit`` is the measured share of it; the
``expanded_gib`` column is the cache the same heads would read expanded (16 heads x (192 key + 128 value)
values per token-layer, against the latent's 576), for scale.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from family_timing import train_speed

MOONLIGHT = dict(  # moonshotai/Moonlight-16B-A3B's config.json (the fields deepseek_v3 reads)
    model_type="deepseek_v3",
    architectures=["DeepseekV3ForCausalLM"],
    vocab_size=163840,
    hidden_size=2048,
    intermediate_size=11264,
    moe_intermediate_size=1408,
    num_hidden_layers=27,
    num_attention_heads=16,
    num_key_value_heads=16,
    n_shared_experts=2,
    n_routed_experts=64,
    routed_scaling_factor=2.446,
    kv_lora_rank=512,
    q_lora_rank=None,
    qk_rope_head_dim=64,
    v_head_dim=128,
    qk_nope_head_dim=128,
    topk_method="noaux_tc",
    n_group=1,
    topk_group=1,
    num_experts_per_tok=6,
    moe_layer_freq=1,
    first_k_dense_replace=1,
    norm_topk_prob=True,
    scoring_func="sigmoid",
    rms_norm_eps=1e-5,
    rope_theta=50000.0,
    max_position_embeddings=8192,
    tie_word_embeddings=False,
)


def kernel_check() -> dict[str, float]:
    """The MLA decode kernel (bf16, Moonlight's head shape, one and several splits) against the gathered path."""
    from reinforge.engine.mla_decode import mla_decode_attention_triton
    from reinforge.engine.paged_attention import gather_blocks, masked_decode_attention

    dev, dt = torch.device("cuda"), torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    B, H, R, DR, BS = 8, 16, 512, 64, 16
    lens = torch.tensor([1, 17, 300, 1000, 2048, 4000, 777, 64], device=dev)
    mb = -(-int(lens.max()) // BS)
    table = torch.randperm(B * mb, device=dev, generator=g).view(B, mb).to(torch.int32)
    cache = torch.randn(B * mb + 1, 1, BS, R + DR, device=dev, generator=g, dtype=dt)
    q = torch.randn(B, H, R + DR, device=dev, generator=g, dtype=dt)
    new = torch.randn(B, R + DR, device=dev, generator=g, dtype=dt)
    pos = lens - 1
    w_blk = table.gather(1, (pos // BS)[:, None].long())[:, 0].long()
    w_off = pos % BS
    ref_cache = cache.clone()
    ref_cache[w_blk, 0, w_off] = new
    keys = gather_blocks(ref_cache, table, mb)
    visible = torch.arange(mb * BS, device=dev)[None, :] < lens[:, None]
    bias = torch.zeros(B, 1, 1, mb * BS, device=dev).masked_fill(~visible[:, None, None], float("-inf"))
    ref = masked_decode_attention(q.float(), keys.float(), keys.float(), bias)[..., :R]
    out = {}
    for splits in (1, 4):
        c = cache.clone()
        o = mla_decode_attention_triton(q, new, c, R, table, lens, w_blk, w_off, num_splits=splits)
        out[f"kernel_vs_fp32_ref_splits{splits}"] = (o.float() - ref).abs().max().item()
        out[f"cache_write_ok_splits{splits}"] = float(torch.equal(c, ref_cache))
    return out


def moonlight_folder(out: Path, layers: int, max_len: int) -> Path:
    cfg = dict(MOONLIGHT, num_hidden_layers=layers, max_position_embeddings=max(8192, max_len))
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def bandwidth() -> float:
    from reinforge.plan.hardware import detect

    gpu = detect(torch.device("cuda"))
    return gpu.bandwidth if gpu is not None and gpu.bandwidth else 3.35e12  # (unknown GPU: an H100's)


def decode_rows(model, seqs_list: list[int], ctx_list: list[int], steps: int) -> list[dict]:
    """Decode tokens/s of ``seqs`` sequences at ``ctx`` cached tokens (module docstring)."""
    from reinforge.config import EngineConfig
    from reinforge.engine import EmbeddedEngine

    a = model.args
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    expert_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if ".experts." in n)
    latent = a.kv_lora_rank + a.head_dim
    c = model.config  # the keys and values the same heads would cache expanded (per token and layer)
    expanded = a.num_heads * (c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim)
    rows = []
    for ctx in ctx_list:
        for seqs in seqs_list:
            engine = EmbeddedEngine(
                model, EngineConfig(max_num_seqs=seqs, kv_cache_memory_fraction=0.9), max_model_len=ctx + steps + 16
            )
            r = engine.runner
            per_seq = r.layout.blocks_per_seq
            if r.layout.num_blocks < seqs * per_seq:
                rows.append(dict(seqs=seqs, ctx=ctx, skipped="the cache does not fit"))
                engine.shutdown()
                continue
            r.block_table[:seqs] = torch.arange(seqs * per_seq, device=r.device, dtype=torch.int32).view(seqs, -1)
            r.seq_lens[:seqs] = ctx
            r.gen_lens[:seqs] = 1
            r.max_new[:seqs] = 1 << 30
            r.done[:seqs] = False
            r.last_token[:seqs] = torch.randint(10, 100000, (seqs,), device=r.device)
            Lk = r.Decode.key_range(ctx + steps, r.layout)
            for _ in range(3):  # capture + warm up
                r.decode(seqs, Lk, False)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(steps):
                r.decode(seqs, Lk, False)
            torch.cuda.synchronize()
            dt = (time.perf_counter() - t0) / steps
            touched = 1 - (1 - a.num_experts_per_tok / a.num_experts) ** seqs
            cache_bytes = a.num_layers * seqs * (ctx + steps / 2) * latent * 2
            step_bytes = weight_bytes - expert_bytes * (1 - touched) + cache_bytes
            limit = seqs / (step_bytes / bandwidth())
            rows.append(
                dict(
                    seqs=seqs,
                    ctx=ctx,
                    decode_tok_s=round(seqs / dt),
                    limit_tok_s=round(limit),
                    of_limit=round(seqs / dt / limit, 3),
                    step_ms=round(dt * 1e3, 2),
                    latent_gib=round(cache_bytes / 2**30, 2),
                    expanded_gib=round(cache_bytes / latent * expanded / 2**30, 2),
                )
            )
            print("decode:", rows[-1], flush=True)
            engine.shutdown()
            del engine, r
            torch.cuda.empty_cache()
    return rows


def mismatch(folder: Path, seqs: int = 8, prompt: int = 512, new: int = 128) -> dict[str, float]:
    """bf16 engine log-probs (chunked prefill, absorbed decode) against the trainer's plain forward."""
    from reinforge.config import EngineConfig
    from reinforge.engine import EmbeddedEngine
    from reinforge.models.loading import build_model
    from reinforge.records import GenerateRequest, SamplingParams

    dev = torch.device("cuda")
    engine_model = build_model(folder, torch.bfloat16, dev, random_init=True, seed=0)
    engine = EmbeddedEngine(engine_model, EngineConfig(max_num_seqs=seqs), max_model_len=prompt + new + 8)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 100000, (prompt,), generator=g).tolist() for _ in range(seqs)]
    results = engine.generate(
        [GenerateRequest(p, SamplingParams(max_new_tokens=new, temperature=1.0, ignore_eos=True)) for p in prompts]
    )
    engine.shutdown()
    del engine, engine_model
    trainer = build_model(folder, torch.bfloat16, dev, random_init=True, seed=0).eval()
    diffs = []
    for p, (res,) in zip(prompts, results):
        with torch.no_grad():
            logits = trainer(torch.tensor([p + res.token_ids], device=dev))[0, len(p) - 1 : -1].float()
        ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(res.token_ids, device=dev)[:, None])[:, 0]
        diffs.append((ref.cpu() - torch.tensor(res.log_probs)).abs())
    d = torch.cat(diffs)
    del trainer
    torch.cuda.empty_cache()
    return {"logprob_diff_mean": d.mean().item(), "logprob_diff_max": d.max().item(), "tokens": d.numel()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="16/64/256 sequences x 4k/32k, fewer steps (< 3 min)")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers kept of Moonlight's 27 (layer 0 dense)")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--train-tokens", type=int, default=4096)
    args = ap.parse_args()
    seqs = [16, 64, 256]
    ctxs = [4096, 32768] if args.quick else [4096, 8192, 16384, 32768]
    steps = 16 if args.quick else args.steps
    print(torch.cuda.get_device_name(), "torch", torch.__version__, f"HBM {bandwidth() / 1e12:.2f} TB/s", flush=True)
    print(f"Moonlight-16B-A3B shape, random weights, {args.layers} of 27 layers", flush=True)
    print("kernel:", kernel_check(), flush=True)
    from reinforge.models.loading import build_model

    with tempfile.TemporaryDirectory() as tmp:
        folder = moonlight_folder(Path(tmp) / "m", args.layers, max(ctxs) + 64)
        model = build_model(folder, torch.bfloat16, torch.device("cuda"), random_init=True)
        decode_rows(model, seqs, ctxs, steps)
        del model
        torch.cuda.empty_cache()
        print("mismatch (bf16 engine vs trainer):", mismatch(folder), flush=True)
        print("train:", train_speed(folder, args.train_tokens), flush=True)


if __name__ == "__main__":
    main()
