"""Issue 38, rewards in a run: a custom reward's extra numbers reach the metrics; a run whose every
reward failed exits non-zero (however short) with one line naming the function, a sample and the
exception; the hint fits the failure."""

from __future__ import annotations

import traceback

import pytest

from reinforge.config import RewardConfig
from reinforge.records import Sample
from reinforge.reward import RewardManager
from reinforge.reward.manager import RewardFunctionFailing, reward_info_metrics
from tests.integration.test_integration import read_metrics, tiny_overrides


def sample(i: int = 0, label="4") -> Sample:
    return Sample(
        prompt="What is 2 + 2?",
        tokens=[1, 2, 3],
        response_length=1,
        response="<answer>4</answer>",
        label=label,
        index=i,
    )


def manager(fn: str, **kw) -> RewardManager:
    return RewardManager(RewardConfig(type="custom", function_path=f"tests.reward_fns:{fn}", **kw))


def test_reward_info_numbers_are_averaged_over_the_samples_that_hold_them():
    a, b, c = sample(0), sample(1), sample(2)
    a.reward_info, b.reward_info = {"format_ok": 1, "acc": True, "pred": "4"}, {"format_ok": 0, "acc": False}
    c.reward_info = {"reward_failure": "x", "nan": float("nan")}
    assert reward_info_metrics([a, b, c]) == {"reward_info/acc": 0.5, "reward_info/format_ok": 0.5}


def test_a_run_whose_every_reward_failed_raises_at_its_end_whatever_its_length():
    m = manager("always_raises")
    m.score([sample(0), sample(1)])  # one batch: below ALL_FAILED_LIMIT
    with pytest.raises(RewardFunctionFailing) as e:
        m.check_run()
    msg = str(e.value)
    assert "\n" not in msg and "tests.reward_fns:always_raises" in msg and "sample 0 (prompt 'What is 2 + 2?')" in msg
    assert "RuntimeError: reward bug on every sample" in msg and "reward.timeout" not in msg
    m.score([sample(0)])
    m.close()
    m = manager("returns_a_string")  # a string is not a reward
    m.score([sample(0)])
    with pytest.raises(RewardFunctionFailing, match="reward must be a finite number, got '1.0'"):
        m.check_run()
    m.close()
    m = RewardManager(RewardConfig(type="exact_match"))  # a label of the wrong type, one success: no error
    m.score([sample(0, label=["4"]), sample(1)])
    m.check_run()


def test_the_hint_fits_the_failure_and_no_event_loop_error_is_chained():
    m = manager("hangs", timeout=0.2)
    for _ in range(m.ALL_FAILED_LIMIT - 1):
        m.score([sample(0)])
    with pytest.raises(RewardFunctionFailing, match="raise reward.timeout"):
        m.score([sample(0)])
    m.close()
    m = RewardManager(RewardConfig(type="exact_match"))  # the thread path (asyncio.run)
    for _ in range(m.ALL_FAILED_LIMIT - 1):
        m.score([sample(0, label=["4"])])
    with pytest.raises(RewardFunctionFailing) as e:
        m.score([sample(0, label=["4"])])
    text = "".join(traceback.format_exception(e.value))
    assert e.value.__context__ is None and "During handling" not in text and "no running event loop" not in text
    assert "reward.timeout" not in str(e.value)


def test_one_rollout_of_failing_rewards_exits_1_in_one_line(tmp_path, tiny_model_path, capsys):
    from reinforge import cli

    out = tmp_path / "run"
    args = tiny_overrides(
        tiny_model_path,
        out,
        **{
            "train.num_rollout": 1,
            "data.n_eval_prompts": 0,
            "eval.eval_before_train": "false",
            "reward.type": "custom",
            "reward.function_path": "tests.reward_fns:always_raises",
            "run.tensorboard": "false",
        },
    )
    assert cli.main(["train", *args]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("reinforge train: error:")]
    assert len(err) == 1 and "tests.reward_fns:always_raises" in err[0] and "RuntimeError: reward bug" in err[0]
    assert "sample " in err[0] and "Traceback" not in capsys.readouterr().err


def test_reward_info_numbers_reach_the_metrics(tmp_path, tiny_model_path):
    from reinforge.config import load_config
    from reinforge.loop import run_training

    out = tmp_path / "run"
    run_training(
        load_config(
            None,
            tiny_overrides(
                tiny_model_path,
                out,
                **{
                    "train.num_rollout": 1,
                    "data.n_eval_prompts": 2,
                    "eval.eval_before_train": "false",
                    "reward.type": "custom",
                    "reward.function_path": "tests.reward_fns:with_info",
                    "run.tensorboard": "false",
                    "run.save_final": "false",
                },
            ),
        )
    )
    rows = read_metrics(out)
    train = next(r for r in rows if "rollout/reward_mean" in r)
    assert train["reward_info/format_ok"] == 1.0
    assert train["reward_info/odd"] == pytest.approx(1.0 - train["rollout/generated_reward_mean"])
    assert "reward_info/pred" not in train
    assert any("eval/reward_info/format_ok" in r for r in rows)
