"""The sandbox fleet's metrics (issue 35 item 2): each run's start latency (launch to the
program's first line) and infrastructure failures (a process that cannot be made, a sandbox that
cannot start, a program not started at the time limit), recorded per episode and aggregated per
rollout (``sandbox/runs``, ``sandbox/failures``, ``sandbox/start_ms_p50``, ``_p99``)."""

import asyncio
import errno

import pytest

from reinforge.records import Sample, Status
from reinforge.rollout.generate import rollout_stats
from reinforge.sandbox import SandboxLimits, bwrap_path, run_python
from reinforge.sandbox import metrics as sandbox_metrics
from reinforge.sandbox import runner as sb
from tests.integration.test_agent import ScriptedEngine, agent_ctx, call, run_agent, tok  # noqa: F401

ISOLATIONS = ["none", pytest.param("bwrap", marks=pytest.mark.skipif(bwrap_path() is None, reason="no bwrap"))]
PROGRAM = "import sys\nprint('out')\nprint('err', file=sys.stderr)\n"


def recorded(code: str, isolation: str, **limits) -> tuple[sb.SandboxResult, sandbox_metrics.SandboxRuns]:
    async def go():
        with sandbox_metrics.recording() as runs:
            return await run_python(code, SandboxLimits(**{"timeout": 20.0, **limits}), isolation), runs

    return asyncio.run(go())


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_run_records_its_start_and_the_mark_is_not_in_the_output(isolation):
    r, runs = recorded(PROGRAM, isolation)
    assert r.returncode == 0 and r.stdout == "out\n" and r.stderr == "err\n", r  # the start mark is taken out
    assert r.infra_error is None and 0 < r.start_ms < r.seconds * 1000
    assert runs.runs == 1 and runs.failures == 0 and runs.start_ms == [r.start_ms]
    forged = f"import os\nos.write(2, {sb.START_MARK!r})\n"  # the program's own mark is its output
    r, _ = recorded(forged, isolation)
    assert r.stderr.encode() == sb.START_MARK and r.infra_error is None


def test_a_run_outside_an_episode_is_not_recorded():
    r = asyncio.run(run_python("pass", SandboxLimits(timeout=20), "none"))
    assert r.start_ms is not None  # measured, but no episode to count it in


def test_a_process_that_cannot_be_made_is_an_infrastructure_failure(monkeypatch):
    async def no_memory(*args, **kwargs):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(sb.asyncio, "create_subprocess_exec", no_memory)
    r, runs = recorded("print(1)", "none")
    assert "Cannot allocate memory" in r.infra_error and r.start_ms is None and r.returncode is None
    assert runs.runs == 1 and runs.failures == 1 and runs.start_ms == []


def test_a_program_not_started_at_the_time_limit_is_an_infrastructure_failure():
    for _ in range(3):  # an interpreter starts in >= 10 ms; on a loaded machine the event loop may wake only after
        r, runs = recorded("print(1)", "none", timeout=0.001)  # the child started or exited: then try again
        if r.timed_out and r.infra_error:
            break
    assert r.timed_out and "had not started" in (r.infra_error or "") and runs.failures == 1
    r, runs = recorded("import time\ntime.sleep(30)", "none", timeout=1.0)  # started, then too slow: the program's
    assert r.timed_out and r.infra_error is None and runs.failures == 0 and len(runs.start_ms) == 1


@pytest.mark.skipif(bwrap_path() is None, reason="no bwrap")
def test_a_sandbox_that_cannot_start_counts_as_a_failure(monkeypatch):
    monkeypatch.setattr(sb, "bwrap_path", lambda: "/bin/false")
    monkeypatch.setattr(sb, "check_sandbox", lambda *a, **k: None)  # it would refuse this bwrap (checked per path)
    r, runs = recorded("print(1)", "bwrap")
    assert r.infra_error and r.start_ms is None and runs.failures == 1 and runs.start_ms == []


def test_rollout_stats_sum_totals_and_pool_values_into_percentiles():
    def sample(i, totals=None, values=None):
        md = {"rollout_stats": {"agent/turns": 2.0}}
        if totals is not None:
            md["rollout_totals"], md["rollout_values"] = totals, values
        return Sample(prompt="", tokens=[1], response_length=0, index=i, metadata=md)

    samples = [
        sample(0, {"sandbox/runs": 2.0, "sandbox/failures": 1.0}, {"sandbox/start_ms": [30.0]}),
        sample(1, {"sandbox/runs": 3.0, "sandbox/failures": 0.0}, {"sandbox/start_ms": [10.0, 20.0, 500.0]}),
        sample(2),
    ]
    m = rollout_stats(samples)
    assert m["agent/turns"] == 2.0 and m["sandbox/runs"] == 5.0 and m["sandbox/failures"] == 1.0
    assert m["sandbox/start_ms_p50"] == 30.0 and m["sandbox/start_ms_p99"] == 500.0  # nearest rank over 4 runs
    assert "sandbox/runs" not in rollout_stats([sample(3)])


def test_the_python_tools_runs_reach_the_rollout_metrics(tok):  # noqa: F811
    turns = [call("python", code="print(6 * 7)"), call("python", code="print(1)"), "42"]
    ctx = agent_ctx(tok, ScriptedEngine(tok, lambda prompt, turn: turns[turn]), "agent.max_turns=4")
    samples = run_agent(ctx, "what is 6*7?", "and now?", n=2)
    assert all(s.status == Status.COMPLETED for s in samples)
    assert all(s.metadata["rollout_totals"] == {"sandbox/runs": 2.0, "sandbox/failures": 0.0} for s in samples)
    m = rollout_stats(samples)
    assert m["sandbox/runs"] == 8 and m["sandbox/failures"] == 0
    assert 0 < m["sandbox/start_ms_p50"] <= m["sandbox/start_ms_p99"] < 20_000


def test_a_failed_sandbox_of_the_python_tool_is_counted(tok, monkeypatch):  # noqa: F811
    async def no_processes(*args, **kwargs):
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    async def no_fork(self, *args, **kwargs):
        raise sb.LaunchError("fork: [Errno 11] Resource temporarily unavailable")

    monkeypatch.setattr(sb.asyncio, "create_subprocess_exec", no_processes)  # a launcher per run
    monkeypatch.setattr(sb.launch_server.LaunchServer, "launch", no_fork)  # the launch server
    turns = [call("python", code="print(6 * 7)"), "42"]
    ctx = agent_ctx(tok, ScriptedEngine(tok, lambda prompt, turn: turns[turn]))
    (s,) = run_agent(ctx, "what is 6*7?")
    assert s.status == Status.FAILED and "could not start" in s.metadata["infra_failure"]
    m = rollout_stats([s])
    assert m["sandbox/failures"] == 1 and m["sandbox/runs"] == 1 and "sandbox/start_ms_p50" not in m


def test_the_swe_environments_test_runs_are_counted(tok):  # noqa: F811
    from reinforge.envs.swe_data import generate_repos
    from tests.integration.test_swe_env import _call, _play

    (row,) = generate_repos(1, seed=3)
    bug = row["metadata"]["swe"]["bug"]
    turns = [_call("run_tests"), _call("replace_in_file", path=bug["path"], old=bug["buggy"], new=bug["fixed"]), "ok"]
    s, _ = _play(tok, row, lambda prompt, turn: turns[turn])
    assert s.reward == 1.0  # one run in a call, one final run after the edit
    assert s.metadata["rollout_totals"] == {"sandbox/runs": 2.0, "sandbox/failures": 0.0}
    assert len(s.metadata["rollout_values"]["sandbox/start_ms"]) == 2
