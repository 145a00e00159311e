"""The sandbox's launch server (issue 35 item 2): one process per trainer forks the launcher of each
run. Its failures are the fleet's, never the program's: a server killed between runs is replaced
without the caller noticing, one killed during a run ends that run as an infrastructure failure
(and takes the program with it), runs sent while it restarts all start. The program cannot reach
the server, and nothing outlives the trainer. The security properties of the runs themselves are
tests/integration/test_sandbox.py's (they run through the server)."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from reinforge.sandbox import SandboxLimits, bwrap_path, run_python
from reinforge.sandbox import launch_server as ls
from tests.integration.test_sandbox import PROJECT, host_processes_with

pytestmark = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed")


def run(code: str, **kw) -> object:
    return asyncio.run(run_python(code, SandboxLimits(timeout=kw.pop("timeout", 10.0)), checked=True, **kw))


def _kill_server() -> int:
    pid = ls.server().pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while ls.server().pid == pid and time.monotonic() < deadline:  # the reader thread sees it go
        time.sleep(0.01)
    return pid


def _gone(token: str, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while host_processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    return host_processes_with(token) == []


def test_runs_share_one_server_and_see_none_of_it():
    """Runs go through one server (started once); the program's descriptors are its own streams
    only: no socket (the server's) and nothing of the trainer's."""
    code = (
        "import os, json\nfds = {}\nfor fd in os.listdir('/proc/self/fd'):\n"
        "    try:\n        fds[fd] = os.readlink('/proc/self/fd/' + fd)\n    except OSError:\n        pass\n"
        "print(json.dumps(fds))"
    )
    r1 = run(code)
    pid = ls.server().pid
    r2 = run("print(1)")
    assert r1.returncode == 0 and r2.stdout.strip() == "1" and ls.server().pid == pid is not None, (r1, r2)
    fds = json.loads(r1.stdout)
    assert not [t for t in fds.values() if t.startswith("socket:")], fds
    assert set(fds) <= {"0", "1", "2", "3"}, fds  # the streams, and the listing's own descriptor
    assert r1.start_ms is not None and r1.start_ms > 0


def test_a_server_killed_between_runs_is_replaced_transparently():
    run("pass")
    before, restarts = _kill_server(), ls.server().restarts
    r = run("print(6 * 7)")
    assert r.stdout.strip() == "42" and r.infra_error is None, r
    assert ls.server().pid not in (None, before) and ls.server().restarts == restarts + 1


def test_a_server_killed_during_a_run_is_an_infrastructure_failure():
    """The program dies with the server (parent-death signal of its launcher, then bwrap's pid 1):
    the run ends at once as the sandbox's failure, never an exit status of the program's."""
    token = uuid.uuid4().hex
    code = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'import time; time.sleep(60)', '{token}'])"

    async def go():
        task = asyncio.ensure_future(run_python(code, SandboxLimits(timeout=60), checked=True))
        deadline = time.monotonic() + 30
        while not host_processes_with(token) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert host_processes_with(token), "the program did not start"
        os.kill(ls.server().pid, signal.SIGKILL)
        return await task

    r = asyncio.run(go())
    assert r.infra_error and "launch server died" in r.infra_error, r
    assert r.returncode is None and not r.timed_out and r.seconds < 30, r
    assert _gone(token)
    assert run("print(1)").stdout.strip() == "1"


def test_runs_sent_while_the_server_restarts_all_start():
    run("pass")
    os.kill(ls.server().pid, signal.SIGKILL)  # not waited for: some runs meet the dead server

    async def many():
        return await asyncio.gather(*(run_python("print(7)", SandboxLimits(), checked=True) for _ in range(6)))

    results = asyncio.run(many())
    assert [(r.stdout.strip(), r.infra_error) for r in results] == [("7", None)] * 6, results


def test_a_server_that_cannot_fork_gives_an_infrastructure_failure(monkeypatch):
    async def refuse(self, args, fds, targets):
        raise ls.LaunchError("fork: [Errno 11] Resource temporarily unavailable")

    monkeypatch.setattr(ls.LaunchServer, "launch", refuse)
    r = run("print(1)")
    assert r.infra_error and "Resource temporarily unavailable" in r.infra_error and r.returncode is None, r


def test_a_cancelled_run_is_killed():
    token = uuid.uuid4().hex
    code = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'import time; time.sleep(60)', '{token}'])"

    async def go():
        task = asyncio.ensure_future(run_python(code, SandboxLimits(timeout=60), checked=True))
        deadline = time.monotonic() + 30
        while not host_processes_with(token) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    assert _gone(token)


def test_the_launcher_per_run_still_works():
    r = run("print(6 * 7)", launcher="exec")
    assert r.stdout.strip() == "42" and r.infra_error is None and r.start_ms is not None, r
    with pytest.raises(ValueError, match="launcher"):
        run("pass", launcher="fork")


def test_the_server_outlives_the_thread_of_its_first_run_not_the_trainer():
    """A stand-in trainer makes its first run from a thread that then exits (as check_sandbox's
    trial does): the server stays (its parent-death signal follows the reader thread, not the
    caller's); when the trainer is SIGKILLed during a run, server and program die with it."""
    token = uuid.uuid4().hex
    script = f"""
import asyncio, sys, threading
from reinforge.sandbox import launch_server as ls
from reinforge.sandbox import SandboxLimits, run_python
t = threading.Thread(target=lambda: asyncio.run(run_python("pass", SandboxLimits(), checked=True)))
t.start(); t.join()
first = ls.server().pid
asyncio.run(run_python("pass", SandboxLimits(), checked=True))
print(first, ls.server().pid, flush=True)
code = "import subprocess, sys\\nsubprocess.run([sys.executable, '-c', 'import time; time.sleep(60)', '{token}'])"
asyncio.run(run_python(code, SandboxLimits(timeout=60), checked=True))
"""
    trainer = subprocess.Popen([sys.executable, "-c", script], cwd=str(PROJECT), stdout=subprocess.PIPE, text=True)
    try:
        first, second = map(int, trainer.stdout.readline().split())
        assert first == second, (first, second)
        deadline = time.monotonic() + 30
        while not host_processes_with(token) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host_processes_with(token), "the program did not start"
    finally:
        trainer.kill()
        trainer.wait()
    assert _gone(token)
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{first}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{first}") or "Z" in open(f"/proc/{first}/stat").read().split()[2]
