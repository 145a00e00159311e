"""Issue 57 item 14: every up-front check survives a ``config.json`` it does not know. A tiny ``gpt_oss``
(experts sized by ``intermediate_size``, no ``moe_intermediate_size``) is estimated from what it has; a
family with its own size keys (``n_embd``) is planned with no memory or time and says so in one line;
neither stops at start with a ``KeyError``'s text."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from reinforge.cluster.resources import check_placement
from reinforge.config import load_config
from reinforge.models.shape import model_shape
from reinforge.plan import GPUS, format_plan, resolve_config, training_problems
from reinforge.plan.arch import Arch

GPT_OSS = dict(  # transformers' AutoConfig.for_model("gpt_oss", ...) at tiny sizes, trimmed to the sizes
    model_type="gpt_oss",
    architectures=["GptOssForCausalLM"],
    vocab_size=256,
    hidden_size=64,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_local_experts=4,
    num_experts_per_tok=2,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)
OWN_KEYS = dict(model_type="weird", width=64, depth=2, heads=4, vocab_size=256)  # (no alias of SIZE_ALIASES)


def folder(tmp_path: Path, cfg: dict) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def config(path: Path, *extra: str):
    return load_config(
        None, [f"model.path={path}", "rollout.rollout_batch_size=2", "rollout.n_samples_per_prompt=2", *extra]
    )


def test_gpt_oss_up_front_checks_estimate_from_intermediate_size(tmp_path, caplog):
    path = folder(tmp_path, GPT_OSS)
    shape = model_shape(path)  # was KeyError: 'moe_intermediate_size'
    assert shape.num_layers == 2 and shape.num_kv_heads == 2 and shape.head_dim == 16
    assert check_placement(config(path, "train.device=cpu"), {"CPU": 2, "memory": 1 << 40}, path) is False
    arch = Arch.from_config(GPT_OSS)
    assert arch.moe_intermediate == 64 and arch.experts == 4  # the experts counted, not 0 wide
    _, plan = resolve_config(config(path, "train.max_tokens_per_gpu=auto"), path, gpu=GPUS["h100"], prompt_len=30)
    assert plan.workload is not None and training_problems(plan, 30) == []
    assert isinstance(plan.cfg.train.max_tokens_per_gpu, int)


def test_a_family_with_its_own_size_keys_is_not_estimated_and_says_so(tmp_path, caplog):
    path = folder(tmp_path, OWN_KEYS)
    with caplog.at_level(logging.WARNING):
        assert check_placement(config(path, "train.device=cpu"), {"CPU": 2, "memory": 1 << 40}, path) is False
    assert "memory estimate unavailable" in caplog.text and "'hidden_size'" in caplog.text
    cfg, plan = resolve_config(config(path, "train.max_tokens_per_gpu=auto"), path, gpu=GPUS["h100"], prompt_len=30)
    assert cfg.train.max_tokens_per_gpu == 8192 and training_problems(plan, 30) == []
    text = format_plan(plan)
    assert "memory and time are not planned" in text and "'hidden_size'" in text


def test_reinforge_plan_on_an_unknown_family_exits_0_in_words(tmp_path, capsys):
    from reinforge.cli import main

    path = folder(tmp_path, OWN_KEYS)
    assert main(["plan", "--gpu", "h100", f"model.path={path}"]) == 0
    out = capsys.readouterr().out
    assert "model_type 'weird'" in out and "has no 'hidden_size'" in out
