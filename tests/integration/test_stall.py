"""The stall doctor (reinforge/utils/stall.py): a hang of each kind is named in one line and the
stacks file holds the hung frame."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from reinforge.envs import Environment, Step, Turn
from reinforge.utils import stall, trace


class Found:
    """A Doctor's on_stall for tests: keeps the Stall and wakes the test."""

    def __init__(self) -> None:
        self.stall: stall.Stall | None = None
        self.event = threading.Event()

    def __call__(self, s: stall.Stall) -> None:
        self.stall = s
        self.event.set()

    def wait(self, timeout: float = 20.0) -> stall.Stall:
        assert self.event.wait(timeout), "the doctor did not report a stall"
        assert self.stall is not None
        return self.stall


@pytest.fixture(autouse=True)
def no_activity_of_other_tests():
    """The registry is per process: an xdist worker's earlier tests may have left a component busy (an
    engine whose test ended mid-generation and is not collected yet); each test here starts without them."""
    import gc

    gc.collect()  # (dropped components close their activities when collected)
    stall._open.clear()
    yield


def doctor(tmp_path: Path, timeout_s: float = 1.0) -> tuple[stall.Doctor, Found]:
    found = Found()
    return stall.Doctor(tmp_path, timeout_s, on_stall=found), found


def test_bad_settings_name_the_key(tmp_path):
    with pytest.raises(ValueError, match=r"run.stall_timeout_s=-1 must be > 0"):
        stall.Doctor(tmp_path, -1)
    with pytest.raises(ValueError, match=r"run.stall_action='kill' must be one of fail, restart"):
        stall.Doctor(tmp_path, 5, "kill")


def test_config_refuses_a_negative_timeout():
    from reinforge.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"run.stall_timeout_s must be > 0"):
        load_config(None, ["run.stall_timeout_s=-5"])
    with pytest.raises(ConfigError, match=r"run.stall_action"):
        load_config(None, ["run.stall_action=kill"])
    assert load_config(None, []).run.stall_timeout_s == 1800.0  # on by default
    assert load_config(None, ["run.stall_timeout_s=null"]).run.stall_timeout_s is None


def test_progress_keeps_the_doctor_quiet(tmp_path):
    d, found = doctor(tmp_path, 0.6)
    with d:
        for _ in range(12):  # 1.8 s of phases that end: no stall
            with trace.span("tick"):
                time.sleep(0.15)
    assert found.stall is None
    assert not (tmp_path / "stall").exists()  # a run without a stall leaves no files


def test_a_hung_phase_names_the_loop_phase(tmp_path):
    d, found = doctor(tmp_path, 0.5)
    release = threading.Event()
    with d, trace.span("rollout_step"), trace.span("generate"):
        s = found.wait()
        release.set()
    assert s.line.startswith("loop: in rollout_step > generate for ")
    assert "test_a_hung_phase_names_the_loop_phase" in s.stacks.read_text()


def test_the_most_specific_oldest_activity_is_named():
    now_reports = [
        {
            "role": "driver",
            "activities": [
                {"kind": "engine", "what": "engine", "age_s": 50, "idle_s": 40, "fields": {"sequences": 8}},
                {"kind": "env", "what": "MyEnv.step of sample 3", "age_s": 20, "idle_s": 20, "fields": {}},
                {"kind": "env", "what": "MyEnv.step of sample 4", "age_s": 30, "idle_s": 30, "fields": {}},
            ],
            "phases": [{"thread": "MainThread", "phases": ["rollout_step", "rollout"], "age_s": 50}],
        }
    ]
    line = stall.diagnose(now_reports)
    assert line == (
        "environment call MyEnv.step of sample 4 running for 30 s (and 1 more env activity) "
        "(loop phase: rollout_step > rollout)"
    )


def test_a_hung_engine_is_named(tmp_path, tiny_model_path):
    import torch

    from reinforge.config import EngineConfig
    from reinforge.engine import EmbeddedEngine
    from reinforge.models.loading import build_model
    from reinforge.records import GenerateRequest, SamplingParams

    eng = EmbeddedEngine(build_model(tiny_model_path, torch.float32), EngineConfig(max_num_seqs=4), max_model_len=64)
    release = threading.Event()
    decode = eng.runner.decode
    calls = [0]

    def hung_decode(*args):
        calls[0] += 1
        if calls[0] > 2:  # two tokens, then the device hangs
            release.wait(30)
        return decode(*args)

    eng.runner.decode = hung_decode
    d, found = doctor(tmp_path, 1.0)
    params = SamplingParams(max_new_tokens=20, temperature=1.0)
    with d:
        requests = [GenerateRequest([1, 2, 3 + i], params, n=2) for i in range(3)]
        t = threading.Thread(target=eng.generate, args=(requests,))
        t.start()
        s = found.wait()
        release.set()
        t.join()
    assert s.line.startswith("engine: 6 sequences in flight (4 running, 2 waiting), no token for "), s.line
    assert "in hung_decode" in s.stacks.read_text()
    assert not eng.has_unfinished() and eng._heartbeat.activity is None  # idle again: nothing reported


def _hung_collective_rank(rank: int, world: int, port: int, ready) -> None:
    import torch

    from reinforge.train.collectives import ParallelContext

    pc = ParallelContext.init(rank, world, "127.0.0.1", port, torch.device("cpu"), timeout_s=120)
    ready.put(rank)
    if rank == 0:
        pc.max_int(1)  # rank 1 never comes
    else:
        with trace.span("train_actor"):
            rank_stuck_elsewhere()


def rank_stuck_elsewhere() -> None:
    time.sleep(120)


def test_a_hung_collective_on_two_gloo_ranks(tmp_path):
    import multiprocessing as mp

    from reinforge.utils.net import free_port

    d, found = doctor(tmp_path, 1.5)
    d.prepare()  # the ranks find the run's stall directory in the environment
    ctx = mp.get_context("spawn")
    ready = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_hung_collective_rank, args=(r, 2, port, ready)) for r in range(2)]
    try:
        for p in procs:
            p.start()
        assert sorted(ready.get(timeout=120) for _ in procs) == [0, 1]
        with d:
            s = found.wait(30)
    finally:
        for p in procs:
            p.kill()
    assert s.line.startswith("rank 0 waits in all_reduce (max_int) for "), s.line
    assert s.line.endswith("; rank 1 is in no collective (in train_actor)"), s.line
    stacks = s.stacks.read_text()
    assert "(rank 0) ====" in stacks and "(rank 1) ====" in stacks
    assert "in max_int" in stacks and "in rank_stuck_elsewhere" in stacks


def reward_stuck(sample) -> float:
    """A reward function that hangs (loaded into a reward worker through its module:function)."""
    time.sleep(120)
    return 1.0


def test_a_hung_reward_worker_is_named(tmp_path):
    from reinforge.records import Sample
    from reinforge.reward.workers import RewardProcessPool

    d, found = doctor(tmp_path, 1.5)
    d.prepare()  # the worker finds the stall directory in the environment
    pool = RewardProcessPool("tests.integration.test_stall:reward_stuck", size=1, timeout=120)
    pool.start()
    sample = Sample(prompt="p", tokens=[1, 2, 3], response_length=1, label="4", index=0)
    run = threading.Thread(target=pool.run, args=([sample],), daemon=True)
    with d:
        run.start()
        s = found.wait(30)
    pool.workers[0].proc.kill()  # the call ends as "ended its worker process"
    run.join(30)
    pool.close()
    m = re.fullmatch(
        r"reward worker \d+ \(pid (\d+)\) inside tests.integration.test_stall:reward_stuck for [\d.]+ s", s.line
    )
    assert m, s.line
    stacks = s.stacks.read_text()
    assert f"pid {m[1]} (reward worker) ====" in stacks and "in reward_stuck" in stacks


def wait_for(kind: str, timeout: float = 60.0) -> None:
    """Until an activity of ``kind`` is open in this process (its start may be slow on a busy machine)."""
    deadline = time.monotonic() + timeout
    while not any(a.kind == kind for a in list(stall._open.values())):
        assert time.monotonic() < deadline, f"no {kind} activity after {timeout} s"
        time.sleep(0.05)


def test_a_hung_sandbox_is_named(tmp_path):
    import asyncio

    from reinforge.sandbox import SandboxLimits, run_python

    async def episode() -> None:
        stall.SUBJECT.set("sample 4")
        await run_python("import time\ntime.sleep(60)\n", SandboxLimits(timeout=60), isolation="none", launcher="exec")

    d, found = doctor(tmp_path, 1.0)
    runner = threading.Thread(target=asyncio.run, args=(episode(),), daemon=True)
    runner.start()
    wait_for("sandbox")
    with d:
        s = found.wait()
    assert re.fullmatch(r"sandbox \d+ \(pid \d+\) of sample 4 running for [\d.]+ s", s.line), s.line
    assert (
        "in run_until_complete" in s.stacks.read_text()
    )  # the event loop's thread (the program itself is sandboxed: not dumped)
    os.kill(int(s.line.split("(pid ")[1].split(")")[0]), signal.SIGKILL)
    runner.join(30)
    assert not [a for a in stall._open.values() if a.kind == "sandbox"]


STUCK = threading.Event()  # set: Stuck's step returns


class Stuck(Environment):
    """A one-turn environment whose (synchronous) step hangs until STUCK is set."""

    def step(self, turn: Turn) -> Step:
        STUCK.wait(60)
        return Step(done=True, reward=1.0)


def test_a_hung_environment_step_is_named(tmp_path, smollm2_path):
    from reinforge.models.loading import load_tokenizer
    from tests.integration.test_agent import ScriptedEngine, agent_ctx, run_agent

    tok = load_tokenizer(smollm2_path)
    ctx = agent_ctx(
        tok,
        ScriptedEngine(tok, lambda p, t: "hello"),
        "agent.environment=tests.integration.test_stall:Stuck",
        "agent.env_timeout=60",
    )
    STUCK.clear()
    d, found = doctor(tmp_path, 1.0)
    runner = threading.Thread(target=run_agent, args=(ctx, "a"), daemon=True)
    runner.start()
    wait_for("env")
    with d:
        s = found.wait()
    STUCK.set()
    runner.join(30)
    assert re.fullmatch(r"environment call Stuck.step of sample 0 running for [\d.]+ s", s.line), s.line
    assert 'test_stall.py", line' in s.stacks.read_text() and "in step" in s.stacks.read_text()
    assert not [a for a in stall._open.values() if a.kind == "env"]


def test_a_hung_engine_ends_reinforge_train_with_the_line_and_the_stacks(tmp_path, tiny_model_path):
    from reinforge import supervisor
    from tests.integration.test_faults import cli_train, overrides

    out = tmp_path / "run"
    args = overrides(
        tiny_model_path,
        out,
        **{"run.stall_timeout_s": 4, "train.num_rollout": 2, "cluster.weight_sync_probe_interval": 0},
    )
    proc = cli_train(tmp_path, args, fault="engine_step:1:hang")
    text, _ = proc.communicate(timeout=300)
    assert proc.returncode == stall.STALLED == supervisor.STALLED, text
    line = [x.split(" reinforge.utils.stall: ")[1] for x in text.splitlines() if " stalled: " in x]
    assert len(line) == 1, text
    assert re.match(
        r"stalled: engine: 8 sequences in flight \(8 running, 0 waiting\), no token for [\d.]+ s "
        r"\(loop phase: rollout_step > rollout > generate\); no progress for [\d.]+ s \(run.stall_timeout_s=4\); "
        r"stacks of every thread in .*/stall/stacks-[\d-]+\.txt; run.stall_action=fail: stopping",
        line[0],
    ), line[0]
    stacks = Path(line[0].split("stacks of every thread in ")[1].split(";")[0])
    assert stacks.parent == out / "stall"
    text = stacks.read_text()
    assert "(driver) ====" in text and 'engine.py", line' in text and "in hit" in text, text  # the hung frame


HUNG_RUN = """
import sys, time
from pathlib import Path
from reinforge.utils import stall, trace
run_dir, action = Path(sys.argv[1]), sys.argv[2]
marker = run_dir / "attempted"
if marker.exists():
    sys.exit(0)  # the relaunch finds nothing stuck
marker.parent.mkdir(parents=True, exist_ok=True)
marker.write_text("")
stall.Doctor(run_dir, 0.5, action).start()
with trace.span("rollout_step"), trace.span("reward"):
    time.sleep(60)
"""


@pytest.mark.parametrize("action, attempts, status", [("fail", 1, 124), ("restart", 2, 0)])
def test_the_supervisor_relaunches_a_stall_only_with_restart(tmp_path, action, attempts, status):
    import json
    import sys

    from reinforge import supervisor

    cmd = [sys.executable, "-c", HUNG_RUN, str(tmp_path), action]
    assert supervisor.supervise([], tmp_path, max_restarts=2, command=cmd) == status
    rows = [json.loads(x) for x in (tmp_path / "restarts.jsonl").read_text().splitlines()]
    assert len(rows) == attempts
    assert rows[0]["exit_code"] == (124 if action == "fail" else 75)
    assert (
        rows[0]["error"].startswith("StallError: stalled: loop: in rollout_step > reward for ")
        and f"run.stall_action={action}" in rows[0]["error"]
    ), rows[0]
    assert len(list((tmp_path / "stall").glob("stacks-*.txt"))) == 1


def test_a_process_that_took_a_joined_process_pid_is_never_signalled(tmp_path):
    import json
    import subprocess
    import sys

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        d = stall.Doctor(tmp_path, 5).prepare()
        report = {**stall.snapshot("rank 1", 1), "pid": other.pid, "started": "1"}  # an ended rank's pid, reused
        (d.dir / f"proc-{other.pid}.json").write_text(json.dumps(report))
        assert d.joined_here() == {}
        d.write_stacks(wait_s=0.2)
        assert stall.read_reports(d.dir, os.getpid()) == [] and not list(d.dir.glob("proc-*.json"))
        assert other.poll() is None  # not signalled (SIGUSR2 would have ended it)
        d.stop()
    finally:
        other.kill()
        other.wait()


def test_a_hung_sglang_server_is_named(tmp_path):
    from reinforge.records import GenerateRequest, SamplingParams
    from reinforge.rollout.backends.sglang import SGLangEngine, SGLangServer
    from tests.unit.test_sglang import FakeSGLang

    release = threading.Event()

    class Hung(FakeSGLang):
        def handle(self, path, body):
            if path == "/generate" and body["input_ids"][-1] == 99:
                release.wait(60)  # this request is never answered in time
            return super().handle(path, body)

    server = Hung()
    engine = SGLangEngine([SGLangServer(server.url)], seed=0)
    params = SamplingParams(max_new_tokens=4)
    requests = [GenerateRequest([1, 10], params, n=1), GenerateRequest([1, 99], params, n=2)]
    d, found = doctor(tmp_path, 1.0)
    runner = threading.Thread(target=engine.generate, args=(requests,), daemon=True)
    runner.start()
    wait_for("engine")
    with d:
        s = found.wait()
    release.set()
    runner.join(30)
    engine.shutdown()
    server.close()
    assert re.fullmatch(r"engine \(sglang\): 2 sequences in flight, no answer for [\d.]+ s", s.line), s.line


BUSY_RANK = """
import time
from reinforge.utils import stall, trace
stall.join("rank 1", rank=1)
while True:
    with trace.span("micro_batch"):
        time.sleep(0.05)
"""


def test_progress_of_another_process_counts(tmp_path):
    """The driver waits (a Ray call) while a rank works: no stall until that rank stops."""
    import subprocess
    import sys

    d, found = doctor(tmp_path, 1.0)
    d.prepare()
    rank = subprocess.Popen([sys.executable, "-c", BUSY_RANK])
    try:
        deadline = time.monotonic() + 60
        while not list(d.dir.glob("proc-*.json")):
            assert time.monotonic() < deadline and rank.poll() is None
            time.sleep(0.05)
        with d, trace.span("train"):
            time.sleep(2.5)
            assert found.stall is None  # the rank's phases kept ending
            rank.kill()
            s = found.wait()
    finally:
        rank.kill()
        rank.wait()
    assert s.line.startswith("loop: in train for "), s.line


def test_ranks_waiting_in_a_collective_and_the_rank_they_wait_for():
    def rank(r: int, acts: list, phases: list) -> dict:
        return {"role": f"rank {r}", "rank": r, "activities": acts, "phases": phases}

    def waits(r: int, age: float) -> dict:
        fields = {"rank": r, "world_size": 4}
        return {"kind": "collective", "what": "all_reduce (floats)", "age_s": age, "idle_s": age, "fields": fields}

    reports = [
        {"role": "driver", "activities": [], "phases": [{"thread": "MainThread", "phases": ["train"], "age_s": 700}]},
        *(rank(r, [waits(r, 600 + r)], []) for r in range(3)),
        rank(3, [], [{"thread": "MainThread", "phases": ["train_actor", "micro_batch", "forward"], "age_s": 650}]),
    ]
    assert stall.diagnose(reports) == (
        "ranks 0, 1, 2 wait in all_reduce (floats) for 602 s; rank 3 is in no collective "
        "(in train_actor > micro_batch > forward) (loop phase: train)"
    )
