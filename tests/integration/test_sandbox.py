"""The python tool's sandbox against hostile programs: every escape of issue 27 is tried the way the
agent loop calls the tool (model-written code through ``run_python``) and must be blocked; the
calculator must not freeze the caller. Each test says what the attack was and what holds it."""

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import uuid
from pathlib import Path

import pytest

import reinforge
from reinforge.sandbox import Sandboxes, SandboxLimits, SandboxUnavailable, bwrap_path, check_sandbox, run_python
from reinforge.sandbox import runner as sb
from reinforge.tools import ToolCall, ToolSet, load_tools
from reinforge.tools.builtin import calculator, make_python

needs_bwrap = pytest.mark.skipif(
    bwrap_path() is None,
    reason="bubblewrap (bwrap) is not installed: `make setup` installs it when run as root, "
    "or `apt-get install bubblewrap`",
)
PROJECT = Path(reinforge.__file__).resolve().parents[1]
SITE_PACKAGES = Path(sysconfig.get_paths()["purelib"])


def run(code: str, **limits) -> sb.SandboxResult:
    return asyncio.run(run_python(code, SandboxLimits(**{"timeout": 8.0, **limits})))


def report(r: sb.SandboxResult) -> dict:
    """The JSON the program printed last."""
    assert r.stdout.strip(), r
    return json.loads(r.stdout.strip().splitlines()[-1])


# Programs report each attempt as "ok" or the exception's name.
ATTEMPT = """
import json, os
out = {}
def attempt(name, fn):
    try:
        fn()
        out[name] = "ok"
    except BaseException as e:
        out[name] = type(e).__name__
"""


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


# ---------------------------------------------------------------- files
@needs_bwrap
def test_host_files_are_not_readable(tmp_path, monkeypatch):
    """/etc/passwd, the models cache, a fake models folder and the project's sources do not exist
    inside: only the system folders and the interpreter's prefixes are bound."""
    models = tmp_path / "models" / "smollm2"
    models.mkdir(parents=True)
    (models / "model.safetensors").write_bytes(b"weights")
    targets = {
        "passwd": "/etc/passwd",
        "shadow": "/etc/shadow",
        "fake_models": str(models / "model.safetensors"),
        "project": str(PROJECT / "reinforge" / "__init__.py"),
        "cache": str(Path.home() / ".cache"),
        "host_tmp": str(tmp_path),
    }
    code = ATTEMPT + "def read(p):\n    return os.listdir(p) if os.path.isdir(p) else open(p).read()\n"
    code += "".join(f"attempt({k!r}, lambda: read({v!r}))\n" for k, v in targets.items()) + "print(json.dumps(out))"
    res = report(run(code))
    assert res == {k: "FileNotFoundError" for k in targets}, res


@needs_bwrap
def test_writes_outside_scratch_fail(tmp_path):
    """The root is read-only; the project tree, site-packages (a ``.pth`` file would run at the next
    start) and the interpreter's folders are bound read-only or absent; /tmp is the sandbox's own."""
    token = uuid.uuid4().hex
    targets = {
        "root": f"/{token}",
        "usr": f"/usr/{token}",
        "project": str(PROJECT / f"{token}.py"),
        "pth": str(SITE_PACKAGES / f"{token}.pth"),
        "bin": str(Path(sys.executable).parent / token),
        "stdlib": str(Path(os.__file__).parent / f"{token}.py"),
        "host_tmp": str(tmp_path / token),
    }
    code = ATTEMPT + "".join(
        f"attempt({k!r}, lambda: open({v!r}, 'w').write('import os; os.system(\"id\")'))\n" for k, v in targets.items()
    )
    code += f"attempt('tmp', lambda: open('/tmp/{token}', 'w').write('x'))\n"
    code += "attempt('scratch', lambda: open('here.txt', 'w').write('x'))\nprint(json.dumps(out))"
    res = report(run(code))
    assert res.pop("tmp") == "ok" and res.pop("scratch") == "ok"  # the sandbox's own tmpfs
    for key, path in targets.items():  # a checkout under /tmp: its path lies in the sandbox's own /tmp tmpfs
        if path.startswith("/tmp/") and not path.startswith(sys.prefix):
            res.pop(key)
    assert set(res.values()) <= {"OSError", "PermissionError", "FileNotFoundError"}, res
    for path in [*targets.values(), f"/tmp/{token}"]:
        assert not os.path.exists(path), path  # nothing reached the host


@needs_bwrap
def test_shell_commands_run_inside_and_cannot_harm():
    """``os.system`` and ``subprocess`` work, as the unprivileged user of the sandbox without
    capabilities: they cannot write the project either, nor mount or see host processes."""
    token = uuid.uuid4().hex
    target = PROJECT / f"{token}.txt"
    code = (
        f"import os, subprocess\nos.system('touch {target} 2>/dev/null')\n"
        "print(subprocess.run(['id', '-u'], capture_output=True, text=True).stdout.strip())\n"
        "print(os.system('mount -o remount,rw / 2>/dev/null') != 0)\n"
        "print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
        "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])"
    )
    r = run(code)
    uid, mount_failed, pids, caps = r.stdout.split("\n")[:4]
    assert uid == "65534" and mount_failed == "True" and int(caps, 16) == 0, r
    assert len(json.loads(pids)) <= 4, r  # the program, its shell children: no host process
    assert not target.exists()


# ---------------------------------------------------------------- network
@needs_bwrap
def test_ctypes_socket_reaches_no_host_or_internet():
    """libc's ``socket``/``connect`` through ctypes bypasses the Python-level guard; the empty
    network namespace still holds: a listener on the host's loopback is not reached."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.setblocking(False)
    port = server.getsockname()[1]
    code = f"""
import ctypes, socket, struct, json
libc = ctypes.CDLL(None, use_errno=True)
out = {{}}
for name, ip in (("host_loopback", "127.0.0.1"), ("internet", "1.1.1.1")):
    fd = libc.socket(2, 1, 0)  # AF_INET, SOCK_STREAM
    port = {port} if ip.startswith("127") else 80
    addr = struct.pack("=H", 2) + struct.pack("!H", port) + socket.inet_aton(ip) + bytes(8)  # sockaddr_in
    rc = libc.connect(fd, ctypes.c_char_p(addr), 16)
    out[name] = "connected" if rc == 0 else ctypes.get_errno()
print(json.dumps(out))
"""
    try:
        res = report(run(code))
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()
    assert "connected" not in res.values(), res


@needs_bwrap
def test_unix_sockets_of_the_host_are_unreachable(tmp_path):
    """A Unix socket the trainer listens on (a path, and an abstract name) cannot be connected to."""
    path = str(tmp_path / "s")
    abstract = "\0reinforge-test-" + uuid.uuid4().hex
    listeners = []
    for addr in (path, abstract):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(addr)
        s.listen(1)
        s.setblocking(False)
        listeners.append(s)
    code = (
        ATTEMPT
        + f"""
import socket
def connect(addr):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(addr)
attempt("path", lambda: connect({path!r}))
attempt("abstract", lambda: connect({abstract!r}))
print(json.dumps(out))
"""
    )
    try:
        res = report(run(code))
        for s in listeners:
            with pytest.raises(BlockingIOError):
                s.accept()
    finally:
        for s in listeners:
            s.close()
    assert res["path"] == "FileNotFoundError" and res["abstract"] == "ConnectionRefusedError", res


# ---------------------------------------------------------------- limits of the whole group
@needs_bwrap
def test_memory_limit_holds_for_the_group():
    """Three children of 120 MiB each, under a 200 MiB limit (+ 64 MiB of scratch): each is within
    the per-process address-space limit, the group is not; the kernel kills one."""
    code = """
import os, signal, time
children = []
for i in range(3):
    pid = os.fork()
    if pid == 0:
        b = bytearray(120 * 2**20)
        for j in range(0, len(b), 4096):
            b[j] = 1
        time.sleep(4)
        os._exit(0)
    children.append(pid)
killed = 0
for pid in children:
    _, status = os.waitpid(pid, 0)
    killed += os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
print("killed", killed)
"""
    r = run(code, memory_mb=200)
    assert r.oom_kills >= 1 and r.out_of_memory, r
    assert "killed 0" not in r.stdout, r  # a child was killed (or the parent itself: nothing printed)


@needs_bwrap
def test_total_bytes_written_are_limited():
    """Many files below the single-file limit: the scratch tmpfs is full at ``disk_mb``."""
    code = """
written = 0
try:
    for i in range(12):
        with open(f"f{i}", "wb") as f:
            f.write(b"x" * (8 * 2**20))
        written += 8 * 2**20
except OSError as e:
    print("stopped", e.errno)
print(written)
"""
    r = run(code, disk_mb=32, file_size_mb=16)
    assert "stopped 28" in r.stdout, r  # ENOSPC
    assert int(r.stdout.split()[-1]) <= 32 * 2**20


FORK_BOMB = """
import os, time
n = 0
try:
    for i in range(200):
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
        n += 1
except OSError as e:
    print("stopped", type(e).__name__)
print(n)
"""


@needs_bwrap
def test_process_count_is_limited():
    """A fork bomb meets the group's process limit (``pids.max`` of the cgroup)."""
    r = run(FORK_BOMB, max_processes=16)
    assert "stopped" in r.stdout and int(r.stdout.split()[-1]) < 16, r


# ---------------------------------------------------------------- processes
@needs_bwrap
def test_background_child_does_not_hold_the_output_open():
    """A child that inherits stdout and lives on ends with the program (the pid namespace dies):
    the call returns at once, not at the time limit."""
    token = uuid.uuid4().hex
    code = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)', '{token}'])\nprint('done')"
    )
    r = run(code)
    assert not r.timed_out and r.returncode == 0 and r.stdout.strip() == "done" and r.seconds < 3, r
    time.sleep(0.2)
    assert host_processes_with(token) == []


@needs_bwrap
@pytest.mark.parametrize("wait", [False, True])
def test_setsid_children_do_not_outlive_the_sandbox(wait):
    """Children in their own session (``setsid``) die with the sandbox, whether the program exits
    or is killed at the time limit."""
    token = uuid.uuid4().hex
    code = (
        f"import subprocess, sys, time\nfor i in range(5):\n"
        f"    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)', '{token}'],"
        " start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "print('started', flush=True)\n" + ("time.sleep(30)\n" if wait else "")
    )
    r = run(code, timeout=8.0)  # (time for 5 Python starts on a loaded 2-core machine: 3 s once was not)
    assert r.timed_out == wait and "started" in r.stdout, r
    time.sleep(0.3)
    assert host_processes_with(token) == []


@needs_bwrap
def test_killing_the_parent_or_host_processes_fails():
    """``os.kill(os.getppid(), 9)``: the parent is bubblewrap's reaper, pid 1 of the sandbox's pid
    namespace, which ignores signals from inside; the trainer and host processes are not found."""
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        code = ATTEMPT + (
            f"print(os.getppid())\nattempt('victim', lambda: os.kill({victim.pid}, 9))\n"
            f"attempt('trainer', lambda: os.kill({os.getpid()}, 9))\n"
            "attempt('pid1', lambda: os.kill(1, 9))\nimport time; time.sleep(0.2)\n"
            "print(json.dumps(out))\n"
        )
        r = run(code)
        assert r.stdout.split("\n")[0] == "1", r
        assert report(r) == {"victim": "ProcessLookupError", "trainer": "ProcessLookupError", "pid1": "ok"}
        assert r.returncode == 0  # pid 1 ignored the SIGKILL: the program ran on to its end
        assert victim.poll() is None  # still running; and so are we
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()


@needs_bwrap
def test_parent_environment_is_not_readable(monkeypatch):
    """Secrets in the trainer's environment: not inherited, and ``/proc/<pid>/environ`` of the
    trainer does not exist inside (new pid namespace and procfs)."""
    secret = "s3cret-" + uuid.uuid4().hex
    monkeypatch.setenv("REINFORGE_TEST_SECRET", secret)
    code = (
        f"import os\nprint(dict(os.environ))\n"
        f"for p in [{os.getpid()}, {os.getppid()}, *[int(d) for d in os.listdir('/proc') if d.isdigit()]]:\n"
        "    try:\n        print(p, open(f'/proc/{p}/environ', 'rb').read())\n"
        "    except OSError as e:\n        print(p, type(e).__name__)\n"
    )
    r = run(code)
    assert r.returncode == 0 and secret not in r.stdout and secret not in r.stderr, r
    assert f"{os.getpid()} FileNotFoundError" in r.stdout


# ---------------------------------------------------------------- what already held
@needs_bwrap
def test_infinite_loop_and_sleep_stop_at_the_time_limit():
    for code in ("while True: pass", "import time; time.sleep(60)"):
        r = run(code, timeout=1.0)
        assert r.timed_out and r.returncode is None and r.seconds < 3, r


@needs_bwrap
def test_one_large_allocation_fails():
    r = run("x = bytearray(2000 * 2**20)", memory_mb=256)
    assert r.returncode == 1 and "MemoryError" in r.stderr and r.out_of_memory, r


@needs_bwrap
def test_no_cgroup_left_behind():
    before = _sandbox_cgroups()
    run("print(1)")
    assert _sandbox_cgroups() == before


def _sandbox_cgroups() -> set[str]:
    root = Path("/sys/fs/cgroup")
    return {str(p) for p in root.rglob("reinforge-sandbox-*")} if root.exists() else set()


# ---------------------------------------------------------------- refusal and opt-out
def test_refuses_to_start_without_bwrap(monkeypatch):
    monkeypatch.setattr(sb, "bwrap_path", lambda: None)
    sb._bwrap_problem.cache_clear()
    try:
        with pytest.raises(
            SandboxUnavailable, match=r"not installed.*apt-get install bubblewrap.*sandbox.backend=none"
        ):
            make_python(None)
        with pytest.raises(SandboxUnavailable):
            asyncio.run(run_python("print(1)"))
    finally:
        sb._bwrap_problem.cache_clear()
    from reinforge.config import load_config

    cfg = load_config(None, ["sandbox.backend=none"])
    ts = ToolSet(
        load_tools(["python"], cfg.agent, Sandboxes.from_config(cfg.sandbox)), timeout=5
    )  # the opt-out runs without bwrap
    assert asyncio.run(ts.call(ToolCall("python", {"code": "print(6 * 7)"}))).output == "42"
    with pytest.raises(ValueError, match="sandbox.backend"):
        check_sandbox("docker")


# ---------------------------------------------------------------- calculator
@pytest.mark.parametrize(
    "expression,value",
    [
        ("round(1, -10**8)", "0"),
        ("round(10**1000, -10**8)", "0"),
        ("round(123456, -2)", "123500"),
        ("round(1.5, -10**8)", "0"),
        ("round(2.675, 10**8)", "2.675"),
        ("(-1)**10**100", "1"),
        ("2**-10**8", "0"),
    ],
)
def test_calculator_huge_powers_return_at_once(expression, value):
    """``round(1, -10**8)`` computed 10**(10**8) in C with the GIL held (a minute, no timeout could
    stop it): the digits are clamped, results unchanged."""
    t = time.perf_counter()
    assert calculator(expression) == value
    assert time.perf_counter() - t < 0.5


def test_calculator_refuses_huge_results_through_the_tool_set():
    ts = ToolSet(load_tools(["calculator"]), timeout=1.0)
    t = time.perf_counter()
    for e in ("10**10**8", "9**9**9", "round(1, -10**8) + 2**10000"):
        r = asyncio.run(ts.call(ToolCall("calculator", {"expression": e})))
        assert r.error == "exception" and "too large" in r.output, r
    assert time.perf_counter() - t < 1.0
    ts.close()


# ------------------------------------------------ issue 34: never root on the host, no shared kernel state
def in_trainer(script: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``script`` in a separate Python process (a stand-in trainer), so that what it does to its
    own keyrings or to its own life does not touch the test process."""
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout, cwd=str(PROJECT)
    )


def syscall_numbers(*names: str) -> dict[str, int]:
    import pyseccomp

    return {n: int(pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, n)) for n in names}


@needs_bwrap
def test_the_program_is_not_root_on_the_host():
    """The escape of issue 34: bwrap started by root mapped the sandbox's uid to host root, so the
    program could write host-wide sysctls (``kernel.core_pattern`` -> code run as root on the host).
    Now the host sees the program's process as the unprivileged ``sandbox.uid`` (the
    trainer's own uid when it is not root), with no capabilities, and ``/proc/sys`` is not writable
    inside. The write attempt writes the value the host already has, so nothing changes if it held."""
    token = uuid.uuid4().hex
    core_pattern = Path("/proc/sys/kernel/core_pattern").read_text()
    code = ATTEMPT + (
        f"attempt('core_pattern', lambda: open('/proc/sys/kernel/core_pattern', 'w').write({core_pattern!r}))\n"
        "attempt('hostname', lambda: open('/proc/sys/kernel/hostname', 'w').write('x'))\n"
        "out['writable'] = os.access('/proc/sys/kernel/core_pattern', os.W_OK)\n"
        "print(json.dumps(out), flush=True)\n"
        f"import subprocess, sys; subprocess.run([sys.executable, '-c', 'import time; time.sleep(2)', '{token}'])"
    )

    async def run_and_look():
        task = asyncio.ensure_future(run_python(code, SandboxLimits(timeout=8)))
        for _ in range(100):
            await asyncio.sleep(0.05)
            if pids := host_processes_with(token):
                break
        status = Path(f"/proc/{pids[0]}/status").read_text()
        return await task, status

    r, status = asyncio.run(run_and_look())
    fields = {line.split(":")[0]: line.split()[1:] for line in status.splitlines() if ":" in line}
    uid = int(fields["Uid"][0])
    if os.geteuid() == 0:  # a uid of the sandboxes' range (issue 51, E5: one per sandbox running at once)
        assert sb.DEFAULT_SANDBOX_UID <= uid < sb.DEFAULT_SANDBOX_UID + sb.DEFAULT_SANDBOX_UIDS, status
    else:
        assert uid == os.geteuid(), status
    assert fields["Uid"] == [str(uid)] * 4 and fields["Gid"] == [str(uid)] * 4, status
    assert int(fields["CapEff"][0], 16) == 0 and int(fields["CapPrm"][0], 16) == 0, status
    assert fields["Seccomp"] == ["2"] and fields["NoNewPrivs"] == ["1"], status
    res = report(r)
    assert res["core_pattern"] in ("PermissionError", "OSError") and res["hostname"] in ("PermissionError", "OSError")
    assert res["writable"] is False, res


@needs_bwrap
def test_seccomp_denies_keyrings_tracing_and_namespaces():
    """Each system call of the issue's list fails with EPERM (the filter answers before the kernel
    looks at the arguments); a system call of the x32 ABI (another architecture's numbering) does not
    get through either (the process is killed or the call fails)."""
    names = [
        "keyctl",
        "add_key",
        "request_key",
        "ptrace",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "mount",
        "unshare",
        "setns",
    ]
    numbers = syscall_numbers(*names)
    code = f"""
import ctypes, json, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
out = {{}}
for name, nr in {numbers!r}.items():
    ctypes.set_errno(0)
    rc = libc.syscall(nr, 0, 0, 0, 0, 0)
    out[name] = ctypes.get_errno() if rc < 0 else "allowed"
x32 = subprocess.run([sys.executable, "-c", "import ctypes; l = ctypes.CDLL(None, use_errno=True); "
                      "print(l.syscall(0x40000000 + {numbers["keyctl"]}, 0, -3, 0))"], capture_output=True, text=True)
out["x32"] = [x32.returncode, x32.stdout.strip()]
print(json.dumps(out))
"""
    res = report(run(code))
    x32 = res.pop("x32")
    assert res == {n: 1 for n in names}, res  # EPERM
    assert x32[0] != 0 or int(x32[1]) < 0, x32


@needs_bwrap
def test_the_trainers_keyrings_are_not_reachable():
    """A stand-in trainer stores a secret in its session keyring; the program cannot read it, list
    its name in /proc/keys, or add a key that the trainer then sees (a fresh session keyring, and
    the keyring system calls denied)."""
    nr = syscall_numbers("add_key", "keyctl")
    secret, name = "s3cret-" + uuid.uuid4().hex, "reinforge-test-" + uuid.uuid4().hex[:8]
    program = (
        "import ctypes, json, os\nlibc = ctypes.CDLL(None, use_errno=True)\nout = {}\n"
        "out['keys'] = open('/proc/keys').read()\n"
        f"out['add'] = libc.syscall({nr['add_key']}, b'user', b'planted', b'x', 1, -3)\n"
        f"buf = ctypes.create_string_buffer(256)\nout['read'] = libc.syscall({nr['keyctl']}, 11, -3, buf, 256)\n"
        "out['buf'] = buf.raw.rstrip(b'\\0').decode(errors='replace')\nprint(json.dumps(out))"
    )
    script = f"""
import asyncio, ctypes, json
from reinforge.sandbox import SandboxLimits, run_python
libc = ctypes.CDLL(None, use_errno=True)
key = libc.syscall({nr["add_key"]}, b"user", {name.encode()!r}, {secret.encode()!r}, {len(secret)}, -3)
assert key > 0, ctypes.get_errno()
r = asyncio.run(run_python({program!r}, SandboxLimits(timeout=8)))
keys = open("/proc/keys").read()
print(json.dumps({{"stdout": r.stdout, "planted": "planted" in keys, "mine": {name!r} in keys}}))
"""
    p = in_trainer(script)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["mine"] and not res["planted"], res  # the trainer's own key is there; nothing was added
    inside = json.loads(res["stdout"].strip().splitlines()[-1])
    assert inside["add"] == -1 and inside["read"] == -1, inside
    assert name not in inside["keys"] and secret not in inside["buf"] + inside["keys"], inside


@needs_bwrap
def test_nothing_outlives_a_killed_trainer(tmp_path):
    """The program clears its parent-death signal and sleeps; the trainer is SIGKILLed. The sandbox
    dies with it (bwrap's pid 1 has the signal and the program cannot touch pid 1), and the cgroup
    folder the trainer left is removed when the next trainer makes its first cgroup."""
    from reinforge.sandbox import cgroup as cg

    token = uuid.uuid4().hex
    program = (
        "import ctypes, time\nctypes.CDLL(None).prctl(1, 0, 0, 0, 0)\nprint('started', flush=True)\n"
        f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'import time; time.sleep(60)', "
        f"'{token[:16]}' + '{token[16:]}'])"  # joined at run time: the trainer's command line must not match
    )
    script = f"""
import asyncio
from reinforge.sandbox import SandboxLimits, run_python
asyncio.run(run_python({program!r}, SandboxLimits(timeout=60)))
"""
    trainer = subprocess.Popen([sys.executable, "-c", script], cwd=str(PROJECT))
    try:
        deadline = time.monotonic() + 30
        while not host_processes_with(token) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host_processes_with(token), "the program did not start"
    finally:
        trainer.kill()
        trainer.wait()
    deadline = time.monotonic() + 5
    while host_processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert host_processes_with(token) == []
    left = [p for p in _sandbox_cgroups() if f"{cg.PREFIX}{trainer.pid}-" in p]
    cg.remove_stale()
    assert all(not Path(p).exists() for p in left), left


def without_cgroup(monkeypatch):
    monkeypatch.setattr(sb, "_group_limits", lambda lim, sandboxes: None)


@needs_bwrap
def test_limits_hold_without_a_cgroup(monkeypatch):
    """Where no cgroup can be made: RLIMIT_NPROC holds (the uid is not root: 200 forks stop below 16),
    /dev/shm is a tmpfs of its share of ``disk_mb`` (300 MiB cannot be written there with 32 MiB),
    and /dev itself is read-only."""
    without_cgroup(monkeypatch)
    forks = run(FORK_BOMB, max_processes=16)
    assert "stopped" in forks.stdout and int(forks.stdout.split()[-1]) < 16, forks
    shm = run(
        ATTEMPT
        + """
def fill(path):
    with open(path, "wb") as f:
        for i in range(300):
            f.write(b"x" * 2**20)
attempt("shm", lambda: fill("/dev/shm/big"))
attempt("dev", lambda: open("/dev/new", "w"))
out["shm_bytes"] = os.path.getsize("/dev/shm/big")
print(json.dumps(out))
""",
        disk_mb=32,
    )
    res = report(shm)
    from reinforge.sandbox.isolation import tmpfs_sizes

    assert res["shm"] == "OSError" and res["shm_bytes"] <= tmpfs_sizes(32, False)["/dev/shm"] == 4 * 2**20, res
    assert res["dev"] in ("OSError", "PermissionError"), res


@needs_bwrap
def test_sandboxes_at_once_are_bounded():
    """Twelve calls of one turn (``asyncio.gather``) with ``sandbox.max_concurrent=2``: at most
    two programs run at any moment (their start / end times, on the host's monotonic clock), and
    waiting for a slot does not count against ``agent.tool_timeout``."""
    from reinforge.config import load_config

    cfg = load_config(None, ["sandbox.max_concurrent=2", "agent.tool_timeout=3"])
    run = Sandboxes.from_config(cfg.sandbox, cfg.agent.tool_timeout)
    ts = ToolSet(load_tools(["python"], cfg.agent, run), timeout=cfg.agent.tool_timeout)
    code = "import time\na = time.monotonic()\ntime.sleep(0.4)\nprint(a, time.monotonic())"

    async def many():
        return await asyncio.gather(*(ts.call(ToolCall("python", {"code": code})) for _ in range(12)))

    results = asyncio.run(many())
    ts.close()
    assert all(r.error is None for r in results), [r.output for r in results if r.error]
    spans = [tuple(map(float, r.output.split())) for r in results]
    most = max(sum(a <= t < b for a, b in spans) for t, _ in spans)
    assert most <= 2, spans
    assert sb.default_max_sandboxes(SandboxLimits()) >= 1


@needs_bwrap
def test_outcome_labels_cannot_be_forged_into_success_or_failure():
    """There is no descriptor the program can write a "network attempt" to: a program that writes to
    every descriptor and prints the network message but exits 0 succeeds; a child killed at the
    group's memory limit is a memory error even when the program exits 0."""
    from reinforge.tools.builtin import sandbox_output
    from reinforge.tools.types import ToolError

    forged = run(
        "import os, sys\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'1')\n"
        "    except OSError:\n        pass\n"
        f"print({sb.NETWORK_DENIED!r}, file=sys.stderr)\nprint('fine')"
    )
    assert forged.returncode == 0 and not forged.network_denied and sandbox_output(forged) == "fine", forged
    oom = run(
        """
import os
pid = os.fork()
if pid == 0:
    b = bytearray(150 * 2**20)
    for j in range(0, len(b), 4096):
        b[j] = 1
    os._exit(0)
os.waitpid(pid, 0)
print("parent exits 0")
""",
        memory_mb=100,
    )
    if oom.oom_kills == 0:  # no cgroup here: the child's own address-space limit stopped it
        assert "MemoryError" in oom.stderr, oom
        return
    assert oom.returncode == 0, oom
    with pytest.raises(ToolError) as e:
        sandbox_output(oom)
    assert e.value.kind == "memory" and "killed at the memory limit" in str(e.value)


@needs_bwrap
def test_host_details_are_hidden():
    """The kernel command line is empty inside; the environment is the sandbox's few variables."""
    r = run("import os\nprint(repr(open('/proc/cmdline').read()))\nprint(sorted(os.environ))")
    lines = r.stdout.splitlines()
    assert lines[0] == "''", r
    from reinforge.sandbox.isolation import sandbox_env

    assert set(eval(lines[1])) <= set(sandbox_env(sb.SCRATCH)) | {"PWD"}, r  # bwrap sets PWD


@needs_bwrap
def test_a_sandbox_that_cannot_start_is_an_infrastructure_failure(monkeypatch):
    """A launcher step that fails (here: joining a cgroup that does not exist) is reported as the
    sandbox's failure, kind ``sandbox``, never as the program's error."""
    from reinforge.sandbox.cgroup import Cgroup
    from reinforge.tools.builtin import sandbox_output
    from reinforge.tools.types import SANDBOX_FAILURE, ToolError

    monkeypatch.setattr(sb, "_group_limits", lambda lim, sandboxes: Cgroup([Path("/nonexistent-cgroup")], 2))
    r = run("print(1)")
    assert r.infra_error and "joining the cgroup" in r.infra_error, r
    with pytest.raises(ToolError) as e:
        sandbox_output(r)
    assert e.value.kind == SANDBOX_FAILURE


def test_the_sandbox_uid_default_is_the_configs():
    from reinforge.config import SandboxConfig

    assert sb.DEFAULT_SANDBOX_UID == SandboxConfig().uid
    assert sb.SandboxLimits().sandbox_uid == sb.DEFAULT_SANDBOX_UID
    assert sb.SandboxLimits().sandbox_uids == sb.DEFAULT_SANDBOX_UIDS == SandboxConfig().num_uids
    assert sb.SandboxLimits().max_open_files == sb.DEFAULT_MAX_OPEN_FILES == SandboxConfig().max_open_files
