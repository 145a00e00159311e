"""Asynchronous resume without loss (issue 51): a checkpoint of a run with ``rollout.max_staleness`` > 0
keeps the rollouts the producer started (finished and in flight), and a resume trains them as they
were generated; a run killed with SIGKILL while groups (and agent episodes) are in flight resumes
with every prompt trained once, in the order of the data. What is exact and what is not:
docs/reliability.md#asynchronous-resume."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch

from reinforge.config import load_config
from reinforge.loop import run_training
from reinforge.records import Sample, Status
from reinforge.rollout import async_state
from reinforge.rollout.async_rollout import AsyncRolloutProducer, WeightGate
from tests.integration.test_async import _AbortingEngine
from tests.integration.test_faults import cli_train
from tests.integration.test_integration import read_metrics, tiny_overrides

# ---------------------------------------------------------------------------- the producer and the file


def test_a_checkpoint_waits_for_the_rollout_in_flight_and_lists_the_finished_ones():
    gate = WeightGate(_AbortingEngine())
    release = threading.Event()
    offset = {"n": 0}

    def produce(j):
        offset["n"] += 1  # the rollout draws its prompts
        if j == 2:
            release.wait(10)
        return f"rollout {j}"

    producer = AsyncRolloutProducer(produce, gate, 0, 10, 2, snapshot=lambda: dict(offset)).start()
    try:
        assert producer.take(0).value == "rollout 0"
        gate.run_update(lambda: None, 1)  # rollouts 1..3 may start; 2 blocks
        deadline = time.time() + 10
        while producer._producing != 2 and time.time() < deadline:
            time.sleep(0.01)
        threading.Timer(0.3, release.set).start()
        t = time.perf_counter()
        finished = producer.finished_after(0)  # waits for rollout 2
        assert time.perf_counter() - t >= 0.2
        assert [(j, v) for j, v, _ in finished] == [(1, "rollout 1"), (2, "rollout 2")]
        # nothing started meanwhile: the position after them is the current one
        assert producer.snapshot_before(3, lambda: dict(offset)) == {"n": 3}
        assert producer.snapshot_before(1, lambda: None) == {"n": 1}  # after rollout 0 drew
        assert producer.take(1).value == "rollout 1"  # still handed out
    finally:
        producer.close()


def test_a_resumed_producer_hands_out_the_kept_rollouts_without_producing_them():
    gate = WeightGate(_AbortingEngine())
    produced = []

    def produce(j):
        produced.append(j)
        return f"new {j}"

    kept = {3: ("kept 3", 1.5, {"n": 3}), 4: ("kept 4", 2.0, {"n": 4})}
    producer = AsyncRolloutProducer(produce, gate, 3, 7, 1, snapshot=lambda: {"n": 5}, produced=kept).start()
    try:
        # a checkpoint before any of them is taken keeps them again, with the positions they came with
        assert [(j, v) for j, v, _ in producer.finished_after(2)] == [(3, "kept 3"), (4, "kept 4")]
        assert producer.snapshot_before(4, lambda: None) == {"n": 4}
        gate.run_update(lambda: None, 5)
        assert [producer.take(j).value for j in range(3, 7)] == ["kept 3", "kept 4", "new 5", "new 6"]
        assert produced == [5, 6]
    finally:
        producer.close()


def _sample(i, **kw):
    return Sample(
        prompt=[{"role": "user", "content": f"Say {i}."}],
        tokens=[1, 2, 3, 4 + i],
        response_length=2,
        label=str(i),
        metadata={"id": i, "turns": [1, 2]},
        reward=0.25 * i,
        reward_info={"turns": 2},
        loss_mask=[1, 0],
        rollout_log_probs=[-0.1234567890123, float("-inf")],
        status=Status.TRUNCATED,
        weight_version=3,
        weight_versions=[3, 4],
        routed_experts=torch.tensor([[[1, 2]], [[3, 0]]], dtype=torch.uint8),
        **kw,
    )


def test_kept_rollouts_round_trip_bit_for_bit(tmp_path):
    generated = [[_sample(0), _sample(1)], [_sample(2), _sample(3)]]
    groups = [generated[1]]  # dynamic sampling kept the second group
    rec = async_state.rollout_record(7, (groups, generated, {"time/reward": 0.5}), 1.25, {"epoch": 0, "offset": 4})
    async_state.save_rollouts(tmp_path, [rec])
    (((groups2, generated2, counts), seconds),) = [
        async_state.rollout_from_record(r) for r in async_state.load_rollouts(tmp_path)
    ]
    assert groups2[0] is generated2[1] and counts == {"time/reward": 0.5} and seconds == 1.25
    for a, b in zip([s for g in generated for s in g], [s for g in generated2 for s in g]):
        assert torch.equal(a.routed_experts, b.routed_experts)
        assert {**a.__dict__, "routed_experts": None} == {**b.__dict__, "routed_experts": None}
    # a value torch.load(weights_only=True) cannot read back: not kept (generated again on resume)
    odd = _sample(9)
    odd.reward_info = {"obj": object()}
    assert async_state.rollout_record(8, ([[odd]], [[odd]], {}), 1.0, {}) is None
    (tmp_path / async_state.ROLLOUTS_FILE).write_bytes(b"damaged")
    with pytest.raises(ValueError, match="async_rollouts.pt does not load"):
        async_state.load_rollouts(tmp_path)


class _Data:
    """The data position alone (``PromptDataset.state_dict`` / ``load_state_dict``)."""

    def __init__(self):
        self.state = {"epoch": 0, "offset": 0, "size": 100}

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, state):
        self.state = {k: state[k] for k in ("epoch", "offset", "size")}


def _kept_checkpoint(tmp_path, versions=(3, 4)):
    """A checkpoint after rollout 2 that kept rollouts 3 and 4 (1 prompt x 2 samples each, generated by
    policy ``versions``); the data position is 5 prompts in."""
    records = []
    for j, v in zip((3, 4), versions):
        group = [
            Sample("p", [1, 2], 1, loss_mask=[1], rollout_log_probs=[-0.5], reward=1.0, weight_version=v)
            for _ in range(2)
        ]
        before = {"epoch": 0, "offset": j, "size": 100}
        records.append(async_state.rollout_record(j, ([group], [group], {"time/reward": 0.1}), 0.5, before))
    async_state.save_rollouts(tmp_path, records)
    listed = [{"rollout_id": r["rollout_id"], "data_before": r["data_before"]} for r in records]
    return {"epoch": 0, "offset": 5, "size": 100, "buffered_rollouts": listed}


def _source(*overrides, version=3):
    from reinforge.rollout.source import AsyncRollouts

    cfg = load_config(
        None, ["rollout.max_staleness=1", "rollout.rollout_batch_size=1", "rollout.n_samples_per_prompt=2", *overrides]
    )
    engine = _AbortingEngine()
    engine.weight_version = version
    return AsyncRollouts(cfg, None, lambda gate: None, _Data(), None, engine)


def test_a_resume_trains_the_kept_rollouts_and_rewinds_to_those_it_cannot(tmp_path, caplog):
    from reinforge.rollout.source import SyncRollouts

    state = _kept_checkpoint(tmp_path)
    src = _source()
    src.load_data_state(state, tmp_path)
    assert sorted(src._resumed) == [3, 4] and src.data.state["offset"] == 5
    # a run that ends before training them (train.num_rollout lowered) saves the position before them
    assert src.data_state(2, tmp_path) == {"epoch": 0, "offset": 3, "size": 100}
    src.start(3, 10)
    try:
        got = src.take(3)  # handed out as kept, not generated (the rollout function is None)
        assert [s.weight_version for g in got.groups for s in g] == [3, 3]
        assert got.metrics["async/staleness_max"] == 0
    finally:
        src.close()
    # another n_samples_per_prompt: both are generated again, from the prompts before rollout 3
    src = _source("rollout.n_samples_per_prompt=4")
    src.load_data_state(state, tmp_path)
    assert src._resumed == {} and src.data.state["offset"] == 3
    assert "n_samples_per_prompt=4" in caplog.text
    # rollout 4's tokens are older than max_staleness allows: 3 is kept, 4 generated again
    src = _source()
    src.load_data_state(_kept_checkpoint(tmp_path, versions=(3, 2)), tmp_path)
    assert sorted(src._resumed) == [3] and src.data.state["offset"] == 4
    # a file that does not load: generated again, with a warning naming it
    (tmp_path / async_state.ROLLOUTS_FILE).write_bytes(b"x")
    src = _source()
    src.load_data_state(state, tmp_path)
    assert src._resumed == {} and src.data.state["offset"] == 3
    assert "async_rollouts.pt does not load" in caplog.text
    # a synchronous resume of the asynchronous checkpoint generates them again
    cfg = load_config(None, [])
    sync = SyncRollouts(cfg, None, None, _Data(), None)
    sync.load_data_state(state, tmp_path)
    assert sync.data.state["offset"] == 3


# ---------------------------------------------------------------------------- a killed run, resumed

ROLLOUTS = 5
PROMPTS = 2 * ROLLOUTS  # rollout_batch_size=2 (tiny_overrides): one epoch, each prompt once


def numbered_prompts(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    # as long as the environment's own first message (the engine's window is sized by the data's prompts)
    text = "Count down from the number I give you, one number per turn, and say stop at the end: prompt {}."
    rows = [{"prompt": text.format(i), "label": str(i), "metadata": {"id": i}} for i in range(PROMPTS)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def dumped(out: Path) -> dict[int, list[dict]]:
    """Rollout id -> its trained samples (``run.dump_rollouts``)."""
    return {
        int(p.stem): [json.loads(line) for line in p.read_text().splitlines()]
        for p in sorted((out / "rollouts").glob("*.jsonl"))
    }


GENERATED = (
    "tokens",
    "response",
    "response_length",
    "rollout_log_probs",
    "weight_version",
    "weight_versions",
    "reward",
    "status",
    "loss_mask",
)


def test_sigkill_with_agent_episodes_in_flight_resumes_every_prompt_once(tmp_path, tiny_model_path):
    out = tmp_path / "run"
    args = tiny_overrides(
        tiny_model_path,
        out,
        **{
            "data.prompt_data": str(numbered_prompts(tmp_path)),
            "data.task_kwargs": "{}",
            "data.num_prompts": PROMPTS,
            "data.n_eval_prompts": 0,
            "data.rollout_shuffle": "false",  # rollout r trains prompts 2r and 2r + 1
            "eval.eval_before_train": "false",
            "train.num_rollout": ROLLOUTS,
            "rollout.max_staleness": 1,
            "rollout.partial_rollout": "true",
            # multi-turn episodes with a stateful environment (reset / step): turns of 4 tokens, each
            # observation about 10
            "rollout.rollout_max_response_len": 32,
            "rollout.custom_generate_function_path": "reinforge.rollout.agent:generate",
            "agent.environment": "tests.agent_envs:ShortCountdown",
            "agent.max_turns": 3,
            "agent.max_turn_tokens": 4,
            "run.save_interval": 1,
            "run.dump_rollouts": "true",
            "run.tensorboard": "false",
        },
    )
    # SIGKILL inside rollout 3's optimizer step: rollouts 0-2 are checkpointed, rollout 4's episodes run
    proc = cli_train(tmp_path, args, fault="optimizer_step:4")
    log, _ = proc.communicate(timeout=300)
    assert proc.returncode == -9, log[-3000:]
    ckpt = out / "checkpoints" / (out / "checkpoints" / "latest").read_text().strip()
    state = json.loads((ckpt / "state.json").read_text())
    assert state["rollout_id"] == 2
    kept = {r["rollout_id"]: r for r in async_state.load_rollouts(ckpt)}
    # the checkpoint keeps what the producer had started: at least rollout 3 (generated meanwhile)
    assert (
        [b["rollout_id"] for b in state["data"]["buffered_rollouts"]] == sorted(kept) == list(range(3, 3 + len(kept)))
    )
    assert state["data"]["offset"] == 2 * (3 + len(kept))
    before = dumped(out)
    assert sorted(before) == [0, 1, 2]

    run_training(load_config(None, [*args, f"run.load={out}"]))
    after = dumped(out)
    trained = {j: (before if j <= 2 else after)[j] for j in range(ROLLOUTS)}
    # every prompt trained once, in the order of the data, 4 samples each
    for j, samples in trained.items():
        assert [s["metadata"]["id"] for s in samples] == [2 * j] * 4 + [2 * j + 1] * 4, j
    # the kept rollouts are trained as they were generated before the kill, bit for bit
    for j, rec in kept.items():
        (_, generated, _), _ = async_state.rollout_from_record(rec)
        want = [{k: getattr(s, k) for k in GENERATED} | {"status": s.status.value} for g in generated for s in g]
        assert [{k: s[k] for k in GENERATED} for s in trained[j]] == want, j
    rows = [m for m in read_metrics(out) if "train/loss" in m]
    assert [int(m["rollout_id"]) for m in rows] == list(range(ROLLOUTS))
    assert [m["weight_version"] for m in rows] == [float(j + 1) for j in range(ROLLOUTS)]
    assert all(m["agent/turns"] > 1 for m in rows)  # multi-turn episodes
