"""Over-sampling with early stop (rollout.over_sampling_batch_size) and carry-over of the samples it
cuts (rollout.partial_rollout): the config's refusals, the rollout function on the tiny model's
engine across a weight update, and the loop."""

import json

import pytest
import torch

from reinforge.config import EngineConfig, load_config
from reinforge.config.fields import ConfigError
from reinforge.data import Prompt
from reinforge.engine import EmbeddedEngine
from reinforge.loop import RLLoop
from reinforge.models.loading import build_model, load_tokenizer
from reinforge.records import Status
from reinforge.rollout.generate import RolloutContext
from reinforge.rollout.over_sampling import OverSampledRollout, off_policy_metrics
from tests.integration.test_integration import read_metrics, tiny_overrides, without_timings
from tests.unit.test_engine import trainer_log_probs

# a stop string that most tokens' text contains: the tiny model's responses end after 1-5 tokens, so
# samples finish at different steps and the early stop leaves some half-generated
STOP = 'rollout.rollout_stop=["e"]'


@pytest.mark.parametrize(
    "overrides,match",
    [
        (["rollout.over_sampling_batch_size=4", "rollout.rollout_batch_size=8"], "over_sampling_batch_size=4 is below"),
        (["rollout.over_sampling_batch_size=16", "rollout.max_staleness=1"], "rollout.max_staleness=1"),
        (
            ["rollout.over_sampling_batch_size=16", "rollout.rollout_function_path=tests.reward_fns:even_first_token"],
            "rollout.rollout_function_path",
        ),
        (
            ["rollout.over_sampling_batch_size=16", "engine.backend=hf"],
            "engine.backend=embedded and cluster.mode=local",
        ),
        (["rollout.over_sampling_batch_size=16", "cluster.mode=ray"], "cluster.mode=local"),
        (["rollout.partial_rollout=true"], "rollout.over_sampling_batch_size"),
    ],
)
def test_config_refuses_what_over_sampling_cannot_do(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, overrides)
    cfg = load_config(None, ["rollout.over_sampling_batch_size=16", "rollout.partial_rollout=true"])
    assert cfg.rollout.over_sampling_batch_size == 16


class _Prompts:
    """A data source of random prompts, in order."""

    def __init__(self, n=40):
        g = torch.Generator().manual_seed(0)
        self.prompts = [
            Prompt(f"p{i}", "", torch.randint(10, 40000, (5,), generator=g).tolist(), index=i) for i in range(n)
        ]
        self.offset = 0

    def next_batch(self, n):
        self.offset += n
        return self.prompts[self.offset - n : self.offset]


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap-schedule"])
def test_carried_samples_continue_under_the_new_weights(tiny_model_path, overlap):
    """Rollout 0 trains the first 2 of 6 groups to complete and carries the rest; after weight
    updates later rollouts continue them: a trained sample holds the tokens and log-probs it had at
    the stop, then tokens of the newer version, each token's log-prob that of its own policy. Also with the GPU's
    overlap scheduler (finished sequences read back one step late; the abort drains them first)."""
    tok = load_tokenizer(tiny_model_path)
    models = [build_model(tiny_model_path, torch.float32)] + [
        build_model(tiny_model_path, torch.float32, random_init=True, seed=123 + v) for v in range(1, 4)
    ]
    engine = EmbeddedEngine(
        build_model(tiny_model_path, torch.float32),
        EngineConfig(max_num_seqs=16, sync_interval=1),
        max_model_len=128,
        seed=0,
        tokenizer=tok,
    )
    engine._overlap = overlap
    cfg = load_config(
        None,
        [
            "rollout.rollout_batch_size=2",
            "rollout.over_sampling_batch_size=6",
            "rollout.n_samples_per_prompt=2",
            "rollout.partial_rollout=true",
            "rollout.rollout_max_response_len=24",
            STOP,
        ],
    )
    ctx = RolloutContext(cfg, engine, tok, None, [tok.eos_token_id])
    rollout, data = OverSampledRollout(cfg), _Prompts()
    try:
        engine.reseed(0)
        groups = rollout(ctx, 0, data)
        counts = rollout.pop_counts()
        assert [len(g) for g in groups] == [2, 2] and data.offset == 6
        assert all(
            s.status in (Status.COMPLETED, Status.TRUNCATED) and s.token_versions() == [0] * s.response_length
            for g in groups
            for s in g
        )
        assert [s.group_index for g in groups for s in g] == [0, 0, 1, 1]
        assert counts["rollout/over_sampled_prompts"] == 4 and counts["rollout/aborted_samples"] >= 1

        def cut_samples():  # (tokens, log-probs) of the half-generated samples handed on
            return [
                (list(p.tokens), list(p.log_probs))
                for g in rollout.pending
                for p in g.parts
                if p.result is None and p.tokens
            ]

        cut = cut_samples()
        assert cut, "the early stop left no half-generated sample"
        assert rollout.state() == [g.prompt.index for g in rollout.pending] and len(rollout.pending) == 4

        # later rollouts under new weights: the carried samples continue (a rollout may also train
        # only groups completed earlier, without stepping the engine)
        spanning = []
        for version in range(1, 4):
            engine.update_weights(models[version].named_parameters(), version=version)
            engine.reseed(version)
            groups = rollout(ctx, version, data)
            assert len(groups) == 2 and all(s.status != Status.ABORTED for g in groups for s in g)
            m = off_policy_metrics([s for g in groups for s in g], version)
            spanning += [s for g in groups for s in g if len(set(s.token_versions())) > 1]
            cut += cut_samples()
            if spanning:
                assert 0 < m["rollout/off_policy_token_share"] < 1 and m["rollout/staleness_max"] >= 1
                break
        assert spanning, "no trained sample spans two weight versions"
        for s in spanning:
            versions = s.token_versions()
            assert versions == sorted(versions) and len(s.rollout_log_probs) == len(s.loss_mask) == s.response_length
            a = versions.count(versions[0])
            assert any(s.response_ids[:a] == t and s.rollout_log_probs[:a] == lp for t, lp in cut)
            prompt, lps = s.tokens[: s.prompt_length], torch.tensor(s.rollout_log_probs)
            for v in set(versions):  # each token's log-prob is its own policy's
                at = torch.tensor([x == v for x in versions])
                expect = trainer_log_probs(models[v], prompt, s.response_ids)
                torch.testing.assert_close(lps[at], expect[at], rtol=0, atol=1e-4)
    finally:
        engine.shutdown()


def _cfg(tiny_model_path, out, **extra):
    return load_config(
        None,
        tiny_overrides(
            tiny_model_path,
            out,
            **{
                "reward.type": "custom",
                "reward.function_path": "tests.reward_fns:even_first_token",
                "data.n_eval_prompts": 0,
                "run.save_final": "false",
                **extra,
            },
        ),
    )


def _run(tiny_model_path, out, **extra):
    loop = RLLoop(_cfg(tiny_model_path, out, **extra))
    trained = []
    score = loop.cluster.score

    def record(batch):
        trained.append([s for g in batch.groups for s in g])
        return score(batch)

    loop.cluster.score = record
    try:
        loop.train()
    finally:
        loop.close()
    return trained, [m for m in read_metrics(out) if "train/loss" in m]


@pytest.mark.parametrize("carry", [True, False], ids=["carry-over", "drop"])
def test_loop_trains_complete_groups_and_resumes_with_the_prompts_handed_on(tmp_path, tiny_model_path, carry):
    """rollout_batch_size=2 of 5 groups in flight, n=4: every rollout trains 2 complete groups; with
    carry-over some trained tokens come from an older policy, without it none does. A checkpoint
    keeps the prompts handed on and a resumed run queues them first."""
    out = tmp_path / "run"
    over = {
        "rollout.over_sampling_batch_size": 5,
        "rollout.partial_rollout": str(carry).lower(),
        "engine.sync_interval": 1,
        "rollout.rollout_max_response_len": 16,
        "rollout.rollout_stop": '["e"]',
    }
    trained, rows = _run(tiny_model_path, out, **over, **{"train.num_rollout": 4, "run.save_interval": 2})
    assert len(trained) == 4
    for samples in trained:
        assert len(samples) == 2 * 4
        for gi in range(2):
            group = samples[gi * 4 : (gi + 1) * 4]
            assert {s.group_index for s in group} == {gi} and len({s.prompt for s in group}) == 1
            assert all(s.status in (Status.COMPLETED, Status.TRUNCATED) for s in group)
            assert all(len(s.rollout_log_probs) == s.response_length for s in group)
    for m in rows:
        assert m["rollout/over_sampled_prompts"] == 3
        assert m["rollout/num_samples"] == 8
    stale = sum(m["rollout/off_policy_samples"] for m in rows)
    if carry:
        assert stale > 0 and max(m["rollout/staleness_max"] for m in rows) >= 1
        assert sum(m["rollout/carried_samples"] for m in rows) > 0
    else:
        assert stale == 0 and all(m["rollout/carried_samples"] == 0 for m in rows)
        assert sum(m["rollout/dropped_prompts"] for m in rows) > 0

    ckpt = out / "checkpoints" / "rollout_000001"
    data = json.loads((ckpt / "state.json").read_text())["data"]
    # every prompt taken is trained (2 per rollout), handed on, or dropped
    assert data["offset"] == 2 * 2 + len(data["pending_prompts"]) + sum(m["rollout/dropped_prompts"] for m in rows[:2])
    loop = RLLoop(_cfg(tiny_model_path, tmp_path / "resumed", **over, **{"run.load": str(ckpt)}))
    try:
        assert loop.start_rollout == 2
        assert loop.source.over_sampling.state() == data["pending_prompts"]
        assert loop.train_data.state_dict() == {k: data[k] for k in ("epoch", "offset", "size")}
    finally:
        loop.close()


def test_over_sampling_equal_to_the_batch_trains_as_without_it(tmp_path, tiny_model_path):
    """over_sampling_batch_size == rollout_batch_size waits for every group: the same samples and
    metrics as the default rollout (whose path is unchanged)."""
    runs = {}
    for name, extra in (("default", {}), ("equal", {"rollout.over_sampling_batch_size": 2})):
        trained, rows = _run(tiny_model_path, tmp_path / name, **extra)
        runs[name] = (trained, without_timings(rows))
    (t_default, m_default), (t_equal, m_equal) = runs["default"], runs["equal"]
    assert [[s.tokens for s in r] for r in t_default] == [[s.tokens for s in r] for r in t_equal]
    extra = {k for m in m_equal for k in m} - {k for m in m_default for k in m}
    assert extra == {
        "rollout/over_sampled_prompts",
        "rollout/aborted_samples",
        "rollout/carried_samples",
        "rollout/requeued_prompts",
        "rollout/dropped_prompts",
        "rollout/discarded_tokens",
        "rollout/off_policy_token_share",
        "rollout/off_policy_samples",
        "rollout/staleness_mean",
        "rollout/staleness_max",
    }
    assert [{k: v for k, v in m.items() if k not in extra} for m in m_equal] == m_default
    assert all(m["rollout/aborted_samples"] == 0 and m["rollout/off_policy_token_share"] == 0 for m in m_equal)
