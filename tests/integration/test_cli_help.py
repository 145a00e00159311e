"""Issue 57 items 12-13: the CLI's help texts, `convert`'s errors naming its flag, "did you mean" for
mistyped options and registered names, `reinforge config` without torch, and the bf16 export said
where the run prints its `next:` line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from reinforge.cli import build_parser, main
from reinforge.config import ConfigError, load_config


def subcommand_help(name: str) -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return sub.choices[name].format_help()


@pytest.mark.parametrize(
    "command,words",
    [
        ("models", ["list: each known model", "pull: the model's name", "--force", "fetch and convert again"]),
        ("convert", ["--out OUT", "the Hugging Face folder to write", "bfloat16", "float32 keeps", "replace --out"]),
        ("make-data", ["prompts of data.prompt_data", "preference pairs written per prompt", "key=value overrides"]),
        ("eval", ["key=value overrides, e.g."]),
    ],
)
def test_every_argument_has_help(command, words):
    text = subcommand_help(command)
    for w in words:
        assert w in " ".join(text.split()), (command, w)
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for action in sub.choices[command]._actions:
        assert action.help, (command, action.dest)


def test_convert_errors_name_the_checkpoint_flag(tmp_path, capsys):
    assert main(["convert", "--checkpoint", str(tmp_path / "nothing"), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert "--checkpoint=" in err and "run.load" not in err


def test_did_you_mean_for_options_and_registered_names(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--lod", "runs/x"])
    assert "--lod: did you mean --load?" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"unknown tool 'calculater' \(did you mean 'calculator'\?\)"):
        load_config(
            None, ["agent.tools=[calculater]", "rollout.custom_generate_function_path=reinforge.rollout.agent:generate"]
        )
    with pytest.raises((ConfigError, KeyError), match=r"'grpoo' \(did you mean 'grpo'"):
        load_config(None, ["algo.advantage_estimator=grpoo"])
    with pytest.raises(ConfigError, match=r"'tokn_mean' is not one of .* \(did you mean 'token_mean'"):
        load_config(None, ["algo.loss_agg_mode=tokn_mean"])


def test_reinforge_config_imports_no_torch():
    """`reinforge config` (and the config of every RL example but those naming a non-default loss) reads
    no torch: the advantage estimators' names live in reinforge/algo/registries.py, defaults skip
    their registry."""
    code = (
        "import sys\n"
        "from reinforge.cli import main\n"
        "assert main(['config', '--changed', '-c', 'examples/arith_rloo.yaml']) == 0\n"
        "assert main(['config', 'algo.advantage_estimator=gae']) == 0\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("False"), out


def test_the_next_line_says_the_export_is_bf16_and_how_to_keep_fp32(tmp_path, capsys):
    from reinforge.eval.summary import EXPORT_NOTE, next_steps, print_run_summary

    line = next_steps(tmp_path, "train", tmp_path / "checkpoints" / "rollout_000001", "train.num_rollout")
    assert "--dtype=bfloat16" in line
    print_run_summary(
        tmp_path,
        [],
        command="train",
        checkpoint=tmp_path / "checkpoints" / "rollout_000001",
        more_key="train.num_rollout",
        curve_key="reward/mean",
        eval_keys=(),
        x_label="rollout",
    )
    out = capsys.readouterr().out
    assert EXPORT_NOTE in out and "--dtype=float32 keeps them as trained" in out
