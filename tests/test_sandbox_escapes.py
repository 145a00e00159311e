"""The sandbox escapes of issue 51 ("Trust III"), each tried the way the agent loop runs model code
(``run_python``), as root with bubblewrap as CI runs: E1 rewriting the sandbox's pid 1, E2 vsock
sockets, E3 unbounded open files, E5 per-uid kernel quotas shared by every sandbox; and the start-up
check of issue 57 (the sandbox found broken before any model is built). Each test says what the
attack was and what holds it."""

import asyncio
import errno
import json
import os
import platform
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import reinforge
from reinforge.tools import sandbox as sb
from reinforge.tools.sandbox import SandboxLimits, bwrap_path, run_python

needs_bwrap = pytest.mark.skipif(
    bwrap_path() is None,
    reason="bubblewrap (bwrap) is not installed: `make setup` installs it when run as root, "
    "or `apt-get install bubblewrap`",
)
PROJECT = Path(reinforge.__file__).resolve().parents[1]


def run(code: str, **limits) -> sb.SandboxResult:
    return asyncio.run(run_python(code, SandboxLimits(**{"timeout": 8.0, **limits})))


def report(r: sb.SandboxResult) -> dict:
    """The JSON the program printed last."""
    assert r.stdout.strip(), r
    return json.loads(r.stdout.strip().splitlines()[-1])


def host_processes_with(token: str) -> list[int]:
    """Host processes whose command line holds ``token``."""
    found = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if token in (p / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(p.name))
            except OSError:
                pass
    return [p for p in found if p != os.getpid()]


def gone(token: str, seconds: float) -> bool:
    """Whether no host process holds ``token`` within ``seconds``."""
    deadline = time.monotonic() + seconds
    while host_processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not host_processes_with(token)


# ------------------------------------------------------------------ E1: pid 1 of the sandbox
ATTEMPT = """
import json, os
out = {}
def attempt(name, fn):
    try:
        fn()
        out[name] = "ok"
    except OSError as e:
        out[name] = e.errno
"""


@needs_bwrap
def test_pid_1_is_out_of_the_programs_reach():
    """The primitive of E1: pid 1 (bubblewrap's reaper) ran as the program's uid, dumpable, so the
    program could open ``/proc/1/mem`` read-write, read ``/proc/1/syscall`` (where pid 1 waits) and
    take its descriptors with ``pidfd_getfd``. Now pid 1 is the sandbox's own init, non-dumpable
    (the program has no capability to pass that check), ``pidfd_getfd`` is denied by the filter too,
    and signals sent to it from inside are ignored (the program keeps running after them)."""
    code = (
        ATTEMPT
        + """
import ctypes, signal
libc = ctypes.CDLL(None, use_errno=True)
def getfd():
    pidfd = os.pidfd_open(1)
    if libc.syscall(438, pidfd, 0, 0) < 0:  # pidfd_getfd (x86_64 and every architecture's generic number)
        raise OSError(ctypes.get_errno(), "pidfd_getfd")
attempt("mem_rw", lambda: open("/proc/1/mem", "r+b").close())
attempt("mem_r", lambda: open("/proc/1/mem", "rb").read(1))
attempt("syscall", lambda: open("/proc/1/syscall").read())
attempt("environ", lambda: open("/proc/1/environ").read())
attempt("getfd", getfd)
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
    os.kill(1, s)
out["pid"] = os.getpid()
out["init"] = [line for line in open("/proc/1/status").read().splitlines() if line.startswith("Name:")]
print(json.dumps(out))
"""
    )
    r = run(code)
    assert r.returncode == 0, r
    res = report(r)
    assert res["pid"] != 1, res  # the program is not pid 1: an init of ours reaps and enforces
    for name in ("mem_rw", "mem_r", "syscall", "environ"):
        assert res[name] == errno.EACCES, res
    assert res["getfd"] == errno.EPERM, res


# x86_64 machine code written over pid 1's next instructions: prctl(PR_SET_PDEATHSIG, 0), then pause() forever.
CLEAR_PDEATHSIG = "b89d000000bf0100000031f60f05b8220000000f05ebf7"

REWRITE_PID_1 = """
import os, subprocess, sys, time
try:  # the audit's attack: pid 1 waits in wait4(); put code where it resumes, then wake it
    pc = int(open("/proc/1/syscall").read().split()[-1], 16)
    with open("/proc/1/mem", "r+b", buffering=0) as mem:
        mem.seek(pc)
        mem.write(bytes.fromhex("%s"))
    if os.fork() == 0:  # an orphan that pid 1 reaps: wait4 returns into the code above
        if os.fork() == 0:
            time.sleep(0.1)
            os._exit(0)
        os._exit(0)
    os.wait()
    time.sleep(0.5)
    print("pid 1 rewritten", flush=True)
except OSError as e:
    print("refused:", e, flush=True)
subprocess.run([sys.executable, "-c", "import time; time.sleep(60)", "%s" + "%s"])
"""


def rewrite_pid_1(token: str) -> str:
    """The attack's program; its sleep carries ``token`` (joined at run time: the program's text, in
    a stand-in trainer's command line, must not match)."""
    return REWRITE_PID_1 % (CLEAR_PDEATHSIG, token[:16], token[16:])


@needs_bwrap
@pytest.mark.skipif(platform.machine() != "x86_64", reason="the attack's machine code is x86_64's")
def test_rewriting_pid_1_keeps_nothing_alive_past_the_time_limit_without_a_cgroup(monkeypatch):
    """E1 at the time limit, where no cgroup can be made (the documented fallback): the program
    rewrites pid 1 to clear its parent-death signal and leaves a ``sleep``. Before, killing bwrap at
    the time limit left pid 1, the program and the sleep running, and they held the output open (it
    was lost). Now the rewrite is refused, and the host kills pid 1 itself (its host pid comes from
    bwrap's status descriptor): nothing is left and the output is kept."""
    monkeypatch.setattr(sb, "_group_limits", lambda lim: None)
    token = uuid.uuid4().hex
    r = run(rewrite_pid_1(token), timeout=3)
    try:
        assert r.timed_out, r
        assert gone(token, 2), "a process of the sandbox outlived its time limit"
        assert r.stdout.startswith("refused:"), r
    finally:
        for pid in host_processes_with(token):
            os.kill(pid, 9)


@needs_bwrap
@pytest.mark.skipif(platform.machine() != "x86_64", reason="the attack's machine code is x86_64's")
def test_rewriting_pid_1_keeps_nothing_alive_after_the_trainer_is_killed():
    """E1 as the audit found it: the program rewrites pid 1 to clear its parent-death signal, the
    trainer is SIGKILLed; pid 1, the program and a sleep it left were still running 23 s later. Now
    nothing of the sandbox survives the trainer, without a cgroup too (no next trainer cleans up)."""
    token = uuid.uuid4().hex
    script = f"""
import asyncio
from reinforge.tools import sandbox as sb
sb._group_limits = lambda lim: None
asyncio.run(sb.run_python({rewrite_pid_1(token)!r}, sb.SandboxLimits(timeout=60)))
"""
    trainer = subprocess.Popen([sys.executable, "-c", script], cwd=str(PROJECT))
    try:
        deadline = time.monotonic() + 30
        while not host_processes_with(token) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host_processes_with(token), "the program did not start"
        trainer.kill()
        trainer.wait()
        assert gone(token, 5), "a process of the sandbox outlived the trainer"
    finally:
        trainer.kill()
        for pid in host_processes_with(token):
            os.kill(pid, 9)
