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
from reinforge.sandbox import SandboxLimits, bwrap_path, run_python
from reinforge.sandbox import runner as sb

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
    monkeypatch.setattr(sb, "_group_limits", lambda lim, sandboxes: None)
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
from reinforge.sandbox import runner as sb
sb._group_limits = lambda lim, sandboxes: None
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


# ------------------------------------------------------------------ E2: socket families without a namespace
@needs_bwrap
def test_socket_families_the_network_namespace_does_not_isolate_are_refused():
    """E2: ``socket(AF_VSOCK)`` worked inside: the sandbox bound and listened on a vsock port the
    host then could not bind (one port space with the host), and a connect to CID 1 went out; the
    network namespace does not cover vsock. Now the seccomp filter answers ``EAFNOSUPPORT`` for every
    family but AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK: through ``socket``, ``socketpair`` and a raw
    system call whose family has high bits set (the kernel reads an ``int``). AF_PACKET (which needs
    a capability the program lacks: EPERM before) is refused the same way. The families Python uses
    still work (loopback inside the namespace, Unix socket pairs for multiprocessing)."""
    import pyseccomp

    nr = {n: int(pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, n)) for n in ("socket", "socketpair")}
    code = f"""
import ctypes, json, socket
libc = ctypes.CDLL(None, use_errno=True)
out = {{}}
def make(name, family, kind=1, pair=False, high=0):
    ctypes.set_errno(0)
    if pair:
        fds = (ctypes.c_int * 2)()
        rc = libc.syscall({nr["socketpair"]}, ctypes.c_long(family | high), kind, 0, fds)
    else:
        rc = libc.syscall({nr["socket"]}, ctypes.c_long(family | high), kind, 0)
    out[name] = "ok" if rc >= 0 else ctypes.get_errno()
make("vsock", 40)
make("vsock_dgram", 40, 2)
make("vsock_pair", 40, pair=True)
make("vsock_high_bits", 40, high=1 << 32 if ctypes.sizeof(ctypes.c_long) == 8 else 0)
make("packet", 17, 3)
make("alg", 38, 5)
make("bluetooth", 31, 5)
make("unix", 1)
make("inet", 2)
make("inet6", 10)
make("netlink", 16, 3)
try:
    socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    out["socket_module"] = "ok"
except OSError as e:
    out["socket_module"] = e.errno
a, b = socket.socketpair()
a.sendall(b"x")
out["socketpair"] = b.recv(1).decode()
print(json.dumps(out))
"""
    res = report(run(code))
    refused = {"vsock", "vsock_dgram", "vsock_pair", "vsock_high_bits", "packet", "alg", "bluetooth", "socket_module"}
    assert {k: res[k] for k in refused} == dict.fromkeys(refused, errno.EAFNOSUPPORT), res
    assert {k: res[k] for k in ("unix", "inet", "inet6", "netlink")} == dict.fromkeys(
        ("unix", "inet", "inet6", "netlink"), "ok"
    ), res
    assert res["socketpair"] == "x", res


# ------------------------------------------------------------------ E3: open files and the per-process class
OPEN_FILES = """
import json, os, resource, subprocess, sys
fds = []
try:
    while len(fds) < 100000:
        fds.append(os.open("/dev/null", os.O_RDONLY))
except OSError as e:
    err = e.errno
n = len(fds)
for fd in fds:
    os.close(fd)
child = subprocess.run([sys.executable, "-c", "import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE)[1])"],
                       capture_output=True, text=True, close_fds=True)
print(json.dumps({"opened": n, "errno": err, "child": int(child.stdout or -1),
                  "nofile": resource.getrlimit(resource.RLIMIT_NOFILE),
                  "msgqueue": resource.getrlimit(resource.RLIMIT_MSGQUEUE),
                  "sigpending": resource.getrlimit(resource.RLIMIT_SIGPENDING)}))
"""


@needs_bwrap
def test_open_files_are_bounded_per_process():
    """E3: RLIMIT_NOFILE was the trainer's (20000 here) and never lowered: one sandbox held 160,044
    open files (half the host's file table) for 46 MiB of its cgroup. Now each process of the sandbox
    may hold ``max_open_files`` (``sandbox.max_open_files``, default 1024), its children too, and
    the other per-uid counters of that class are bounded per process (message-queue bytes, queued
    signals). Opening /dev/null in a loop stops at the limit with EMFILE."""
    res = report(run(OPEN_FILES))
    assert res["errno"] == errno.EMFILE and res["opened"] < 1024 and res["nofile"] == [1024, 1024], res
    assert res["nofile"] == [sb.DEFAULT_MAX_OPEN_FILES] * 2 and res["child"] == sb.DEFAULT_MAX_OPEN_FILES, res
    assert res["errno"] == errno.EMFILE and res["opened"] < sb.DEFAULT_MAX_OPEN_FILES, res
    assert res["msgqueue"] == [sb.MSGQUEUE_BYTES] * 2 and res["sigpending"] == [sb.SIGPENDING] * 2, res
    small = report(run(OPEN_FILES, max_open_files=64))
    assert small["nofile"] == [64, 64] and small["errno"] == errno.EMFILE and small["opened"] < 64, small


@needs_bwrap
def test_the_python_tool_takes_its_open_files_from_the_config():
    """``sandbox.max_open_files`` reaches the sandbox through the ``python`` tool."""
    from reinforge.config import SandboxConfig
    from reinforge.tools.builtin import make_python

    tool = make_python(None, sb.Sandboxes.from_config(SandboxConfig(max_open_files=100)))
    out = asyncio.run(tool("import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE))"))
    assert out == "(100, 100)", out


# ------------------------------------------------------------------ E5: per-uid kernel quotas
HOG_INOTIFY = """
import ctypes, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
n = 0
while n < 100000 and libc.inotify_init() >= 0:
    n += 1
print(n, ctypes.get_errno(), flush=True)
subprocess.run([sys.executable, "-c", "import time; time.sleep(30)", "%s" + "%s"])
"""


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0, reason="a sandbox of a trainer that is not root runs as the trainer's uid")
def test_one_sandbox_cannot_take_another_sandboxes_per_uid_quota():
    """E5: every sandbox ran as host uid 990000, so one could take all the inotify instances of that
    uid (``fs.inotify.max_user_instances``, counted per host uid across user namespaces) and the
    next sandboxes could not make one (the same for the key quota of their session keyrings and the
    message-queue bytes). Now each sandbox running at once has a host uid of its own (a lease on
    ``sandbox.uid + slot``): while one sandbox holds every instance its uid may have,
    another still makes one, and the two run as different host uids."""
    token = uuid.uuid4().hex

    async def both():
        hog = asyncio.ensure_future(run_python(HOG_INOTIFY % (token[:16], token[16:]), SandboxLimits(timeout=30)))
        try:
            for _ in range(300):
                await asyncio.sleep(0.05)
                if pids := host_processes_with(token):
                    break
            else:
                raise AssertionError(f"the hog did not start: {await hog}")
            hog_uid = Path(f"/proc/{pids[0]}/status").read_text().split("Uid:")[1].split()[0]
            probe = (
                "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                "print(libc.inotify_init(), ctypes.get_errno())"
            )
            other = await run_python(probe, SandboxLimits(timeout=8))
            return other, int(hog_uid)
        finally:
            hog.cancel()
            try:
                await hog
            except asyncio.CancelledError:
                pass

    other, hog_uid = asyncio.run(both())
    fd, err = (int(x) for x in other.stdout.split())
    assert fd >= 0, f"the second sandbox could not make an inotify instance (errno {err})"
    assert sb.DEFAULT_SANDBOX_UID <= hog_uid < sb.DEFAULT_SANDBOX_UID + sb.DEFAULT_SANDBOX_UIDS
    assert gone(token, 2)


@pytest.mark.skipif(os.geteuid() != 0, reason="uid leases are taken by a root trainer")
def test_uid_leases_are_exclusive_and_given_back(caplog, monkeypatch):
    """Each lease is a uid no other running sandbox holds (any trainer of the machine: an ``flock``
    on a file per uid); with every uid of the range held, the sandbox shares the first one, with a
    warning naming the keys; closing the descriptor gives the uid back."""
    from reinforge.sandbox import isolation
    from reinforge.sandbox.isolation import lease_uid

    monkeypatch.setattr(isolation, "_warned_uids", [])
    base = 4_100_000_000 + os.getpid() % 1000 * 10  # a range of this test's own
    held = [lease_uid(base, 3) for _ in range(3)]
    try:
        assert sorted(u for u, _ in held) == [base, base + 1, base + 2] and all(fd is not None for _, fd in held)
        assert lease_uid(base, 3) == (base, None)
        assert "all 3 of" in caplog.text and "sandbox.num_uids" in caplog.text, caplog.text
        os.close(held[1][1])
        again = lease_uid(base, 3)
        assert again[0] == held[1][0] and again[1] is not None
        held[1] = again
    finally:
        for _, fd in held:
            if fd is not None:
                os.close(fd)
    assert lease_uid(base, 1) == (base, None)  # one uid for all: no lease


def test_bwrap_is_found_on_path_or_named_explicitly(monkeypatch, tmp_path):
    """Issue 57: removing bwrap from PATH did not disable the sandbox (a fixed /usr/bin/bwrap was
    used). Now PATH decides, and ``$REINFORGE_BWRAP`` names another executable explicitly."""
    from reinforge.sandbox.isolation import BWRAP_ENV

    monkeypatch.delenv(BWRAP_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert bwrap_path() is None
    fake = tmp_path / "my-bwrap"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv(BWRAP_ENV, str(fake))
    assert bwrap_path() == str(fake)
    monkeypatch.setenv(BWRAP_ENV, str(tmp_path / "missing"))
    assert bwrap_path() is None


def test_the_host_kills_pid_1_only_while_it_is_bwraps_child():
    """At the time limit the host SIGKILLs the sandbox's pid 1 itself (its host pid from bwrap's status
    descriptor), not only bwrap: through a pidfd, and only while the pid is still bwrap's child (a pid
    reused by another process is never hit). Here a stand-in bwrap with a sleeping child."""
    from reinforge.sandbox.io import kill_init

    stand_in = "import subprocess; p = subprocess.Popen(['sleep', '30']); print(p.pid, flush=True); print(p.wait())"
    parent = subprocess.Popen([sys.executable, "-c", stand_in], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert kill_init(child, os.getpid()) is None  # not this process's child: left alone
        assert Path(f"/proc/{child}/status").read_text().split("State:")[1].split()[0] in ("S", "R")
        fd = kill_init(child, parent.pid)
        assert fd is not None
        os.close(fd)
        assert parent.stdout.readline().strip() == "-9"  # the stand-in saw its child killed by SIGKILL
        assert kill_init(child, parent.pid) is None  # gone
    finally:
        parent.kill()
        parent.wait()


def test_a_uid_range_past_the_last_uid_is_refused():
    """``sandbox.uid + sandbox.num_uids`` must stay below 2**32 - 1 (the kernel's
    invalid uid); the message names both keys."""
    from reinforge.config import load_config
    from reinforge.config.fields import ConfigError

    with pytest.raises(ConfigError, match="sandbox.uid=4294967000 \\+ sandbox.num_uids=1024"):
        load_config(None, ["sandbox.uid=4294967000"])
    assert load_config(None, ["sandbox.uid=4294967000", "sandbox.num_uids=100"])
