"""reward.type=judge with judge.model_path: the judge model run by the embedded engine in the
trainer's process (reinforge/reward/judge_engine.py), asleep except while it scores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from reinforge.config import Config, JudgeConfig, RewardConfig, load_config
from reinforge.config.fields import ConfigError
from reinforge.preflight import PreflightError, check_rl
from reinforge.records import Sample, Status
from reinforge.reward.judge_engine import EngineJudge, engine_plan, judge_problems, judge_spec
from reinforge.reward.manager import RewardManager
from tests.conftest import make_tiny_model
from tests.integration.test_integration import TASK, tiny_overrides


@pytest.fixture(scope="session")
def sevens_judge(tmp_path_factory, smollm2_path) -> Path:
    """A tiny random judge that answers "7777..." whatever it reads: one residual dimension held at a
    constant (its embedding column 1, nothing written to it by attention or MLP), the final norm reading
    only that dimension, and the untied output head giving only the token "7" a weight on it: the logit
    of "7" is positive, every other is 0, so greedy decoding repeats "7"."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    out = make_tiny_model(tmp_path_factory.mktemp("judge-7"), smollm2_path, tie_word_embeddings=False, seed=3)
    seven = AutoTokenizer.from_pretrained(str(out)).convert_tokens_to_ids("7")
    f = out / "model.safetensors"
    sd = load_file(f)
    d = 1
    sd["model.embed_tokens.weight"][:, d] = 1.0
    for k in sd:
        if k.endswith(("o_proj.weight", "down_proj.weight")):
            sd[k][d, :] = 0.0
    sd["model.norm.weight"].zero_()
    sd["model.norm.weight"][d] = 1.0
    sd["lm_head.weight"].zero_()
    sd["lm_head.weight"][seven, d] = 10.0
    save_file(sd, f, metadata={"format": "pt"})
    return out


def _sample(response="4", label="4", prompt="What is 2 + 2?", i=0):
    return Sample(
        prompt=prompt, tokens=[1, 2, 3], response_length=2, response=response, label=label, index=i, loss_mask=[1, 1]
    )


def _mgr(path, **kw) -> RewardManager:
    """An embedded judge reward's manager: ``kw`` are keys of the ``judge`` section."""
    kw.setdefault("max_new_tokens", 4)
    return RewardManager(RewardConfig(type="judge"), judge=JudgeConfig(model_path=str(path), **kw))


def test_scores_parsed_in_one_engine_call_and_cached(sevens_judge):
    mgr = _mgr(sevens_judge, score_regex="(7)")
    judge = mgr.judge
    awake = []
    generate = judge.engine.engine.generate
    judge.engine.engine.generate = lambda reqs: (awake.append(not judge.engine.asleep), generate(reqs))[1]
    s = [_sample(), _sample(i=1), _sample(response="5", i=2), _sample(response="5", i=3)]
    assert judge.engine.asleep  # built asleep
    counts = mgr.score(s)
    assert [x.reward for x in s] == [0.7] * 4 and all(x.status != Status.FAILED for x in s)
    assert s[0].reward_info["judge_answer"] == "7777"  # greedy, judge.max_new_tokens=4
    assert counts["reward/errors"] == 0 and counts["reward/judge_unparseable"] == 0
    assert judge.engine.calls == 1 and judge.requests == 2  # one batched call; each distinct sample once
    assert awake == [True] and judge.engine.asleep  # awake to score, asleep again after
    again = [_sample(i=7), _sample(response="5", i=8)]
    mgr.score(again)  # the cache: no engine call
    assert judge.engine.calls == 1 and [x.reward for x in again] == [0.7, 0.7]
    mgr.close()


def test_unparseable_answer_is_counted_and_left_out(sevens_judge):
    mgr = _mgr(sevens_judge)  # the default regex reads 7777: outside [0, 10]
    s = [_sample(), _sample(response="5", i=1)]
    counts = mgr.score(s)
    assert counts["reward/judge_unparseable"] == 2 and counts["reward/errors"] == 2
    assert counts["reward/judge_errors"] == 0
    for x in s:
        assert x.status == Status.FAILED and x.loss_mask == [0, 0] and "7777" in x.reward_info["reward_failure"]
    mgr.score([_sample()])  # failures are not cached: judged again
    assert mgr.judge.engine.calls == 2
    mgr.close()


def test_a_judge_that_cannot_wake_counts_the_call_as_judge_errors_and_sleeps_again(sevens_judge, monkeypatch):
    """A KV cache that does not fit at wake-up (the policy's engine holding memory) fails the call like
    any engine error: counted, the samples left out, the judge asleep again with its weights where
    judge.offload_weights keeps them; the next call wakes it normally."""
    mgr = _mgr(sevens_judge, score_regex="(7)", offload_weights=True)
    engine = mgr.judge.engine.engine
    wake, sleeps = engine.wake_up, []
    sleep = engine.sleep
    monkeypatch.setattr(engine, "sleep", lambda offload_weights=False: (sleeps.append(offload_weights), sleep())[1])

    def no_memory():
        raise MemoryError("the KV cache does not fit")

    monkeypatch.setattr(engine, "wake_up", no_memory)
    s = [_sample(), _sample(response="5", i=1)]
    counts = mgr.score(s)  # (before: the MemoryError ended the rollout)
    assert counts["reward/judge_errors"] == 2 and all(x.status == Status.FAILED for x in s)
    assert "does not fit" in s[0].reward_info["reward_failure"] and sleeps[-1] is True
    monkeypatch.setattr(engine, "wake_up", wake)
    again = [_sample(i=2)]
    mgr.score(again)
    assert again[0].reward == 0.7 and sleeps[-1] is True and mgr.judge.engine.asleep
    mgr.close()


def test_a_prompt_past_judge_max_len_is_a_judge_error(sevens_judge):
    mgr = _mgr(sevens_judge, score_regex="(7)", max_len=160)
    s = [_sample(), _sample(response="word " * 300, i=1)]
    counts = mgr.score(s)
    assert s[0].reward == 0.7 and counts["reward/judge_errors"] == 1 and s[1].status == Status.FAILED
    assert "judge.max_len=160" in s[1].reward_info["reward_failure"]
    mgr.close()


def test_the_judge_sees_its_chat_template(sevens_judge):
    mgr = _mgr(sevens_judge, template="R={response}")
    ids = mgr.judge.engine.encode("R=4")
    text = mgr.judge.engine.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>") and text.rstrip().endswith("<|im_start|>assistant")
    mgr.close()


@pytest.mark.parametrize(
    "kw,match",
    [
        (["judge.template='grade {question}'"], "has no {response}"),
        (["judge.url=http://127.0.0.1:1/v1", "judge.model=m"], "both set"),
        (["reward.type=math"], "judge.model_path is set but reward.type='math'"),
    ],
)
def test_config_refuses(kw, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, ["reward.type=judge", "judge.model_path=smollm2-135m-instruct", *kw])


def _cfg(policy, judge, *extra) -> Config:
    return load_config(
        None,
        [
            f"model.path={policy}",
            "reward.type=judge",
            f"judge.model_path={judge}",
            "rollout.rollout_max_response_len=16",
            "rollout.rollout_batch_size=2",
            "rollout.n_samples_per_prompt=4",
            "data.n_eval_prompts=0",
            *extra,
        ],
    )


def test_preflight_refuses_in_one_line(tmp_path, tiny_model_path, sevens_judge):
    cpu = torch.device("cpu")
    with pytest.raises(PreflightError, match=r"judge.model_path='/nowhere/judge' not found"):
        check_rl(_cfg(tiny_model_path, "/nowhere/judge"), tiny_model_path, device=cpu)
    with pytest.raises(PreflightError, match="judge.max_len=4096 but the judge model"):
        check_rl(_cfg(tiny_model_path, sevens_judge, "judge.max_len=4096"), tiny_model_path, device=cpu)
    with pytest.raises(PreflightError, match="needs cluster.mode=local"):
        check_rl(_cfg(tiny_model_path, sevens_judge, "cluster.mode=ray"), tiny_model_path, device=cpu)
    cfg = _cfg(tiny_model_path, sevens_judge)
    spec = judge_spec(cfg)
    assert spec.engine.max_num_seqs == 8 and spec.max_len == 1024  # one rollout's samples; the tiny window
    judge = engine_plan(spec.path, spec.engine, spec.max_len, cpu)
    kv, weights, per_slot = judge.bytes, judge.weight_bytes, judge.bytes_per_slot
    assert kv == (8 + 1) * per_slot and per_slot == 2 * 2 * 2 * 16 * 1024 * 4  # the sink block: one slot here
    from reinforge.rollout.backends import engine_config_for

    policy = engine_plan(tiny_model_path, engine_config_for(cfg), 17, cpu)
    memory = policy.total + weights + 3 * per_slot  # the policy's engine fits, the judge's 9 blocks do not
    (line,) = judge_problems(cfg, tiny_model_path, 17, cpu, memory)
    assert "lower judge.max_num_seqs to at most 2" in line and "\n" not in line
    with pytest.raises(PreflightError, match="judge.max_num_seqs"):
        check_rl(cfg, tiny_model_path, memory=memory, device=cpu)
    assert judge_problems(cfg, tiny_model_path, 17, cpu, memory + 6 * per_slot) == []


def test_train_with_an_embedded_judge_asleep_while_training_and_generating(
    tmp_path, tiny_model_path, sevens_judge, monkeypatch
):
    """`reinforge train`: two rollouts of a tiny policy judged by the tiny judge, an evaluation
    after: the judge scores each rollout and the evaluation in one engine call, and holds no KV cache
    while the policy generates or the trainer trains."""
    from reinforge import cli
    from reinforge.cluster.local import LocalCluster
    from reinforge.engine import EmbeddedEngine

    judges: list[EngineJudge] = []
    seen: dict[str, list[bool]] = {"train": [], "generate": [], "judge": []}
    init, train, generate = EngineJudge.__init__, LocalCluster.train, EmbeddedEngine.generate

    def spy_init(self, spec):
        init(self, spec)
        judges.append(self)

    def spy_train(self, *a, **k):
        seen["train"].append(judges[0].asleep)
        return train(self, *a, **k)

    def spy_generate(self, requests):
        judge = bool(judges) and self is judges[0].engine
        seen["judge" if judge else "generate"].append(bool(judges) and judges[0].asleep)
        return generate(self, requests)

    monkeypatch.setattr(EngineJudge, "__init__", spy_init)
    monkeypatch.setattr(LocalCluster, "train", spy_train)
    monkeypatch.setattr(EmbeddedEngine, "generate", spy_generate)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Count to {i}.", "label": str(i)}) + "\n" for i in range(16)))
    out = tmp_path / "run"
    overrides = [o for o in tiny_overrides(tiny_model_path, out) if o not in TASK] + [
        f"data.prompt_data={data}",
        "reward.type=judge",
        f"judge.model_path={sevens_judge}",
        "judge.score_regex=(7)",
        "judge.max_new_tokens=3",
        "reward.correct_threshold=0.5",
        "run.save_final=false",
        "eval.eval_before_train=false",
    ]
    assert cli.main(["train", *overrides]) == 0
    (judge,) = judges
    assert seen["train"] == [True, True] and seen["generate"] and all(seen["generate"])
    assert seen["judge"] == [False] * 3 and judge.calls == 3  # 2 rollouts and the evaluation after: awake then
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rollouts = [r for r in rows if "rollout/reward_mean" in r]
    assert len(rollouts) == 2
    for r in rollouts:
        assert r["rollout/reward_mean"] == pytest.approx(0.7) and r["reward/judge_errors"] == 0
    evals = [r for r in rows if "eval/greedy_reward" in r]
    assert len(evals) == 1 and all(r["eval/greedy_reward"] == pytest.approx(0.7) for r in evals)
