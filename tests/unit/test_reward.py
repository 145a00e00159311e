"""Answer extraction, built-in rewards and the reward manager's failure handling."""

import asyncio
import os
import sys
import textwrap
import time

import pytest

from reinforge.config import RewardConfig
from reinforge.data import load_source
from reinforge.records import Sample
from reinforge.reward import RewardManager, extract_answer


def sample(response, label=None, metadata=None):
    return Sample(prompt="p", tokens=[1, 2], response_length=1, response=response, label=label, metadata=metadata or {})


@pytest.mark.parametrize(
    "text,method,expected",
    [
        ("so <answer> 42 </answer>", "tag", "42"),
        ("<answer>1</answer> then <answer>2</answer>", "tag", "2"),
        ("no tag, the result is 1,234.", "tag", None),
        ("no tag, the result is 1,234.", "tag_or_last_number", "1234"),
        ("x = -7 and then 12", "last_number", "12"),
        ("value -3.5", "last_number", "-3.5"),
        (r"thus \boxed{\frac{1}{2}} done", "boxed", r"\frac{1}{2}"),
        (r"\boxed{a{b}c}", "boxed", "a{b}c"),
        ("  raw  ", "none", "raw"),
        ("nothing here", "last_number", None),
    ],
)
def test_extract_answer(text, method, expected):
    assert extract_answer(text, method) == expected


def test_extract_unknown_method():
    with pytest.raises(ValueError, match="unknown answer extraction"):
        extract_answer("x", "magic")


def test_reasoning_gym_reward_uses_task_scorer():
    (rec,) = load_source("reasoning_gym:basic_arithmetic", size=1, seed=0)
    mgr = RewardManager(RewardConfig())
    good = sample(f"<answer>{rec.label}</answer>", rec.label, rec.metadata)
    bad = sample("<answer>nonsense</answer>", rec.label, rec.metadata)
    fallback = sample(f"I think it is {rec.label}", rec.label, rec.metadata)
    counts = mgr.score([good, bad, fallback])
    assert (good.reward, bad.reward, fallback.reward) == (1.0, 0.0, 1.0)
    assert counts == {"reward/errors": 0.0, "reward/timeouts": 0.0, "reward/abandoned_threads": 0.0}


def test_math_reward():
    mgr = RewardManager(RewardConfig(type="math"))
    s = [sample(r"The answer is $\frac{1}{2}$", "0.5"), sample(r"\boxed{3}", "4"), sample("it is 12", "12")]
    mgr.score(s)
    assert [x.reward for x in s] == [1.0, 0.0, 1.0]


def test_exact_match_reward():
    mgr = RewardManager(RewardConfig(type="exact_match", answer_extraction="tag"))
    s = [sample("<answer> Paris </answer>", "paris"), sample("<answer>Rome</answer>", "Paris")]
    mgr.score(s)
    assert [x.reward for x in s] == [1.0, 0.0]


@pytest.fixture
def custom_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        textwrap.dedent("""
        import asyncio, time
        def length(sample):
            return {"reward": len(sample.response) / 10, "chars": len(sample.response)}
        async def async_one(sample):
            await asyncio.sleep(0)
            return 1
        def boom(sample):
            if sample.response == "bad":
                raise RuntimeError("scorer crashed")
            return 0.5
        def slow(sample):
            time.sleep(5 if sample.response == "slow" else 0)
            return 1.0
        async def aslow(sample):
            await asyncio.sleep(5)
            return 1.0
        def nan(sample):
            return float("nan")
        def verl_style(sample):
            return {"score": 1.0, "acc": True, "pred": "4"}
        def both_keys(sample):
            return {"score": 1.0, "reward": 0.0}
        def no_key(sample):
            return {"value": 1.0}
        not_callable = 3
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_rewards"
    sys.modules.pop("my_rewards", None)


def test_custom_reward_dict_and_async(custom_module):
    s = sample("hello")
    RewardManager(RewardConfig(type="custom", function_path=f"{custom_module}:length")).score([s])
    assert s.reward == 0.5 and s.reward_info == {"chars": 5}
    s = sample("x")
    RewardManager(RewardConfig(type="custom", function_path=f"{custom_module}:async_one")).score([s])
    assert s.reward == 1.0


def test_custom_reward_errors_are_counted_not_raised(custom_module):
    mgr = RewardManager(RewardConfig(type="custom", function_path=f"{custom_module}:boom"))
    s = [sample("ok"), sample("bad")]
    counts = mgr.score(s)
    assert [x.reward for x in s] == [0.5, 0.0]
    assert counts["reward/errors"] == 1.0 and "scorer crashed" in s[1].reward_info["reward_failure"]
    s = [sample("x")]
    counts = RewardManager(RewardConfig(type="custom", function_path=f"{custom_module}:nan")).score(s)
    assert counts["reward/errors"] == 1.0 and s[0].reward == 0.0


def test_custom_reward_dict_with_score_key(custom_module, caplog):
    """verl's compute_score returns {"score": ...}: it is the reward, the rest goes to reward_info;
    a dict with both keys or neither is a counted error, and a batch where every sample fails is
    logged as an error naming the cause."""
    s = sample("x")
    counts = RewardManager(RewardConfig(type="custom", function_path=f"{custom_module}:verl_style")).score([s])
    assert s.reward == 1.0 and s.reward_info == {"acc": True, "pred": "4"} and counts["reward/errors"] == 0
    for fn in ("both_keys", "no_key"):
        s = [sample("x"), sample("y")]
        with caplog.at_level("ERROR", logger="reinforge.reward.manager"):
            counts = RewardManager(RewardConfig(type="custom", function_path=f"{custom_module}:{fn}")).score(s)
        assert counts["reward/errors"] == 2 and [x.reward for x in s] == [0.0, 0.0]
        assert "'reward' or 'score'" in s[0].reward_info["reward_failure"]
        assert "all 2 samples failed" in caplog.text and "'reward' or 'score'" in caplog.text
        caplog.clear()


def test_custom_reward_timeouts(custom_module):
    for fn in ("slow", "aslow"):
        mgr = RewardManager(RewardConfig(type="custom", function_path=f"{custom_module}:{fn}", timeout=0.2))
        s = [sample("slow"), sample("fast")]
        t = time.time()
        counts = mgr.score(s)
        assert time.time() - t < 4.5  # not the 5 s of the call (a stopped worker is replaced: a process start)
        assert counts["reward/timeouts"] >= 1.0 and s[0].reward == 0.0
        mgr.close()


def test_custom_reward_bad_path(custom_module):
    with pytest.raises(ValueError, match="reward.function_path.*no attribute 'missing'"):
        RewardManager(RewardConfig(type="custom", function_path=f"{custom_module}:missing"))
    with pytest.raises(ValueError, match="cannot import module 'no_such_mod'"):
        RewardManager(RewardConfig(type="custom", function_path="no_such_mod:f"))
    with pytest.raises(ValueError, match="not callable"):
        RewardManager(RewardConfig(type="custom", function_path=f"{custom_module}:not_callable"))


def test_score_inside_event_loop_points_to_ascore():
    mgr = RewardManager(RewardConfig(type="exact_match"))

    async def inner():
        with pytest.raises(RuntimeError, match="ascore"):
            mgr.score([sample("1", "1")])
        await mgr.ascore([s := sample("<answer>1</answer>", "1")])
        return s.reward

    assert asyncio.run(inner()) == 1.0


def test_daemon_workers_reuse_threads_and_step_around_a_stuck_call():
    """Sequential calls share one thread; a call that never returns holds only its own worker."""
    import threading

    from reinforge.reward.threads import DaemonWorkers

    w = DaemonWorkers(name="reward-close-test")  # (its own name: other tests' managers leave idle workers)
    names = []
    for _ in range(5):
        w.submit(lambda: names.append(threading.get_ident())).finished.wait(5)
    assert w.threads == 1 and len(set(names)) == 1
    release = threading.Event()
    stuck = w.submit(lambda: release.wait(10))
    quick = w.submit(lambda: None)
    assert quick.finished.wait(5) and not stuck.finished.is_set() and w.threads == 2
    assert w.submit(lambda: 1 / 0).finished.wait(5)  # an exception neither kills the worker nor leaks
    assert w.submit(lambda: None).finished.wait(5) and w.threads == 2
    release.set()
    assert stuck.finished.wait(5)
    time.sleep(0.1)  # (the stuck worker counts itself idle after its job)
    alive = [t for t in threading.enumerate() if t.name == "reward-close-test"]
    assert len(alive) == 2
    w.close()
    for t in alive:
        t.join(5)
    assert not any(t.is_alive() for t in alive)  # idle workers end on close
    assert w.submit(lambda: None).finished.wait(5) and w.threads == 3  # and new ones start after it
    time.sleep(0.1)
    pid = os.fork()  # a forked child (its parent's idle worker is not there) starts a worker of its own
    if pid == 0:
        os._exit(0 if w.submit(lambda: None).finished.wait(5) else 1)
    assert os.waitpid(pid, 0)[1] == 0


def test_thread_rewards_reuse_workers_and_count_abandoned_calls(monkeypatch):
    """Built-in rewards (threads): many samples on few threads; a timed-out call is counted while it
    runs and no longer once it has returned."""
    import threading

    mgr = RewardManager(RewardConfig(type="exact_match", concurrency=4))
    samples = [sample("<answer>x</answer>", "x") for _ in range(64)]
    assert mgr.score(samples)["reward/errors"] == 0 and all(s.reward == 1.0 for s in samples)
    assert mgr._workers.threads <= 4
    release = threading.Event()
    monkeypatch.setattr(mgr, "function_for", lambda s: lambda s: release.wait(10) and 1.0)
    mgr.cfg.timeout = 0.2
    counts = mgr.score([sample("x", "x")])
    assert counts["reward/timeouts"] == 1 and counts["reward/abandoned_threads"] == 1
    release.set()
    time.sleep(0.2)
    monkeypatch.undo()
    assert mgr.score([sample("x", "x")])["reward/abandoned_threads"] == 0


def test_built_in_rewards_run_in_sequence_around_a_stuck_call(monkeypatch):
    """Built-in rewards are scored one after another on one worker (one thread handoff for the batch):
    a call that runs past reward.timeout counts as a timeout, the samples after it are scored on another
    worker, and a function that calls sys.exit counts as an error of its sample."""
    import sys
    import threading

    mgr = RewardManager(RewardConfig(type="exact_match", timeout=0.3))
    release = threading.Event()

    def fn(s):
        if s.response == "stuck":
            release.wait(10)
        if s.response == "exit":
            sys.exit(3)
        return 1.0 if s.response == s.label else 0.0

    monkeypatch.setattr(mgr, "function_for", lambda s: fn)
    samples = [sample(r, "a") for r in ("a", "b", "stuck", "a", "exit", "a")]
    t = time.time()
    counts = mgr.score(samples)
    assert time.time() - t < 3
    assert [s.reward for s in samples] == [1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
    assert counts == {"reward/errors": 1.0, "reward/timeouts": 1.0, "reward/abandoned_threads": 1.0}
    assert "reward.timeout" in samples[2].reward_info["reward_failure"]
    assert "RewardExit" in samples[4].reward_info["reward_failure"]
    assert mgr._workers.threads == 2  # the stuck call's worker, and the one that went on
    release.set()
    time.sleep(0.2)
    assert mgr.score([sample("a", "a")])["reward/abandoned_threads"] == 0.0
