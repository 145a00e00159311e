"""Issue 38, own data in an example config: reasoning-gym-only keys ignored in words for a file, a
reward type that cannot score the data refused at start, held-out rows of a prompt file for the
before / after evaluation, and make-data's KV cache sized to its work."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from reinforge.config import load_config
from reinforge.data import DataError, load_datasets, load_source

ROOT = Path(__file__).resolve().parents[2]


def prompts_file(tmp_path: Path, n: int, labels: bool = True) -> Path:
    path = tmp_path / f"prompts_{n}.jsonl"
    path.write_text(
        "".join(
            json.dumps({"prompt": f"What is {i} + 1?", **({"label": str(i + 1)} if labels else {})}) + "\n"
            for i in range(n)
        )
    )
    return path


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    from reinforge.models.loading import load_tokenizer

    return load_tokenizer(smollm2_path)


def test_task_kwargs_of_a_file_source_are_ignored_with_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="reinforge.data.sources"):
        records = load_source(str(prompts_file(tmp_path, 3)), task_kwargs={"min_terms": 2})
    assert len(records) == 3 and "data.task_kwargs={'min_terms': 2} applies to reasoning_gym" in caplog.text


def test_the_example_config_runs_on_a_jsonl_and_a_reward_that_cannot_score_it_is_refused(tmp_path, tokenizer):
    data = prompts_file(tmp_path, 200)
    cfg = load_config(ROOT / "examples" / "arith_grpo.yaml", [f"data.prompt_data={data}"])
    train, evalset = load_datasets(cfg.data, tokenizer, reward=cfg.reward)  # task_kwargs and reward.type: fine
    assert len(train) + len(evalset) == 200
    cfg = load_config(ROOT / "examples" / "arith_grpo.yaml", [f"data.prompt_data={data}", "reward.type=reasoning_gym"])
    with pytest.raises(
        DataError,
        match=r"reward.type=reasoning_gym .* 136 of the 136 prompts of .*prompts_200.jsonl "
        r"do not come from a reasoning-gym task.*reward.type=auto",
    ):
        load_datasets(cfg.data, tokenizer, reward=cfg.reward)
    cfg = load_config(
        None,
        [
            f"data.prompt_data={prompts_file(tmp_path, 4, labels=False)}",
            "data.label_key=null",
            "reward.type=exact_match",
            "data.n_eval_prompts=0",
        ],
    )
    with pytest.raises(DataError, match=r"reward.type=exact_match .* no prompt of .* has one \(data.label_key=None\)"):
        load_datasets(cfg.data, tokenizer, reward=cfg.reward)
    cfg = load_config(
        None,
        [
            f"data.prompt_data={prompts_file(tmp_path, 4, labels=False)}",
            "data.label_key=null",
            "reward.type=custom",
            "reward.function_path=tests.reward_fns:even_first_token",
        ],
    )
    load_datasets(cfg.data, tokenizer, reward=cfg.reward)  # a custom reward needs no label


def test_a_prompt_file_holds_out_n_eval_prompts_rows(tmp_path, tokenizer, caplog):
    data = prompts_file(tmp_path, 200)
    cfg = load_config(None, [f"data.prompt_data={data}", "data.n_eval_prompts=64"])
    with caplog.at_level(logging.INFO, logger="reinforge.data.dataset"):
        train, evalset = load_datasets(cfg.data, tokenizer)
    assert len(train) == 136 and evalset is not None and len(evalset) == 64
    assert not {p.prompt for p in train.prompts} & {p.prompt for p in evalset.prompts}
    assert "64 of its 200 prompts held out for evaluation (drawn with data.eval_seed=1000003" in caplog.text
    again = load_datasets(cfg.data, tokenizer)[1]
    assert [p.prompt for p in again.prompts] == [p.prompt for p in evalset.prompts]  # seeded
    caplog.clear()
    cfg = load_config(None, [f"data.prompt_data={prompts_file(tmp_path, 20)}", "data.n_eval_prompts=64"])
    with caplog.at_level(logging.WARNING, logger="reinforge.data.dataset"):
        train, evalset = load_datasets(cfg.data, tokenizer)
    assert evalset is None and len(train) == 20
    assert "no evaluation: " in caplog.text and "data.eval_prompt_data" in caplog.text
    cfg = load_config(None, [f"data.prompt_data={data}", f"data.eval_prompt_data={prompts_file(tmp_path, 5)}"])
    train, evalset = load_datasets(cfg.data, tokenizer)
    assert len(train) == 200 and len(evalset) == 5


def test_make_data_sizes_the_kv_cache_to_its_work(tmp_path, tiny_model_path, monkeypatch):
    from reinforge import make_data as md

    seen = {}

    class Stop(Exception):
        pass

    def build_engine(spec):
        seen["slots"] = spec.engine.max_num_seqs
        raise Stop

    monkeypatch.setattr(md, "build_engine", build_engine)
    cfg = load_config(
        None,
        [
            f"model.path={tiny_model_path}",
            "data.num_prompts=16",
            "data.task_kwargs={min_terms: 2, max_terms: 2}",
            "rollout.n_samples_per_prompt=8",
        ],
    )
    with pytest.raises(Stop):
        md.make_data(cfg, "pairs", tmp_path / "pairs.jsonl", num_prompts=16)
    assert seen["slots"] == 16 * 8  # was engine.max_num_seqs (1024): 4.1 GiB for SmolLM2 on a CPU
