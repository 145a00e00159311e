"""Issue 57, "failures that look like success": a sample whose environment, sandbox, MCP server or
judge failed is infrastructure's failure, never the model's score. The accounting of that: one guard
that stops a run of nothing but failures, one warning per kind, the rollout metrics and evaluation
over the scored samples only (reinforge/rollout/infra_guard.py, loop.rollout_metrics, eval/evaluate.py)."""

from __future__ import annotations

import json
import logging
import math

import pytest

from reinforge.config import load_config
from reinforge.envs import Environment, Step, Turn
from reinforge.records import Sample
from reinforge.rollout.infra_guard import InfraFailing, InfraGuard, mark_failed
from tests.integration.test_agent import ScriptedEngine, agent_ctx, make_prompt, tok  # noqa: F401 (tok: a fixture)
from tests.integration.test_integration import read_metrics, tiny_overrides

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


class BrokenInit(Environment):
    """An environment whose constructor raises on every sample (the issue's GuessEnv)."""

    def __init__(self, row, ctx):
        raise RuntimeError("the game server is unreachable")


class FailsOnSome(Environment):
    """One turn, reward 1; raises in step() when the prompt holds the word FAIL."""

    def step(self, turn: Turn) -> Step:
        if "FAIL" in str(self.row["prompt"]):
            raise ConnectionError("the simulator went away")
        return Step(done=True, reward=1.0)


def _sample(i: int, reward: float = 1.0, failed: str | None = None) -> Sample:
    s = Sample("p", [1, 2, 3], 2, reward=reward, index=i, loss_mask=[1, 1])
    if failed:
        mark_failed(s, failed, f"{failed} broke on sample {i}")
    return s


# ------------------------------------------------------------------------------------ the guard


def test_the_guard_warns_once_per_kind_with_its_reason_then_counts(caplog):
    guard = InfraGuard()
    with caplog.at_level(logging.WARNING, logger="reinforge.rollout.infra_guard"):
        m0 = guard.observe(0, [_sample(0, failed="sandbox"), _sample(1), _sample(2, failed="judge")])
        m1 = guard.observe(1, [_sample(0, failed="sandbox"), _sample(1, failed="sandbox"), _sample(2)])
        m2 = guard.observe(2, [_sample(0), _sample(1)])
    first = [r.getMessage() for r in caplog.records if "further" in r.getMessage()]
    assert len(first) == 2  # one line per kind, with the reason of its first occurrence
    assert any("(sandbox)" in x and "sandbox broke on sample 0" in x for x in first)
    assert any("(judge)" in x and "judge broke on sample 2" in x for x in first)
    counts = [r.getMessage() for r in caplog.records if "failed by infrastructure" in r.getMessage()]
    assert counts == [
        "rollout 0: 2 of 3 samples failed by infrastructure (judge 1, sandbox 1): left out of training",
        "rollout 1: 2 of 3 samples failed by infrastructure (sandbox 2): left out of training",
    ]
    assert m0 == {"rollout/infra_failed/judge": 1.0, "rollout/infra_failed/sandbox": 1.0}
    assert m1 == {"rollout/infra_failed/judge": 0.0, "rollout/infra_failed/sandbox": 2.0}
    assert m2 == {"rollout/infra_failed/judge": 0.0, "rollout/infra_failed/sandbox": 0.0}
    guard.check_run()  # some samples were scored: no error


def test_the_guard_stops_after_three_all_failed_rollouts_in_a_row():
    guard = InfraGuard()
    all_failed = [_sample(0, failed="mcp_server"), _sample(1, failed="mcp_server")]
    guard.observe(0, all_failed)
    guard.observe(1, all_failed)
    guard.observe(2, [_sample(0), _sample(1, failed="mcp_server")])  # one scored sample: the streak restarts
    guard.observe(3, all_failed)
    guard.observe(4, all_failed)
    with pytest.raises(
        InfraFailing, match=r"every sample of 3 consecutive rollouts .* mcp_server 2.*agent\.mcp_servers"
    ):
        guard.observe(5, all_failed)


def test_a_run_or_an_evaluation_of_nothing_but_failures_ends_in_error():
    guard = InfraGuard()
    guard.observe(0, [_sample(0, failed="environment")])
    with pytest.raises(InfraFailing, match=r"every sample of this run's rollouts .* environment broke on sample 0"):
        guard.check_run()
    evaluation = InfraGuard()  # reinforge eval: no rollouts
    assert evaluation.observe_eval("eval", [_sample(0, failed="judge"), _sample(1, failed="judge")]) == 2
    with pytest.raises(InfraFailing, match=r"every sample of this run's evaluations failed .* judge 2.*judge\.url"):
        evaluation.check_run()


def test_a_broken_environment_stops_the_run_instead_of_training_on_nothing(tmp_path, tiny_model_path, caplog):
    """The issue's case: the environment raises in __init__ on every sample. Before: three rollouts
    'trained' (loss 0), a checkpoint, exit 0, not a word. Now: one warning with the reason, the
    rollout metrics say every sample failed, and the third all-failed rollout stops the run."""
    from reinforge.loop import run_training

    out = tmp_path / "run"
    cfg = load_config(
        None,
        tiny_overrides(
            tiny_model_path,
            out,
            **{
                "rollout.custom_generate_function_path": "reinforge.rollout.agent:generate",
                "agent.environment": "tests.integration.test_infra_accounting:BrokenInit",
                "rollout.rollout_max_response_len": 16,
                "train.num_rollout": 4,
                "data.n_eval_prompts": 0,
                "run.save_final": "false",
            },
        ),
    )
    with caplog.at_level(logging.WARNING), pytest.raises(InfraFailing, match="every sample of 3 consecutive rollouts"):
        run_training(cfg)
    warned = [r.getMessage() for r in caplog.records if "infrastructure failure (environment)" in r.getMessage()]
    assert len(warned) == 1 and "the game server is unreachable" in warned[0]
    rows = [m for m in read_metrics(out) if "rollout/infra_failed_samples" in m]
    assert [int(m["rollout_id"]) for m in rows] == [0, 1]  # the third all-failed rollout is not trained on
    for m in rows:  # every sample failed: counted as such, and no reward mean of placeholder zeros
        assert m["rollout/infra_failed_samples"] == 8 and m["rollout/infra_failed/environment"] == 8
        assert m["rollout/num_samples"] == 0 and math.isnan(m["rollout/reward_mean"])


# ------------------------------------------------------------------------------ rollout metrics


def test_rollout_metrics_count_failed_samples_also_when_all_failed():
    from reinforge.loop import rollout_metrics

    cfg = load_config(None, [])
    m = rollout_metrics(cfg, [[_sample(0, 0.0, failed="environment"), _sample(1, 0.0, failed="environment")]])
    assert m["rollout/infra_failed_samples"] == 2 and m["rollout/num_samples"] == 0
    assert math.isnan(m["rollout/reward_mean"]) and math.isnan(m["rollout/correct"])
    m = rollout_metrics(cfg, [[_sample(0, 1.0), _sample(1, 0.0, failed="judge"), _sample(2, 0.5)]])
    assert m["rollout/infra_failed_samples"] == 1 and m["rollout/reward_mean"] == 0.75


# ---------------------------------------------------------------------------------- evaluation


def test_evaluation_reports_accuracy_over_scored_samples_and_the_failed_count(tok, tmp_path):
    """An environment failing on 1 of 4 prompts: greedy accuracy 3 of 3 (not 0.750), the failed
    samples counted in the metrics, the eval files and the table."""
    from reinforge.eval.evaluate import evaluate, format_table, write_eval

    engine = ScriptedEngine(tok, lambda prompt, turn: "done")
    ctx = agent_ctx(
        tok,
        engine,
        "agent.environment=tests.integration.test_infra_accounting:FailsOnSome",
        "eval.n_samples_per_eval_prompt=2",
        "eval.pass_k=[1,2]",
    )
    prompts = [make_prompt(ctx, q) for q in ("a", "b", "FAIL c", "d")]
    for i, p in enumerate(prompts):
        p.index = i
    try:
        metrics, samples = evaluate(ctx, prompts)
    finally:
        ctx.close()
    assert metrics["eval/greedy_accuracy"] == 1.0 and metrics["eval/greedy_reward"] == 1.0
    assert metrics["eval/pass@1"] == 1.0 and metrics["eval/pass@2"] == 1.0
    assert metrics["eval/greedy_failed"] == 1 and metrics["eval/failed_samples"] == 3
    write_eval(tmp_path, "after", metrics, samples)
    row = json.loads((tmp_path / "eval.jsonl").read_text())
    assert row["eval/failed_samples"] == 3 and row["eval/greedy_accuracy"] == 1.0
    written = [json.loads(x) for x in (tmp_path / "eval" / "after.jsonl").read_text().splitlines()]
    assert [w["greedy"] for w in written] == [True] * 4 + [False] * 8  # (reinforge compare pairs the greedy ones)
    failed = [w for w in written if w["status"] == "failed"]
    assert len(failed) == 3 and all(w["reward"] is None and w["infra_failure_kind"] == "environment" for w in failed)
    assert all("the simulator went away" in w["infra_failure"] for w in failed)
    table = format_table([("policy", metrics)])
    assert "failed_samples" in table.splitlines()[0] and "3.000" in table.splitlines()[2]


# ---------------------------------------------------------------------- NaN and infinite labels


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_a_nan_or_infinite_label_is_refused_naming_the_file_and_line(tmp_path, value):
    from reinforge.data.files import DataError
    from reinforge.data.sources import load_prompt_file

    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "1 + 1?", "label": 2}\n{"prompt": "0 / 0?", "label": ' + value + "}\n")
    with pytest.raises(DataError, match=r"prompts.jsonl:2: 'label' \(data.label_key\) is -?(nan|inf)\b.*score 0"):
        load_prompt_file(path)
    assert len(load_prompt_file(path, label_key=None)) == 2  # no reference answers read: nothing to refuse


@pytest.mark.parametrize("reward_type", ["exact_match", "math"])
def test_a_nan_label_is_a_counted_reward_error_not_a_silent_zero(reward_type):
    from reinforge.config import RewardConfig
    from reinforge.reward.manager import RewardManager

    samples = [
        Sample("0 / 0?", [1, 2, 3], 2, response="nan", label=float("nan"), index=0),
        Sample("1 / 0?", [1, 2, 3], 2, response="inf", label=float("inf"), index=1),
        Sample("1 + 1?", [1, 2, 3], 2, response="2", label=2, index=2),
    ]
    counts = RewardManager(RewardConfig(type=reward_type, timeout=120)).score(samples)  # math: a slow first import
    assert counts["reward/errors"] == 2 and samples[2].reward == 1.0
    assert "label (data.label_key) is nan" in samples[0].reward_info["reward_failure"]


def test_evaluation_with_a_judge_that_fails_on_half_reports_the_scored_half(tok):
    """The issue's case: the judge scores 2 of 4 greedy answers correct and fails on the other 2.
    Before: greedy_accuracy 0.500; now 1.000 over the 2 scored, 2 failed."""
    from reinforge.eval.evaluate import evaluate
    from reinforge.reward.manager import RewardManager
    from reinforge.rollout.generate import RolloutContext
    from tests.integration.test_agent import IM_END
    from tests.integration.test_judge import Judge

    judge = Judge(reply=lambda p: "I cannot tell." if "broken" in p else "Correct.\n10")
    try:
        cfg = load_config(
            None,
            [
                "reward.type=judge",
                f"judge.url={judge.url}",
                "judge.model=m",
                "eval.n_samples_per_eval_prompt=0",
                "eval.pass_k=[1]",
                "rollout.rollout_max_response_len=8",
            ],
        )
        engine = ScriptedEngine(tok, lambda prompt, turn: "4")
        ctx = RolloutContext(cfg, engine, tok, RewardManager(cfg.reward, run=cfg), [IM_END])
        prompts = [make_prompt(ctx, q) for q in ("2 + 2?", "1 + 3?", "broken 1?", "broken 2?")]
        metrics, samples = evaluate(ctx, prompts)
    finally:
        judge.close()
    assert metrics["eval/greedy_accuracy"] == 1.0 and metrics["eval/greedy_failed"] == 2
    assert metrics["eval/failed_samples"] == 2 and metrics["eval/reward_errors"] == 2
    assert sorted(s.metadata.get("infra_failure_kind", "-") for s in samples) == ["-", "-", "judge", "judge"]
