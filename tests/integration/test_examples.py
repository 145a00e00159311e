"""Every example config runs 2 rollouts end to end (tiny random model, CPU)."""

import json
from pathlib import Path

import pytest
import torch

from reinforge.config import load_config
from reinforge.loop import run_training
from tests.integration.test_integration import tiny_overrides

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ALGOS = ["arith_grpo", "arith_dr_grpo", "arith_rloo", "arith_reinforce_pp", "arith_ppo", "arith_dapo"]


@pytest.mark.parametrize("name", ALGOS)
def test_example_runs_two_rollouts(tmp_path, tiny_model_path, name):
    out = tmp_path / "run"
    overrides = tiny_overrides(
        tiny_model_path,
        out,
        **{
            "reward.type": "custom",
            "reward.function_path": "tests.reward_fns:even_first_token",
            "rollout.rollout_top_k": 8,
            "engine.max_num_seqs": 64,
            "data.n_eval_prompts": 0,
            "eval.n_samples_per_eval_prompt": 2,
            "eval.pass_k": "[1]",
            "run.save_final": "true",
            "rollout.n_samples_per_prompt": 4,
            "rollout.rollout_max_response_len": 12,
            "train.num_rollout": 2,
        },
    )
    if name == "arith_ppo":
        overrides.append("critic.num_warmup_rollouts=1")
    if name == "arith_dapo":
        overrides.append("algo.overlong_buffer_len=4")
    cfg = load_config(EXAMPLES / f"{name}.yaml", overrides)
    result = run_training(cfg)
    assert result.last_rollout_id == 1
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "rollout/reward_mean" in r]
    assert len(rows) == 2
    if name == "arith_ppo":
        assert "critic/value_loss" in rows[0] and "train/loss" not in rows[0]  # critic warm-up rollout
        assert "train/loss" in rows[1]
        assert (result.output_dir / "checkpoints" / "rollout_000001" / "dcp" / "critic" / ".metadata").exists()
    else:
        assert "train/loss" in rows[0]
    if name == "arith_dapo":
        assert rows[0]["rollout/dynamic_sampling_rounds"] >= 1
    if name == "arith_reinforce_pp":
        assert "train/kl" in rows[1]
    assert all(torch.isfinite(torch.tensor(r["rollout/advantage_abs_mean"])) for r in rows)


def test_ppo_resume_restores_critic(tmp_path, tiny_model_path):
    from reinforge.loop import RLLoop

    common = tiny_overrides(
        tiny_model_path,
        tmp_path / "a",
        **{
            "reward.type": "custom",
            "reward.function_path": "tests.reward_fns:even_first_token",
            "data.n_eval_prompts": 0,
            "run.keep_last_n_checkpoints": "null",
        },
    )
    first = RLLoop(load_config(EXAMPLES / "arith_ppo.yaml", common + ["train.num_rollout=1"]))
    first.train()
    head = first.cluster.worker.critic.model.value_head.weight.detach().clone()
    opt_steps = first.cluster.worker.critic.scheduler.last_epoch
    first.close()
    assert head.abs().sum() > 0  # the critic was trained
    t = RLLoop(load_config(EXAMPLES / "arith_ppo.yaml", common + ["train.num_rollout=2", f"run.load={tmp_path / 'a'}"]))
    critic = t.cluster.worker.critic
    assert torch.equal(critic.model.value_head.weight.detach(), head)
    assert critic.scheduler.last_epoch == opt_steps and len(critic.optimizer.state) > 0
    assert t.start_rollout == 1
    t.close()


def test_agent_example_runs_from_the_cli(tmp_path, tiny_model_path):
    """examples/agent_calculator.yaml through `reinforge train`: 2 rollouts of the tool-using agent."""
    from reinforge.cli import main

    out = tmp_path / "run"
    overrides = tiny_overrides(
        tiny_model_path,
        out,
        **{
            "data.n_eval_prompts": 2,
            "eval.n_samples_per_eval_prompt": 0,
            "eval.pass_k": "[]",
            "rollout.n_samples_per_prompt": 4,
            "rollout.rollout_max_response_len": 48,
            "agent.max_turn_tokens": 16,
            "engine.max_num_seqs": 16,
            "train.num_rollout": 2,
            "run.save_final": "false",
            "train.max_tokens_per_gpu": 512,
        },
    )  # the agent's system prompt and tool schema: 312 tokens
    assert main(["train", "-c", str(EXAMPLES / "agent_calculator.yaml"), *overrides]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "rollout/reward_mean" in r]
    assert len(rows) == 2
    for r in rows:
        assert r["agent/turns"] >= 1 and 0 <= r["agent/final_answer"] <= 1 and "agent/tool_calls" in r
        assert r["rollout/response_len_max"] <= 48
    config = (out / "config.yaml").read_text()
    assert "reinforge.rollout.agent:generate" in config and "calculator" in config
