"""Per-turn rewards of multi-turn episodes (issue 35 item 1): each turn's reward placed at the last
token of that turn's model output for the token-level estimators (``agent.turn_reward:
discounted``, a discount per turn), the sum otherwise; the refusals; and an episode's turns and
tool calls in the run's trace."""

import pytest
import torch

from reinforge.algo.advantages import (
    AdvantageInputs,
    gae_advantages,
    masked_whiten,
    place_turn_rewards,
    reinforce_plus_plus_returns,
    turn_discounts,
)
from reinforge.config import ConfigError, load_config
from reinforge.records import Sample, Status
from reinforge.train.rollout_advantages import compute_advantages
from reinforge.utils import trace
from tests.integration.test_agent import ScriptedEngine, agent_ctx, call, check_token_in_token_out, run_agent, tok  # noqa: F401

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

AGENT = "rollout.custom_generate_function_path=reinforge.rollout.agent:generate"

# one response of 8 tokens: turn 0 = model tokens 0-2, an observation at 3-4 (loss mask 0), turn 1 = model
# tokens 5-7; turn rewards 0.5 and 1.0, a final reward 2.0: the sample's reward is their sum, 3.5
LOSS_MASK = [1, 1, 1, 0, 0, 1, 1, 1]
ENDS, TURN_REWARDS, REWARD = [2, 7], [0.5, 1.0], 3.5


def reference_returns(gamma, d, values=None, lam=1.0):
    """Returns (and GAE advantages) of that response by hand, over the policy steps 0 1 2 5 6 7:
    rewards 0.5 at step 2, 1.0 + 2.0 at step 7; the discount from step 2 to step 5 is gamma * d."""
    steps = [0, 1, 2, 5, 6, 7]
    r = {0: 0.0, 1: 0.0, 2: 0.5, 5: 0.0, 6: 0.0, 7: 3.0}
    g = {t: gamma * (d if t == 2 else 1.0) for t in steps}
    v = values or [0.0] * 8
    ret, adv = [0.0] * 8, [0.0] * 8
    next_ret = next_v = next_adv = 0.0
    for t in reversed(steps):
        ret[t] = r[t] + g[t] * next_ret
        adv[t] = r[t] + g[t] * next_v - v[t] + g[t] * lam * next_adv
        next_ret, next_v, next_adv = ret[t], v[t], adv[t]
    return torch.tensor(ret), torch.tensor(adv)


def inputs_for(d, values=None):
    inputs = AdvantageInputs(
        rewards=torch.tensor([[REWARD]]),
        mask=torch.ones(1, 8),
        loss_mask=torch.tensor([LOSS_MASK], dtype=torch.float32),
        values=values,
        turn_rewards=place_turn_rewards([TURN_REWARDS], [ENDS], [8], 8),
        turn_discount=turn_discounts([ENDS], 8, d),
    )
    return inputs


def test_placing_turn_rewards_on_token_positions():
    placed = place_turn_rewards([[0.5, None, 1.0], [], [2.0]], [[1, 3, 5, 6], [0], [0]], [7, 3, 0], 8)
    expect = torch.zeros(3, 8)
    expect[0, 1], expect[0, 5] = 0.5, 1.0  # None adds nothing; the 4th end is an unstepped last turn
    assert torch.equal(placed, expect)  # the empty response gets nothing
    d = turn_discounts([[1, 3, 5, 6], [0]], 8, 0.9)
    assert d[0].tolist() == pytest.approx([1, 0.9, 1, 0.9, 1, 0.9, 1, 1])  # not at the last turn's end
    assert d[1].tolist() == [1.0] * 8
    with pytest.raises(ValueError, match="outside its 7 response tokens"):
        place_turn_rewards([[1.0]], [[7]], [7], 8)
    with pytest.raises(ValueError, match="2 turn rewards but 1 turn ends"):
        place_turn_rewards([[1.0, 1.0]], [[0]], [7], 8)
    # the token rewards: each turn's at its end, the rest of the reward (final 2.0) at the last token
    inputs = inputs_for(0.5)
    assert inputs.token_rewards(inputs.rewards)[0].tolist() == [0, 0, 0.5, 0, 0, 0, 0, 3.0]


@pytest.mark.parametrize("gamma, d", [(1.0, 1.0), (1.0, 0.5), (0.9, 0.5), (0.9, 0.0)])
def test_reinforce_plus_plus_returns_per_turn_against_a_hand_computed_reference(gamma, d):
    inputs = inputs_for(d)
    got = reinforce_plus_plus_returns(
        inputs.token_rewards(inputs.rewards), inputs.mask, inputs.discount(gamma), inputs.loss_mask
    )
    expect, _ = reference_returns(gamma, d)
    assert torch.allclose(got[0], expect, atol=1e-6), (got, expect)
    if gamma == 1.0 and d == 0.5:  # turn 1 sees its own 3.0, turn 0 its 0.5 + 0.5 * 3.0
        assert got[0].tolist() == [2.0, 2.0, 2.0, 0, 0, 3.0, 3.0, 3.0]
    if gamma == 1.0 and d == 1.0:  # undiscounted: the first turn's return is the sample's whole reward
        assert got[0, 0] == pytest.approx(REWARD)
    cfg = load_config(None, ["algo.advantage_estimator=reinforce_plus_plus", f"algo.gamma={gamma}"]).algo
    from reinforge.algo.advantages import ADV_ESTIMATORS

    adv, _ = ADV_ESTIMATORS.get("reinforce_plus_plus")(inputs, cfg)
    assert torch.allclose(adv, masked_whiten(expect[None], inputs.mask * inputs.loss_mask), atol=1e-5)


@pytest.mark.parametrize("gamma, lam, d", [(1.0, 1.0, 0.5), (0.9, 0.8, 0.5), (1.0, 0.95, 1.0)])
def test_gae_per_turn_against_a_hand_computed_reference(gamma, lam, d):
    values = [0.1, 0.2, 0.3, 9.0, 9.0, 0.4, 0.5, 0.6]  # 9.0: observation tokens, never used
    inputs = inputs_for(d, torch.tensor([values]))
    adv, returns = gae_advantages(
        inputs.token_rewards(inputs.rewards), inputs.values, inputs.mask, inputs.discount(gamma), lam, inputs.loss_mask
    )
    expect_ret, expect_adv = reference_returns(gamma, d, values, lam)
    assert torch.allclose(adv[0], expect_adv, atol=1e-6), (adv, expect_adv)
    policy = torch.tensor(LOSS_MASK, dtype=torch.bool)
    assert torch.allclose(returns[0][policy], (expect_adv + torch.tensor(values))[policy], atol=1e-6)
    if lam == 1.0:  # lambda 1: advantage = discounted return - value
        assert torch.allclose(adv[0][policy], (expect_ret - torch.tensor(values))[policy], atol=1e-6)


def episode_sample(reward=REWARD, status=Status.COMPLETED):
    return Sample(
        "p",
        [1] * 10,
        8,
        reward=reward,
        loss_mask=list(LOSS_MASK),
        rollout_log_probs=[0.0] * 8,
        status=status,
        metadata={"turn_rewards": list(TURN_REWARDS), "turn_ends": list(ENDS)},
    )


def test_compute_advantages_places_turn_rewards_only_when_asked():
    cfg = load_config(None, ["algo.advantage_estimator=reinforce_plus_plus"]).algo
    groups = [[episode_sample(), episode_sample(1.0), episode_sample(0.0, Status.FAILED)]]
    summed = compute_advantages(cfg, groups, 64)
    placed = compute_advantages(cfg, groups, 64, turn_discount=0.5)
    mask = torch.tensor([LOSS_MASK, LOSS_MASK, [0] * 8], dtype=torch.float32)
    flat = torch.stack(
        [
            reference_returns(1.0, 0.5)[0],
            # reward 1.0, 1.5 of it from its turns: -0.5 at the last token; turn 1 sees 0.5, turn 0 0.5 + 0.5 * 0.5
            torch.tensor([0.75, 0.75, 0.75, 0, 0, 0.5, 0.5, 0.5]),
            torch.zeros(8),  # failed: left out
        ]
    )
    expect = masked_whiten(flat, mask)
    assert torch.allclose(torch.stack(placed.advantages), expect, atol=1e-5)
    # sum: the whole reward at the last token, so every policy token's return is the reward
    summed_expect = masked_whiten(torch.tensor([[3.5] * 8, [1.0] * 8, [0.0] * 8]) * mask, mask)
    assert torch.allclose(torch.stack(summed.advantages), summed_expect, atol=1e-5)
    grpo = load_config(None, []).algo
    with pytest.raises(ValueError, match="token-level estimator, not grpo"):
        compute_advantages(grpo, groups, 64, turn_discount=1.0)


def test_agent_records_where_each_turns_reward_goes(tok):
    """A scripted environment with per-turn rewards (Countdown: 0.25 per "next", 0.0 for "stop", a final
    0.5): each reward lands at the last sampled token of its turn, and REINFORCE++'s returns are per turn."""
    engine = ScriptedEngine(tok, lambda prompt, turn: "next" if turn < 2 else "stop")
    ctx = agent_ctx(
        tok,
        engine,
        "agent.environment=tests.agent_envs:Countdown",
        "agent.environment_kwargs={start: 3}",
        "agent.turn_reward=discounted",
        "algo.advantage_estimator=reinforce_plus_plus",
    )
    (s,) = run_agent(ctx, "q")
    check_token_in_token_out(s, engine.calls)  # the loss mask stays exact
    ends, outs = s.metadata["turn_ends"], [c[1] for c in engine.calls]
    assert s.metadata["turn_rewards"] == [0.25, 0.25, 0.0] and s.reward == pytest.approx(1.0)
    assert len(ends) == 3 and ends[-1] == s.response_length - 1
    response = s.tokens[s.prompt_length :]
    for end, out in zip(ends, outs):
        assert response[end - len(out) + 1 : end + 1] == out  # the turn's sampled ids end there
        assert s.loss_mask[end] == 1 and (end + 1 == s.response_length or s.loss_mask[end + 1] == 0)
    cfg = ctx.config
    adv = compute_advantages(cfg.algo, [[s]], 400, turn_discount=cfg.agent.turn_discount)
    inputs = AdvantageInputs(
        rewards=torch.tensor([[s.reward]]),
        mask=torch.ones(1, s.response_length),
        loss_mask=torch.tensor([s.loss_mask], dtype=torch.float32),
        turn_rewards=place_turn_rewards([s.metadata["turn_rewards"]], [ends], [s.response_length], s.response_length),
        turn_discount=turn_discounts([ends], s.response_length, 1.0),
    )
    returns = reinforce_plus_plus_returns(inputs.token_rewards(inputs.rewards), inputs.mask, 1.0, inputs.loss_mask)[0]
    starts = [end - len(out) + 1 for end, out in zip(ends, outs)]
    # turn 2: its 0.0 and the final 0.5; turn 1: + 0.25; turn 0: + 0.25 = the sample's reward
    assert [float(returns[i]) for i in starts] == pytest.approx([1.0, 0.75, 0.5])
    assert torch.allclose(adv.advantages[0], masked_whiten(returns[None], inputs.loss_mask)[0], atol=1e-5)


def test_config_refuses_what_makes_no_sense():
    with pytest.raises(ConfigError, match="agent.turn_reward=discounted places each turn's reward.*grpo"):
        load_config(None, [AGENT, "agent.turn_reward=discounted"])
    with pytest.raises(ConfigError, match="rloo.*reinforce_plus_plus"):
        load_config(None, [AGENT, "agent.turn_reward=discounted", "algo.advantage_estimator=rloo"])
    with pytest.raises(ConfigError, match="needs multi-turn episodes"):
        load_config(None, ["agent.turn_reward=discounted", "algo.advantage_estimator=reinforce_plus_plus"])
    with pytest.raises(ConfigError, match="agent.turn_discount=0.9 applies with agent.turn_reward=discounted"):
        load_config(None, [AGENT, "agent.turn_discount=0.9"])
    for est in ("reinforce_plus_plus", "gae"):
        cfg = load_config(
            None, [AGENT, "agent.turn_reward=discounted", "agent.turn_discount=0.9", f"algo.advantage_estimator={est}"]
        )
        assert cfg.agent.turn_discount == 0.9


def test_an_episodes_turns_and_tool_calls_in_the_trace(tok, tmp_path):
    def script(prompt, turn):
        return call("calculator", expression="6*7") if turn == 0 else "The answer is 42."

    engine = ScriptedEngine(tok, script)
    ctx = agent_ctx(tok, engine, "agent.trace_episodes=1")
    trace.start_trace(tmp_path / "trace.json")
    try:
        samples = run_agent(ctx, "a", "b", n=2)
    finally:
        trace.stop_trace()
    events = trace.read_trace(tmp_path / "trace.json")
    tracks = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert "episode 0" in tracks.values() and "episode 1" not in tracks.values()  # agent.trace_episodes=1
    spans = [e for e in events if e.get("ph") == "X" and tracks.get(e["tid"]) == "episode 0"]
    names = [e["name"] for e in sorted(spans, key=lambda e: (e["ts"], -e["dur"]))]
    assert names == [
        "episode",
        "env.reset",
        "turn",
        "model.generate",
        "env.step",
        "tool calculator",
        "observation",
        "turn",
        "model.generate",
        "env.step",
        "env.reward",
        "env.close",
    ], names
    by = {e["name"]: e for e in reversed(spans)}  # the first of each name
    episode, step, tool = by["episode"], by["env.step"], by["tool calculator"]
    assert episode["args"]["turns"] == 2 and episode["args"]["sample"] == 0
    assert step["args"]["env"] == "ToolEnv" and step["args"]["calls"] == 1
    assert tool["ts"] >= step["ts"] and tool["args"]["error"] is None
    for e in spans:  # every span inside the episode's
        assert episode["ts"] <= e["ts"] and e["ts"] + e["dur"] <= episode["ts"] + episode["dur"] + 1e-3
    assert (
        samples[0].metadata["turn_ends"][0]
        == [e for e in spans if e["name"] == "model.generate"][0]["args"]["last_token"]
    )
