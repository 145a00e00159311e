"""Issue 38 items 8 and 10: messages that point the right way, help texts with meaning and defaults,
quiet logs, eval rows named after the checkpoint."""

from __future__ import annotations

import logging

import pytest

from reinforge import cli
from reinforge.config import ConfigError, load_config
from reinforge.data import DataError
from reinforge.data.files import read_rows


def test_a_json_line_cut_short_is_reported_at_its_end_not_column_1(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a", "label": 1}\n{"prompt": "b", "label": 2\n')
    with pytest.raises(
        DataError,
        match=r"p.jsonl:2: not valid JSON \(.* at the end of the line, column 27: the "
        r"object is not closed",
    ):
        read_rows(f)
    f.write_text('{"prompt": "b" "label": 2}\n')
    with pytest.raises(DataError, match=r"p.jsonl:1: not valid JSON \(Expecting ',' delimiter at column 16\)"):
        read_rows(f)


def test_an_empty_offline_file_says_so(tmp_path):
    from reinforge.data.offline import build_examples

    cfg = load_config(None, ["offline.method=sft"])
    with pytest.raises(DataError, match=r"e.jsonl: no rows \(an empty file\?\)") as e:
        build_examples([], "e.jsonl", None, cfg.offline)
    assert "max_length" not in str(e.value)


def test_an_optional_literal_lists_its_values_and_the_closest():
    with pytest.raises(
        ConfigError,
        match=r"run.wandb_mode: 'ofline' is not one of \['online', 'offline', "
        r"'disabled'\] \(did you mean 'offline'\?\) \(or null\)",
    ):
        load_config(None, ["run.wandb_mode=ofline"])


def test_generate_and_eval_help_say_what_flags_mean(capsys):
    for cmd in (["generate", "--help"], ["eval", "--help"]):
        with pytest.raises(SystemExit):
            cli.main(cmd)
    out = " ".join(capsys.readouterr().out.split())
    assert "completions to sample (default: 1)" in out and "new tokens per completion at most (default: 128)" in out
    assert "0 is greedy (default: 0.0)" in out
    assert ".parquet file or saved `datasets` folder" in out


def test_config_section_of_an_unread_section_shows_its_values(capsys):
    cli.main(["config", "--section", "critic"])
    out = capsys.readouterr().out
    assert out.startswith("# critic: not read by this config") and "critic:\n  path: null" in out


def test_math_verify_does_not_warn_about_its_disabled_timeout(caplog):
    import math_verify.grader
    import math_verify.parser

    from reinforge.config import RewardConfig
    from reinforge.records import Sample
    from reinforge.reward import RewardManager

    math_verify.grader.TIMEOUT_WARNING_SHOWN = False  # as in a fresh process
    if hasattr(math_verify.parser, "TIMEOUT_WARNING_SHOWN"):
        math_verify.parser.TIMEOUT_WARNING_SHOWN = False
    samples = [Sample(prompt="p", tokens=[1, 2], response_length=1, response="4", label="4") for _ in range(8)]
    with caplog.at_level(logging.WARNING):
        RewardManager(RewardConfig(type="math")).score(samples)
    assert all(s.reward == 1.0 for s in samples) and "Timeout is disabled" not in caplog.text


def test_an_eval_row_of_a_checkpoint_names_its_run_and_rollout():
    from reinforge.eval.evaluate import model_label

    assert model_label("runs/arith/checkpoints/rollout_000099/model") == "arith/rollout_000099"
    assert model_label("/models/smollm2-135m-instruct") == "smollm2-135m-instruct"


@pytest.mark.parametrize(
    "train,extra,says",
    [
        ("", {}, r"t.jsonl: no rows \(an empty file\?\)"),  # through the loader, with the default eval_fraction
        (
            '{"prompt": "a", "completion": "b"}\n',
            {"offline.eval_fraction": 0.5},
            r"all 1 row\(s\) went to the held-out",
        ),
        ('{"prompt": "a", "completion": "b"}\n', {"offline.eval_data": "e.jsonl"}, r"e.jsonl: no rows \(an empty file"),
    ],
)
def test_offline_files_without_training_or_eval_rows_say_why(tmp_path, smollm2_path, train, extra, says):
    """Before: a 1-row file held out whole said 'no rows (an empty file?)', and an empty
    offline.eval_data was skipped without a word."""
    from reinforge.data.offline import load_offline_datasets
    from reinforge.models.loading import load_tokenizer

    (tmp_path / "t.jsonl").write_text(train)
    (tmp_path / "e.jsonl").write_text("")
    extra = {k: str(tmp_path / v) if k == "offline.eval_data" else v for k, v in extra.items()}
    cfg = load_config(
        None,
        ["offline.method=sft", f"offline.train_data={tmp_path / 't.jsonl'}", *(f"{k}={v}" for k, v in extra.items())],
    )
    with pytest.raises(DataError, match=says):
        load_offline_datasets(cfg.offline, load_tokenizer(smollm2_path), None, 0)
