"""The fallback path for a model of no registered family (issue 53 item 5): the up-front size estimates read
its config (GPT-2's ``n_embd``...), the trainer shards its blocks, the fallback engine (transformers'
``generate``, ``reinforge/rollout/hf_engine.py``) batches requests of equal sampling parameters, one GRPO
rollout trains, and ``reinforge check-model`` checks the fallback engine."""

from __future__ import annotations

import json

import pytest

from tests.conftest import make_tiny_model


@pytest.fixture(scope="module")
def phi3_path(tmp_path_factory, smollm2_tokenizer_path):
    return make_tiny_model(tmp_path_factory.mktemp("tiny-phi3"), smollm2_tokenizer_path, "phi3")


def test_fallback_engine_batches_requests_of_equal_parameters(phi3_path):
    """Three requests, each with its own (equal) parameters object and its own length: one ``generate``, each
    completion cut at its length and equal to the one it gets alone (greedy)."""
    from reinforge.models.loading import build_model
    from reinforge.records import FinishReason, GenerateRequest, SamplingParams
    from reinforge.rollout.backends.hf import HFEngine

    engine = HFEngine(build_model(phi3_path), pad_token_id=2, batch_size=8)
    calls = []
    generate = engine.model.generate
    engine.model.generate = lambda **kw: calls.append(kw["input_ids"].shape) or generate(**kw)
    prompts, lengths = [[5, 6, 7], [8, 9], [10, 11, 12, 13]], [3, 5, 4]
    requests = [
        GenerateRequest(p, SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True))
        for p, n in zip(prompts, lengths)
    ]
    together = engine.generate(requests)
    assert calls == [(3, 4)]  # one batch of the three prompts, left-padded to 4
    alone = [engine.generate([r])[0][0] for r in requests]
    for (res,), one, n in zip(together, alone, lengths):
        assert len(res.token_ids) == len(res.log_probs) == n and res.finish_reason == FinishReason.LENGTH
        assert res.token_ids == one.token_ids
        assert res.log_probs == pytest.approx(one.log_probs, abs=1e-4)
    sampled = GenerateRequest([5, 6], SamplingParams(max_new_tokens=2, temperature=1.0), n=2)
    calls.clear()
    engine.generate([sampled, requests[0]])  # other parameters: a batch of their own
    assert sorted(calls) == [(1, 3), (2, 2)]


def test_size_estimates_read_aliased_keys(tmp_path):
    """GPT-2 / BLOOM name the sizes ``n_embd`` / ``n_layer`` / ``n_head``: the estimates read them."""
    from reinforge.models.shape import model_shape
    from reinforge.plan.arch import Arch

    cfg = {"model_type": "gpt2", "n_embd": 64, "n_layer": 3, "n_head": 4, "n_inner": 96, "vocab_size": 1000}
    arch = Arch.from_config(cfg)
    assert (arch.hidden, arch.num_layers, arch.num_heads, arch.head_dim, arch.intermediate) == (64, 3, 4, 16, 96)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    shape = model_shape(tmp_path)
    assert (shape.num_layers, shape.num_kv_heads, shape.head_dim) == (3, 4, 16)


@pytest.mark.parametrize("model_type", ["gpt2", "bloom"])
def test_unregistered_model_trains_on_the_fallback(tmp_path, smollm2_tokenizer_path, model_type, caplog):
    """A model of no registered family whose blocks are not under ``model.layers`` (``transformer.h``) starts
    and finishes one GRPO rollout on the fallback (trainer: transformers' model, engine: its ``generate``)."""
    from reinforge.config import load_config
    from reinforge.loop import run_training
    from tests.integration.test_integration import read_metrics, tiny_overrides

    path = make_tiny_model(tmp_path / "model", smollm2_tokenizer_path, model_type)
    out = tmp_path / "run"
    overrides = {
        "model.train_dtype": "fp32",
        "data.n_eval_prompts": 0,
        "eval.eval_before_train": "false",
        "train.num_rollout": 1,
        "rollout.rollout_batch_size": 2,
        "rollout.n_samples_per_prompt": 2,
        "rollout.rollout_max_response_len": 6,
    }
    with caplog.at_level("WARNING"):
        run_training(load_config(None, tiny_overrides(path, out, **overrides)))
    assert "falling back to transformers' generate" in caplog.text
    (m,) = [m for m in read_metrics(out) if "train/loss" in m]
    assert m["train/loss"] == m["train/loss"]  # (not NaN)


def test_check_model_checks_the_fallback_engine(phi3_path):
    """check-model on a model of no registered family: the family row says fallback, the engine rows check
    the fallback engine against transformers' forward pass, and they pass."""
    from reinforge.check_model import check_model, failed

    rows = {r.name: r for r in check_model(phi3_path, tokens=8, speed=False)}
    assert rows["family"].value.startswith("fallback (transformers)")
    for name in ("engine log-probs (fp32)", "greedy continuation", "weight sync"):
        assert rows[name].ok is True, rows[name]
    assert "fallback engine" in rows["engine log-probs (fp32)"].value
    assert not failed(list(rows.values()))
