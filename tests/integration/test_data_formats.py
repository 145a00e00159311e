"""Every accepted data format is detected, named in the log and trains one step on a tiny model;
rows no format fits are refused with the file, row and keys."""

import json
import logging

import pytest

from reinforge.config import load_config
from reinforge.data import load_prompt_file
from reinforge.data.files import DataError, read_rows
from reinforge.data.formats import split_implicit_prompt
from reinforge.data.offline import Tokenizer, build_examples
from reinforge.models.loading import load_tokenizer
from reinforge.offline_loop import run_offline


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def qa(i):
    return f"What is {i} + {i}?", f"<answer>{2 * i}</answer>", f"It is {2 * i + 1}, I think"


# (format name logged, offline.method, rows)
FORMATS = {
    "standard": (
        "preference (standard)",
        "dpo",
        [{"prompt": q, "chosen": c, "rejected": r} for q, c, r in map(qa, range(4))],
    ),
    "conversational": (
        "preference (conversational)",
        "dpo",
        [{"prompt": [user(q)], "chosen": [assistant(c)], "rejected": [assistant(r)]} for q, c, r in map(qa, range(4))],
    ),
    "implicit_prompt": (
        "preference, implicit prompt (conversational)",
        "dpo",
        [{"chosen": [user(q), assistant(c)], "rejected": [user(q), assistant(r)]} for q, c, r in map(qa, range(4))],
    ),
    "text": ("language modeling", "sft", [{"text": f"{q} {c}"} for q, c, _ in map(qa, range(4))]),
    "messages": (
        "conversational language modeling (conversational)",
        "sft",
        [{"messages": [user(q), assistant(c)]} for q, c, _ in map(qa, range(4))],
    ),
    "prompt_completion": (
        "prompt-completion (standard)",
        "sft",
        [{"prompt": q, "completion": c} for q, c, _ in map(qa, range(4))],
    ),
    "prompt_completion_conversational": (
        "prompt-completion (conversational)",
        "sft",
        [{"prompt": [user(q)], "completion": [assistant(c)]} for q, c, _ in map(qa, range(4))],
    ),
    "unpaired": (
        "unpaired preference (standard)",
        "kto",
        [
            {"prompt": q, "completion": c if i % 2 else r, "label": bool(i % 2)}
            for i, (q, c, r) in enumerate(map(qa, range(4)))
        ],
    ),
}


def write(path, rows):
    """rows as .jsonl, .json, .parquet or a saved `datasets` folder (by the path's suffix)."""
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows))
    else:
        import datasets

        ds = datasets.Dataset.from_list(rows)
        ds.to_parquet(str(path)) if path.suffix == ".parquet" else ds.save_to_disk(str(path))
    return path


def one_step(tmp_path, model, data, method):
    cfg = load_config(
        None,
        [
            f"model.path={model}",
            f"run.output_dir={tmp_path / 'run'}",
            f"offline.method={method}",
            f"offline.train_data={data}",
            "offline.global_batch_size=4",
            "train.max_tokens_per_gpu=400",
            "eval.eval_before_train=false",
            "run.save_final=false",
            "run.progress=false",
            "run.tensorboard=false",
        ],
    )
    run_offline(cfg)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train/loss"] for r in rows if "train/loss" in r]
    assert len(losses) == 1 and losses[0] == losses[0]  # one step, finite


@pytest.mark.parametrize("name", list(FORMATS) + ["datasets_folder", "parquet", "json"])
def test_format_is_detected_and_trains_one_step(tmp_path, tiny_model_path, caplog, name):
    suffix = {"datasets_folder": "", "parquet": ".parquet", "json": ".json"}.get(name, ".jsonl")
    fmt, method, rows = FORMATS["standard" if suffix != ".jsonl" else name]
    data = write(tmp_path / f"data{suffix}", rows)
    with caplog.at_level(logging.INFO, logger="reinforge.data.offline"):
        one_step(tmp_path, tiny_model_path, data, method)
    assert f"{data}: 4 rows, format: {fmt}: 4" in caplog.text


def test_verl_parquet_trains_one_rl_step(tmp_path, tiny_model_path, caplog):
    """verl's RL layout: prompt as messages, the label in reward_model.ground_truth, data_source and
    extra_info in the metadata (what a verl compute_score receives)."""
    from reinforge.loop import run_training
    from tests.integration.test_integration import read_metrics, tiny_overrides

    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [user(f"What is {i} + {i}?")],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"split": "train", "index": i},
        }
        for i in range(4)
    ]
    data = write(tmp_path / "train.parquet", rows)
    with caplog.at_level(logging.INFO, logger="reinforge.data.sources"):
        records = load_prompt_file(data)
    assert f"{data}: 4 prompts, format: verl RL (4 rows)" in caplog.text
    assert [r.label for r in records] == ["0", "2", "4", "6"]
    assert records[1].metadata == {
        "data_source": "openai/gsm8k",
        "ability": "math",
        "extra_info": {"split": "train", "index": 1},
    }
    assert records[1].prompt == [user("What is 1 + 1?")]
    out = tmp_path / "run"
    run_training(
        load_config(
            None,
            tiny_overrides(
                tiny_model_path,
                out,
                **{
                    "data.prompt_data": data,
                    "data.task_kwargs": "{}",
                    "data.n_eval_prompts": 0,
                    "train.num_rollout": 1,
                    "reward.type": "exact_match",
                    "run.save_final": "false",
                    "run.tensorboard": "false",
                },
            ),
        )
    )
    assert sum("train/loss" in r for r in read_metrics(out)) == 1


# ---------------------------------------------------------------------------- prompt data keys


def test_dotted_and_mistyped_label_keys(tmp_path):
    data = write(
        tmp_path / "p.jsonl",
        [
            {"question": "q1", "reward_model": {"ground_truth": "7"}, "answer": "a"},
            {"question": "q2", "reward_model": {"ground_truth": "8"}, "answer": "b"},
        ],
    )
    recs = load_prompt_file(data, input_key="question", label_key="reward_model.ground_truth")
    assert [r.label for r in recs] == ["7", "8"]
    with pytest.raises(DataError, match=r"p.jsonl: data.label_key='answerz' is in no row \(did you mean 'answer'\?\)"):
        load_prompt_file(data, input_key="question", label_key="answerz")
    with pytest.raises(DataError, match="data.label_key='label' is in no row.*data.label_key=null"):
        load_prompt_file(data, input_key="question")
    assert [r.label for r in load_prompt_file(data, input_key="question", label_key=None)] == [None, None]


# ---------------------------------------------------------------------------- errors and units


def test_nothing_fits_names_file_row_and_keys(tmp_path, smollm2_path):
    tok = Tokenizer(load_tokenizer(smollm2_path), None)
    rows = [{"prompt": "a", "chosen": "b", "rejected": "c"}, {"prompt": "a", "answer": "b"}]
    columns = [{"answer": None, **rows[0]}, {"chosen": None, "rejected": None, **rows[1]}]  # parquet: None = absent
    for data, where in (
        (write(tmp_path / "d.jsonl", rows), "d.jsonl:2"),
        (write(tmp_path / "d.parquet", columns), "d.parquet, row 1"),
    ):
        with pytest.raises(
            DataError,
            match=rf"{where}: no pairs format fits this row \(its keys: \['answer', "
            rf"'prompt'\]\); expected preference: 'prompt', 'chosen', 'rejected'; "
            rf"preference, implicit prompt: 'chosen', 'rejected'",
        ):
            build_examples(read_rows(data), str(data), tok, load_config(None, ["offline.method=dpo"]).offline)
    with pytest.raises(DataError, match="d.jsonl:1: no messages format fits.*'text'"):
        build_examples(
            read_rows(tmp_path / "d.jsonl"), "d.jsonl", tok, load_config(None, ["offline.method=sft"]).offline
        )


def test_implicit_prompt_extraction():
    q, c, r = [user("q")], [assistant("yes")], [assistant("no")]
    assert split_implicit_prompt(q + c, q + r, "x") == (q, c, r)
    multi = [user("q"), assistant("a"), user("more?")]
    assert split_implicit_prompt(multi + c, multi + r, "x") == (multi, c, r)
    assert split_implicit_prompt("Human: hi Assistant: hello", "Human: hi Assistant: go away", "x") == (
        "Human: hi Assistant:",
        " hello",
        " go away",
    )
    assert split_implicit_prompt("The answer is 42", "The answer is 45", "x") == ("The answer is", " 42", " 45")
    with pytest.raises(DataError, match="x: chosen and rejected share no leading message"):
        split_implicit_prompt(c, r, "x")
    with pytest.raises(DataError, match="does not continue with an assistant message"):
        split_implicit_prompt(q + c, q + [user("other")], "x")
    with pytest.raises(DataError, match="both be strings or both message lists"):
        split_implicit_prompt("a b", q + c, "x")


def test_text_trains_on_every_token_after_the_first(smollm2_path):
    hf = load_tokenizer(smollm2_path)
    prompt, resp = Tokenizer(hf, "ignored: no template for text").text("Two plus two is four.", "x")
    ids = hf("Two plus two is four.", add_special_tokens=True)["input_ids"]
    assert prompt + resp == ids + [hf.eos_token_id] and len(prompt) == 1


def test_readers(tmp_path):
    import datasets

    rows = [{"prompt": "a", "label": 1}, {"prompt": "b", "label": 2}]
    assert read_rows(write(tmp_path / "a.json", rows))[1] == (f"{tmp_path / 'a.json'}, row 1", rows[1])
    (tmp_path / "lines.json").write_text("".join(json.dumps(r) + "\n" for r in rows))  # JSON lines named .json
    assert [r for _, r in read_rows(tmp_path / "lines.json")] == rows
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(rows), "test": datasets.Dataset.from_list(rows[:1])}
    ).save_to_disk(str(tmp_path / "dd"))
    assert [r for _, r in read_rows(tmp_path / "dd")] == rows  # the train split
    (tmp_path / "plain").mkdir()
    with pytest.raises(DataError, match="not one saved with `datasets`"):
        read_rows(tmp_path / "plain")
    (tmp_path / "a.csv").write_text("prompt\na\n")
    with pytest.raises(DataError, match=r"unknown extension '.csv'"):
        read_rows(tmp_path / "a.csv")
    with pytest.raises(FileNotFoundError, match="nope.parquet not found"):
        read_rows(tmp_path / "nope.parquet")
