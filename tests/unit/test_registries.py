"""Rollout kinds and rewards are registries (issue 54): ``rollout.mode`` names a registered kind, the old
switches still read with a note; ``reward.type`` names a registered reward whose properties the config,
the data checks and the evaluation read."""

from __future__ import annotations

import logging

import pytest

from reinforge.config import ConfigError, load_config
from reinforge.rollout.kinds import AGENT_LOOP, ROLLOUT_KINDS


def test_rollout_mode_names_a_registered_kind():
    assert ROLLOUT_KINDS.names() == ["default", "over_sampling", "agent"]
    cfg = load_config(None, ["rollout.mode=agent"])
    assert cfg.rollout.custom_generate_function_path == AGENT_LOOP  # the kind's generate function
    assert load_config(None, ["agent.tools=[calculator]"]).rollout.mode == "agent"  # switched on by the section
    assert load_config(None, []).rollout.mode == "default"
    with pytest.raises(ConfigError, match="did you mean 'agent'"):
        load_config(None, ["rollout.mode=agnt"])
    with pytest.raises(ConfigError, match="needs rollout.over_sampling_batch_size"):
        load_config(None, ["rollout.mode=over_sampling"])
    with pytest.raises(ConfigError, match="unset one of the two"):
        load_config(None, ["rollout.mode=agent", "rollout.custom_generate_function_path=mypkg.gen:generate"])
    with pytest.raises(ConfigError, match="is read by rollout.mode=over_sampling"):
        load_config(None, ["rollout.mode=agent", "rollout.over_sampling_batch_size=16"])


@pytest.mark.parametrize(
    "old, mode",
    [
        (f"rollout.custom_generate_function_path={AGENT_LOOP}", "agent"),
        ("rollout.over_sampling_batch_size=16", "over_sampling"),
    ],
)
def test_the_old_rollout_switches_still_read_with_a_note(old, mode, caplog):
    with caplog.at_level(logging.WARNING, logger="reinforge.config.root"):
        cfg = load_config(None, [old])
    assert cfg.rollout.mode == mode
    notes = [r.getMessage() for r in caplog.records if "rollout.mode" in r.getMessage()]
    assert len(notes) == 1 and "\n" not in notes[0], notes
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="reinforge.config.root"):
        load_config(None, [old, f"rollout.mode={mode}"])  # the new spelling with it: no note
    assert not [r for r in caplog.records if "rollout.mode" in r.getMessage()]


def test_a_rewards_properties_are_what_config_data_and_eval_read(monkeypatch):
    """A reward registered with properties is checked and named by them, not by its name."""
    from reinforge.data.dataset import check_reward_fits
    from reinforge.data.files import DataError
    from reinforge.data.sources import PromptRecord
    from reinforge.eval.evaluate import threshold_metric_names
    from reinforge.reward.registry import REWARDS
    from reinforge.utils.registry import Entry

    entry = Entry("graded", "reinforge.reward.functions:math_reward", {"label": "required", "how": "a rubric"})
    monkeypatch.setitem(REWARDS._entries, "graded", entry)
    cfg = load_config(None, ["reward.type=graded"])  # a registered name is a choice
    assert cfg.reward.properties["how"] == "a rubric"
    records = [PromptRecord(prompt="2+2?", label=None, metadata={})]
    with pytest.raises(DataError, match=r"reward.type=graded scores by comparing .* \(a rubric\)"):
        check_reward_fits(cfg.reward, records, "p.jsonl", "label")
    assert threshold_metric_names("graded") == ("eval/greedy_accuracy", "eval/pass@")
    monkeypatch.setitem(entry.info, "preference", True)
    assert threshold_metric_names("graded") == ("eval/greedy_score_above_threshold", "eval/score_above_threshold@")
    monkeypatch.setitem(entry.info, "needs", "model_path")
    with pytest.raises(ConfigError, match="reward.type=graded needs reward.model_path"):
        load_config(None, ["reward.type=graded"])
    with pytest.raises(ConfigError, match="use type model or graded"):
        load_config(None, ["reward.model_path=/rm"])
