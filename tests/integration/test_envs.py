"""The environment interface of the agent loop (issue 35): a stateful environment with its own
initial messages and per-turn rewards, environment failures as infrastructure failures (the
sample dropped from its group's statistics, never scored 0), and the advantage math of that."""

import json
import os

import pytest
import torch

from reinforge.algo.advantages import grpo_advantages, rloo_advantages
from reinforge.config import load_config
from reinforge.envs import Environment, load_environment
from reinforge.loop import run_training
from reinforge.records import Status
from reinforge.rollout.generate import generate_groups
from reinforge.train.rollout_advantages import compute_advantages
from tests.integration.test_agent import (  # noqa: F401
    ScriptedEngine,
    agent_ctx,
    check_token_in_token_out,
    make_prompt,
    run_agent,
    tok,
)
from tests.integration.test_integration import read_metrics, tiny_overrides

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def test_a_stateful_environment_with_initial_messages_and_turn_rewards(tok):
    script = lambda prompt, turn: "next" if turn < 2 else "stop"  # noqa: E731
    engine = ScriptedEngine(tok, script)
    ctx = agent_ctx(tok, engine, "agent.environment=tests.agent_envs:Countdown", "agent.environment_kwargs={start: 3}")
    (s,) = run_agent(ctx, "REPLACED: reset() gives the messages")
    prompt = tok.decode(engine.calls[0][0])
    assert "Count down from 3." in prompt and "REPLACED" not in prompt
    check_token_in_token_out(s, engine.calls)
    assert [tok.decode(engine.calls[k][0]).split("<|im_start|>user\n")[-1].split("<|im_end|>")[0] for k in (1, 2)] == [
        "2",
        "1",
    ]  # the observations, in the template's user turns
    # two "next" turns (0.25 each) + "stop" at 1 (label None: 0) + the final 0.5
    assert s.metadata["turn_rewards"] == [0.25, 0.25, 0.0] and s.reward == pytest.approx(1.0)
    assert s.status == Status.COMPLETED and s.metadata["rollout_stats"]["env/left"] == 1.0


def test_environment_names_and_paths():
    assert load_environment("tools").__name__ == "ToolEnv"
    with pytest.raises(ValueError, match="agent.environment: unknown environment 'nope'.*registered: tools"):
        load_environment("nope")
    with pytest.raises(ValueError, match="not a subclass"):
        load_environment("tests.agent_tools:echo")
    from reinforge.config.fields import ConfigError

    with pytest.raises(ConfigError, match="agent.environment"):
        load_config(None, ["agent.environment=nope"])


def test_an_environment_switches_the_agent_loop_on(tmp_path):
    """Issue 57 item 7: agent.environment (or agent.tools) without
    rollout.custom_generate_function_path selects the agent loop instead of being ignored (or
    refused); the docs' environment YAML (docs/agents.md) loads as written and selects it."""
    import re

    loop = "reinforge.rollout.agent:generate"
    assert load_config(None, []).rollout.custom_generate_function_path is None  # no agent: single-turn
    for overrides in (["agent.environment=swe"], ["agent.tools=[calculator]"]):
        assert load_config(None, overrides).rollout.custom_generate_function_path == loop, overrides
    own = ["agent.environment=swe", "rollout.custom_generate_function_path=tests.agent_tools:fixed_generate"]
    assert load_config(None, own).rollout.custom_generate_function_path == "tests.agent_tools:fixed_generate"
    docs = os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs", "agents.md"
    )
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", open(docs).read(), re.S) if "environment:" in b]
    assert blocks
    for i, block in enumerate(blocks):
        path = tmp_path / f"env{i}.yaml"
        path.write_text(block.replace("my_module:MyEnv", "tests.agent_envs:Countdown"))
        cfg = load_config(str(path), [])
        assert cfg.rollout.custom_generate_function_path == loop and cfg.agent.environment != "tools", block


def test_a_reset_prompt_longer_than_the_engine_holds_fails_only_its_episode(tok):
    """Issue 57 item 5: a reset() prompt longer than data.rollout_max_prompt_len (what the engine
    is sized for) fails that episode, naming the key to raise; the others run."""
    engine = ScriptedEngine(tok, lambda p, t: "done")
    ctx = agent_ctx(
        tok,
        engine,
        "agent.environment=tests.agent_envs:LongReset",
        "agent.environment_kwargs={words: 200}",
        "data.rollout_max_prompt_len=700",  # the tools' description is about 550 tokens
    )
    short, long = run_agent(ctx, "short", "long")
    assert short.status == Status.COMPLETED and short.reward == 1.0, short.metadata.get("infra_failure")
    assert long.status == Status.FAILED and long.response_length == 0, long.metadata
    assert "raise data.rollout_max_prompt_len" in long.metadata["infra_failure"]
    assert long.metadata["rollout_stats"]["agent/overlong_prompts"] == 1.0
    assert all(len(c[0]) <= 700 for c in engine.calls)  # the long prompt never reached the engine


def test_the_engine_is_sized_for_environment_prompts():
    """Issue 57 item 5: the engine's max_model_len makes room for reset() prompts up to
    data.rollout_max_prompt_len (or the environment's declared max_prompt_tokens), not only for the
    data's prompts (which an environment's reset() may replace by longer ones)."""
    from types import SimpleNamespace

    from reinforge.loop import RLLoop

    def engine_len(*overrides):
        cfg = load_config(None, ["rollout.rollout_max_response_len=7", *overrides])
        fake = SimpleNamespace(cfg=cfg, train_data=SimpleNamespace(max_prompt_tokens=67), eval_data=None)
        return RLLoop._max_model_len(fake)

    assert engine_len() == 74  # single-turn: the data's prompts
    assert engine_len("agent.environment=tools", "agent.tools=[calculator]") == 74  # no reset() of its own
    assert engine_len("agent.environment=tests.agent_envs:LongReset", "data.rollout_max_prompt_len=87") == 94
    assert engine_len("agent.environment=tests.agent_envs:DeclaredReset") == 307
    from reinforge.rollout.agent import env_prompt_bound

    cfg = load_config(None, ["agent.environment=tests.agent_envs:DeclaredReset"])
    assert env_prompt_bound(cfg) == (300, "tests.agent_envs.DeclaredReset.max_prompt_tokens")


@pytest.mark.parametrize(
    "how, message",
    [
        ("raise", "KeyError: 'boom'"),
        ("hang", "agent.env_timeout=0.5"),
        ("malformed", "messages must be a list"),
        ("not_a_step", "not a reinforge.envs.Step"),
    ],
)
def test_an_environment_failure_is_an_infrastructure_failure(tok, how, message):
    engine = ScriptedEngine(tok, lambda p, t: "hello")
    ctx = agent_ctx(
        tok,
        engine,
        "agent.environment=tests.agent_envs:Broken",
        f"agent.environment_kwargs={{how: {how}}}",
        "agent.env_timeout=0.5",
    )
    samples = run_agent(ctx, "a", "b")
    for s in samples:
        assert s.status == Status.FAILED and message in s.metadata["infra_failure"], s.metadata
        assert s.metadata["rollout_stats"]["agent/infra_failures"] == 1.0
        assert s.loss_mask == [0] * s.response_length and s.reward == 0.0  # a placeholder, never trained on


def test_a_hung_plain_method_costs_only_its_episode(tok):
    """Issue 57 item 6: with one worker (agent.tool_concurrency=1) a plain step() that hangs fails
    its own episode at agent.env_timeout; the other episodes, behind it, run as usual."""
    engine = ScriptedEngine(tok, lambda p, t: "hello")
    ctx = agent_ctx(
        tok,
        engine,
        "agent.environment=tests.agent_envs:Broken",
        "agent.environment_kwargs={how: hang, which: [0]}",
        "agent.env_timeout=0.5",
        "agent.tool_concurrency=1",
    )
    prompts = [make_prompt(ctx, f"q{i}") for i in range(4)]
    for i, p in enumerate(prompts):
        p.metadata["i"] = i
    samples = [s for g in generate_groups(ctx, prompts, 1, ctx.sampling_params()) for s in g]
    assert samples[0].status == Status.FAILED and "agent.env_timeout=0.5" in samples[0].metadata["infra_failure"]
    assert [s.status for s in samples[1:]] == [Status.COMPLETED] * 3, [s.metadata for s in samples]
    assert [s.reward for s in samples[1:]] == [1.0] * 3


EXITING = """
import sys
from reinforge.config import load_config
from reinforge.data import Prompt
from reinforge.models.loading import load_tokenizer
from reinforge.records import FinishReason, GenerateResult
from reinforge.rollout.generate import RolloutContext, generate_groups

class Engine:
    weight_version = 0
    def generate(self, requests):
        return [[GenerateResult([28, 2], [-0.1, -0.1], FinishReason.STOP, 0)] * r.n for r in requests]

tok = load_tokenizer(sys.argv[1])
for env, hows in [("Exits", ["exit", "sys_exit", "hang"]), ("ExitsAsync", ["exit", "sys_exit"])]:
    cfg = load_config(None, ["rollout.custom_generate_function_path=reinforge.rollout.agent:generate",
                             f"agent.environment=tests.agent_envs:{env}", "agent.env_timeout=0.5"])
    ctx = RolloutContext(cfg, Engine(), tok, None, [2])
    prompts = [Prompt(h, h, tok(h)["input_ids"], None, {}) for h in hows]
    for (s,) in generate_groups(ctx, prompts, 1, ctx.sampling_params()):
        print("RESULT", env, s.prompt, s.status.value, s.metadata.get("infra_failure"), flush=True)
print("SUMMARY", flush=True)
"""


def test_an_environment_cannot_end_or_hold_the_trainer(smollm2_path):
    """Issue 57 item 16: os._exit / sys.exit in an environment method (plain or async) fails that
    episode, naming the method, instead of ending the trainer; a plain method hung past
    agent.env_timeout does not keep the process alive after its last line (its thread is not
    waited for at exit)."""
    import os
    import subprocess
    import sys
    import time

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    start = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-c", EXITING, str(smollm2_path)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0 and p.stdout.rstrip().endswith("SUMMARY"), p.stdout + p.stderr[-3000:]
    assert time.monotonic() - start < 110  # not the 300 s of the hung step
    lines = [line for line in p.stdout.splitlines() if line.startswith("RESULT")]
    assert lines == [
        "RESULT Exits exit failed Exits.step called os._exit(7): it ends its episode, not the trainer",
        "RESULT Exits sys_exit failed Exits.step called sys.exit(3): it ends its episode, not the trainer",
        "RESULT Exits hang failed Exits.step did not return within agent.env_timeout=0.5 s",
        "RESULT ExitsAsync exit failed ExitsAsync.step called os._exit(5): it ends its episode, not the trainer",
        "RESULT ExitsAsync sys_exit failed ExitsAsync.step called sys.exit(4): it ends its episode, not the trainer",
    ], p.stdout


def test_a_huge_observation_is_cut_without_tokenising_it_whole(tok):
    import time

    engine = ScriptedEngine(tok, lambda p, t: "hello")
    ctx = agent_ctx(
        tok,
        engine,
        "agent.environment=tests.agent_envs:Broken",
        "agent.environment_kwargs={how: huge}",
        "agent.max_turns=2",
        "agent.tool_output_max_tokens=16",
    )
    t = time.perf_counter()
    (s,) = run_agent(ctx, "a")
    assert time.perf_counter() - t < 5 and s.status != Status.FAILED
    delta = tok.decode(engine.calls[1][0][len(engine.calls[0][0]) + len(engine.calls[0][1]) :])
    assert "[output truncated]" in delta and delta.count("x") < 200


def test_failed_samples_are_left_out_of_the_group_statistics():
    """A group (1, 0, <failed>, 1) gets the advantages of the group (1, 0, 1), the failed sample 0;
    the same for RLOO; a group left with one valid sample gets 0."""
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    valid = torch.tensor([[True, True, False, True], [True, False, False, False]])
    expect = grpo_advantages(torch.tensor([[1.0, 0.0, 1.0]]))[0]
    got = grpo_advantages(r, valid=valid)
    assert torch.allclose(got[0, [0, 1, 3]], expect) and got[0, 2] == 0 and (got[1] == 0).all()
    expect = rloo_advantages(torch.tensor([[1.0, 0.0, 1.0]]))[0]
    got = rloo_advantages(r, valid=valid)
    assert torch.allclose(got[0, [0, 1, 3]], expect) and got[0, 2] == 0 and (got[1] == 0).all()


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_plus_plus_baseline", "reinforce_plus_plus"])
def test_compute_advantages_ignores_failed_samples(estimator):
    from reinforge.records import Sample

    def sample(reward, status=Status.COMPLETED, n=3):
        return Sample(
            "p", [1] * (2 + n), n, reward=reward, loss_mask=[1] * n, rollout_log_probs=[0.0] * n, status=status
        )

    cfg = load_config(None, [f"algo.advantage_estimator={estimator}"]).algo
    with_failed = [[sample(1.0), sample(0.0), sample(0.0, Status.FAILED), sample(1.0)]]
    without = [[sample(1.0), sample(0.0), sample(1.0)]]
    a = compute_advantages(cfg, with_failed, 16).advantages
    b = compute_advantages(cfg, without, 16).advantages
    assert torch.equal(a[2], torch.zeros(3))
    for x, y in zip([a[0], a[1], a[3]], b):
        assert torch.allclose(x, y, atol=1e-6), (estimator, a, b)


def test_training_goes_on_when_some_episodes_fail(tmp_path, tiny_model_path):
    """A run whose environment fails on some episodes trains on the others and counts the failures."""
    out = tmp_path / "run"
    result = run_training(
        load_config(
            None,
            tiny_overrides(
                tiny_model_path,
                out,
                **{
                    "rollout.custom_generate_function_path": "reinforge.rollout.agent:generate",
                    "agent.environment": "tests.agent_envs:Broken",
                    "agent.environment_kwargs": "{how: raise, which: [0]}",
                    "rollout.rollout_max_response_len": 16,
                    "run.save_final": "false",
                    "run.dump_rollouts": "true",
                    "data.prompt_data": str(_indexed_prompts(tmp_path)),
                    "data.task_kwargs": "{}",
                    "data.num_prompts": 16,
                },
            ),
        )
    )
    assert result.last_rollout_id == 1
    rows = [m for m in read_metrics(out) if "train/loss" in m]
    assert rows and all(m["rollout/infra_failed_samples"] > 0 and m["agent/infra_failures"] > 0 for m in rows)
    assert all(m["rollout/reward_mean"] == 1.0 for m in rows)  # the failed ones are not averaged in as 0
    dumped = [json.loads(line) for line in (out / "rollouts" / "000000.jsonl").read_text().splitlines()]
    assert any(d["status"] == "failed" for d in dumped) and any(d["status"] != "failed" for d in dumped)


def _indexed_prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(
        "".join(
            json.dumps({"prompt": f"Say {i}.", "label": str(i), "metadata": {"i": i % 2}}) + "\n" for i in range(16)
        )
    )
    return path


def test_the_environment_base_class_needs_step():
    with pytest.raises(NotImplementedError):
        import asyncio

        asyncio.run(Environment({}, None).step(None))
