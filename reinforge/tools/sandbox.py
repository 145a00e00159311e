"""Running model-written Python in an operating-system sandbox (bubblewrap).

A program of the ``python`` tool runs under ``bwrap`` (the Debian / Ubuntu / Fedora package
``bubblewrap``) with every namespace unshared (user, mount, pid, network, IPC, UTS, cgroup):

* **files**: an empty root, read-only; the system folders (``/usr`` and the ``/bin``, ``/lib*``
  links), the dynamic loader's cache and the interpreter's own prefixes (``sys.prefix``,
  ``sys.base_prefix``: the standard library and site-packages) bound **read-only**; a fresh
  ``tmpfs`` of ``disk_mb`` MiB as working directory, ``HOME``, ``TMPDIR`` and ``/tmp``, holding
  ``main.py`` (gone with the sandbox). Nothing else of the host exists inside: not ``/etc``, not the
  project, the models (``~/.cache/reinforge``), the run directory or other users' files;
* **processes**: a new pid namespace whose first process is the program (``--as-pid-1``): it sees
  only its own descendants, cannot signal the trainer, and when it exits, or bwrap or the trainer
  dies (``--die-with-parent``), the kernel kills every process left inside, ``setsid`` ones
  included, so a background child cannot hold the output pipes open; a new session, no
  capabilities, no nested user namespaces, an environment of a few fixed variables;
* **network**: an empty network namespace (a loopback interface only), so no socket reaches
  another machine or a Unix socket of the host; a prelude also replaces Python's ``socket`` so
  that the usual calls fail with a clear ``PermissionError`` (and the attempt is reported);
* **limits of the whole group** (a cgroup, :mod:`reinforge.tools.cgroup`): memory
  ``memory_mb + disk_mb`` (the tmpfs is charged to it), ``max_processes`` processes, one CPU; per
  process: ``RLIMIT_AS`` = ``memory_mb`` (a large allocation raises ``MemoryError``),
  ``RLIMIT_FSIZE`` = ``file_size_mb``, ``RLIMIT_CPU``, ``RLIMIT_NPROC``, no core dumps; the
  wall-clock ``timeout`` kills the sandbox (the group, then the cgroup).

Without bubblewrap (or where it cannot make namespaces, e.g. a container that forbids user
namespaces) the ``python`` tool refuses to start (:func:`check_sandbox`), unless the config opts
out with ``agent.python_sandbox=none``: a plain subprocess with the per-process limits only,
which does **not** contain hostile code.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .cgroup import Cgroup, create_cgroup

log = logging.getLogger(__name__)

ISOLATIONS = ("bwrap", "none")
OPT_OUT = "agent.python_sandbox=none"
SCRATCH = "/scratch"  # the working directory inside the sandbox

# Runs before the user's code (the user's program is main.py in the working directory).
_PRELUDE = r"""
import os, resource, sys
_mem, _fsize, _cpu, _nproc, _mark = (int(a) for a in sys.argv[1:6])
resource.setrlimit(resource.RLIMIT_AS, (_mem, _mem))
resource.setrlimit(resource.RLIMIT_FSIZE, (_fsize, _fsize))
resource.setrlimit(resource.RLIMIT_CPU, (_cpu, _cpu + 1))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
if _nproc > 0:
    resource.setrlimit(resource.RLIMIT_NPROC, (_nproc, _nproc))
try:
    os.set_blocking(_mark, False)
    os.set_inheritable(_mark, False)
except OSError:
    _mark = -1

import socket as _socket_mod, _socket

def _deny(*args, **kwargs):
    try:
        os.write(_mark, b"1")
    except OSError:
        pass
    raise PermissionError(1, "network access is disabled in this sandbox")

_INET = (_socket.AF_INET, _socket.AF_INET6)

class _NoInternetSocket(_socket_mod.socket):
    def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
        if fileno is None and (family == -1 or family in _INET):
            _deny()
        super().__init__(family, type, proto, fileno)

_socket_mod.socket = _NoInternetSocket  # not _socket.socket: socket.socket.__init__ calls it (AF_UNIX would recurse)
for _name in ("create_connection", "create_server", "getaddrinfo", "gethostbyname", "gethostbyname_ex",
              "gethostbyaddr", "getnameinfo", "fromfd"):
    for _m in (_socket_mod, _socket):
        if hasattr(_m, _name):
            setattr(_m, _name, _deny)
del _m, _name

import runpy, traceback
sys.argv = ["main.py"]
_path = os.path.abspath("main.py")
try:
    runpy.run_path(_path, run_name="__main__")
except SystemExit:
    raise
except BaseException as _e:  # show the user's frames only
    _tb = _e.__traceback__
    while _tb is not None and _tb.tb_frame.f_code.co_filename != _path:
        _tb = _tb.tb_next
    traceback.print_exception(type(_e), _e, _tb)
    sys.stderr.flush()
    os._exit(1)
"""


class SandboxUnavailable(RuntimeError):
    """The operating-system sandbox cannot run here; the message says why and what to do."""


@dataclass
class SandboxLimits:
    """Limits of one run: wall-clock ``timeout`` (seconds); ``memory_mb`` (MiB: the address space
    of each process, and with ``disk_mb`` the memory of the whole group); ``file_size_mb`` (MiB,
    the largest file written); ``disk_mb`` (MiB, all files written together: the size of the
    scratch tmpfs); ``max_processes`` (processes and threads at once); ``max_output_bytes``
    captured per stream."""

    timeout: float = 10.0
    memory_mb: int = 1024
    file_size_mb: int = 16
    disk_mb: int = 64
    max_processes: int = 64
    max_output_bytes: int = 65536


@dataclass
class SandboxResult:
    """What a run did: its output (decoded, capped), exit status (None when killed at the time
    limit; 128 + the signal number when the program was killed by a signal under bwrap), whether
    it timed out, its wall-clock ``seconds``, network attempts the prelude caught, and processes
    the kernel killed at the group's memory limit (``oom_kills``)."""

    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool
    seconds: float
    network_attempts: int = 0
    oom_kills: int = 0

    @property
    def out_of_memory(self) -> bool:
        return self.oom_kills > 0 or "MemoryError" in self.stderr


def bwrap_path() -> str | None:
    """The ``bwrap`` executable, or None."""
    return shutil.which("bwrap") or next((p for p in ("/usr/bin/bwrap", "/bin/bwrap") if os.path.exists(p)), None)


def check_sandbox(isolation: str = "bwrap") -> None:
    """Check that runs with ``isolation`` can start (``bwrap``: installed, and a trial sandbox
    runs; checked once per process).

    Raises:
        SandboxUnavailable: what is missing, how to install it, and the opt-out key.
        ValueError: ``isolation`` is not one of ``bwrap``, ``none``.
    """
    if isolation not in ISOLATIONS:
        raise ValueError(f"agent.python_sandbox: {isolation!r} is not one of {', '.join(ISOLATIONS)}")
    if isolation == "bwrap":
        problem = _bwrap_problem()
        if problem:
            raise SandboxUnavailable(
                f"the python tool runs model-written code in a bubblewrap sandbox, which {problem}. Install it "
                f"(`apt-get install bubblewrap`, `dnf install bubblewrap`; `make setup` does it as root), or set "
                f"{OPT_OUT} to run that code without isolation (unsafe: it can read and change your files).")


@functools.lru_cache(maxsize=1)
def _bwrap_problem() -> str | None:
    exe = bwrap_path()
    if exe is None or not sys.platform.startswith("linux"):
        return "is not installed (no `bwrap` on PATH)"
    try:
        r = subprocess.run([exe, *_bwrap_args(SandboxLimits()), "--", sys.executable, "-I", "-c", "pass"],
                           capture_output=True, timeout=30, env=_host_env())
    except (OSError, subprocess.SubprocessError) as e:
        return f"could not be started ({e})"
    if r.returncode != 0:
        err = r.stderr.decode(errors="replace").strip()
        return f"fails here ({err or f'exit status {r.returncode}'}; user namespaces may be disabled)"
    return None


@functools.lru_cache(maxsize=1)
def _read_only_paths() -> tuple[list[tuple[str, str]], list[str]]:
    """(symlinks as (target, path), folders to bind read-only): the system folders, the loader's
    files and the interpreter's prefixes, without any folder inside another.

    Raises:
        SandboxUnavailable: a prefix would expose the models cache (``~/.cache/reinforge``).
    """
    links, binds = [], []
    for p in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(p):
            links.append((os.readlink(p), p))
        elif os.path.isdir(p):
            binds.append(p)
    binds += [p for p in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives",
                          "/etc/localtime") if os.path.exists(p)]
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                str(Path(os.path.realpath(sys.executable)).parent.parent)}
    from ..models.hub import cache_dir

    models = os.path.realpath(cache_dir())
    for p in sorted(os.path.realpath(p) for p in prefixes):
        if any(p == b or p.startswith(b.rstrip("/") + "/") for b in binds):
            continue
        if p == "/" or models == p or models.startswith(p + "/"):
            raise SandboxUnavailable(f"the python interpreter's prefix {p} holds the models cache {models}; the "
                                     f"sandbox would expose it: use a virtualenv elsewhere or set REINFORGE_CACHE")
        binds.append(p)
    return links, binds


def _bwrap_args(lim: SandboxLimits) -> list[str]:
    links, binds = _read_only_paths()
    args = ["--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
            "--as-pid-1", "--uid", "65534", "--gid", "65534", "--cap-drop", "ALL"]
    # an interpreter under /tmp (a virtualenv in a checkout there): /tmp becomes a tmpfs of its own, of the
    # scratch folder's size, before the interpreter is bound inside it (the symlink to the scratch folder
    # cannot be made there); the cgroup's memory limit counts both tmpfs
    tmp_binds = any(p == "/tmp" or p.startswith("/tmp/") for p in binds)
    if tmp_binds:
        args += ["--perms", "1777", "--size", str(lim.disk_mb * 2**20), "--tmpfs", "/tmp"]
    for p in binds:
        args += ["--ro-bind", p, p]
    for target, p in links:
        args += ["--symlink", target, p]
    args += ["--proc", "/proc", "--dev", "/dev",
             "--perms", "0700", "--size", str(lim.disk_mb * 2**20), "--tmpfs", SCRATCH]
    if not tmp_binds:
        args += ["--symlink", SCRATCH, "/tmp"]
    args += ["--chdir", SCRATCH, "--remount-ro", "/", "--clearenv"]
    for k, v in _sandbox_env(SCRATCH).items():
        args += ["--setenv", k, v]
    return args


def _sandbox_env(home: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8",
            "PYTHONIOENCODING": "utf-8", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _host_env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8"}


_warned_no_cgroup = False


def _group_limits(lim: SandboxLimits) -> Cgroup | None:
    global _warned_no_cgroup
    try:
        return create_cgroup((lim.memory_mb + lim.disk_mb) * 2**20, lim.max_processes, 1.0)
    except OSError as e:
        if not _warned_no_cgroup:
            _warned_no_cgroup = True
            log.warning("python tool: no cgroup could be made (%s); memory and CPU are limited per process only, "
                        "not for the sandbox as a whole", e)
        return None


async def run_python(code: str, limits: SandboxLimits | None = None, isolation: str = "bwrap") -> SandboxResult:
    """Run ``code`` as a Python program under ``limits`` (module docstring).

    Cancelling the coroutine (a caller's own timeout) kills the sandbox. Never raises for what
    the program does: failures are in the result (exit status, stderr, ``timed_out``,
    ``network_attempts``, ``oom_kills``).

    Args:
        isolation: ``bwrap`` (the sandbox) or ``none`` (a plain subprocess: per-process limits
            only, unsafe; ``agent.python_sandbox=none``).

    Raises:
        SandboxUnavailable: ``isolation="bwrap"`` and bubblewrap cannot run here.
        OSError: the interpreter could not be started.
    """
    lim = limits or SandboxLimits()
    check_sandbox(isolation)
    start = time.perf_counter()
    proc = reads = cgroup = None
    mark_r, mark_w = os.pipe()
    source = tempfile.TemporaryFile()
    host_scratch = None
    try:
        prelude_args = [str(lim.memory_mb * 2**20), str(lim.file_size_mb * 2**20), str(max(1, int(lim.timeout) + 1))]
        python = [sys.executable, "-I", "-c", _PRELUDE, *prelude_args]
        if isolation == "bwrap":
            source.write(code.encode())
            source.flush()
            source.seek(0)
            cmd = [bwrap_path(), *_bwrap_args(lim), "--file", str(source.fileno()), f"{SCRATCH}/main.py", "--",
                   *python, str(lim.max_processes), str(mark_w)]
            cgroup = _group_limits(lim)
            if cgroup is not None:  # join the cgroup before bwrap starts anything
                files = cgroup.procs_files
                cmd = ["/bin/sh", "-c", 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; '
                       'n=$((n-1)); done; exec "$@"', "sh", str(len(files)), *files, *cmd]
            cwd, env, scratch, fds = None, _host_env(), SCRATCH, (mark_w, source.fileno())
        else:
            host_scratch = scratch = tempfile.mkdtemp(prefix="reinforge-sandbox-")
            with open(os.path.join(scratch, "main.py"), "w") as f:
                f.write(code)
            cmd, cwd, env, fds = [*python, "0", str(mark_w)], scratch, _sandbox_env(scratch), (mark_w,)
            env["PATH"] = os.environ.get("PATH", os.defpath)
        proc = await asyncio.create_subprocess_exec(
            *cmd, cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True, pass_fds=fds)
        os.close(mark_w)
        mark_w = -1
        reads = asyncio.ensure_future(asyncio.gather(_read_capped(proc.stdout, lim.max_output_bytes),
                                                     _read_capped(proc.stderr, lim.max_output_bytes, tail=True)))
        timed_out = False
        try:
            await asyncio.wait_for(proc.wait(), lim.timeout)
        except TimeoutError:
            timed_out = True
            _kill(proc, cgroup)
            await proc.wait()
        if cgroup is not None:
            cgroup.kill()  # what the program left (the pid namespace is gone already under bwrap)
        try:  # a process left behind (only without bwrap) may hold the pipes open: do not wait for it
            out, err = await asyncio.wait_for(reads, 2.0)
        except TimeoutError:
            out, err = "", "(output lost: a background process kept the output open)"
        attempts = _count_marks(mark_r)
        out, err = out.replace(scratch + os.sep, ""), err.replace(scratch + os.sep, "")
        return SandboxResult(out, err, None if timed_out else proc.returncode, timed_out,
                             time.perf_counter() - start, attempts, cgroup.oom_kills() if cgroup else 0)
    finally:
        if proc is not None and proc.returncode is None:  # cancelled: do not leave it running
            _kill(proc, cgroup)
        if reads is not None and not reads.done():
            reads.cancel()
        transport = getattr(proc, "_transport", None)  # asyncio leaves it to the GC, which warns once the loop closed
        if transport is not None:
            transport.close()
        if cgroup is not None and not cgroup.remove():
            log.warning("python tool: cgroup %s could not be removed", cgroup.dirs)
        for fd in (mark_r, mark_w):
            if fd >= 0:
                os.close(fd)
        source.close()
        if host_scratch is not None:
            shutil.rmtree(host_scratch, ignore_errors=True)


def _count_marks(fd: int) -> int:
    os.set_blocking(fd, False)
    n = 0
    try:
        while chunk := os.read(fd, 65536):
            n += len(chunk)
    except BlockingIOError:
        pass
    return n


def _kill(proc: asyncio.subprocess.Process, cgroup: Cgroup | None) -> None:
    """SIGKILL the process group of ``proc`` (under bwrap: bwrap, whose death kills the pid
    namespace through ``--die-with-parent``) and every process of the cgroup."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if cgroup is not None:
        cgroup.kill()


async def _read_capped(stream: asyncio.StreamReader | None, limit: int, tail: bool = False) -> str:
    """All of ``stream`` read (so the writer never blocks); the first ``limit`` bytes kept, or the
    last ones with ``tail`` (the end of a traceback says what went wrong)."""
    if stream is None:
        return ""
    kept = bytearray()
    total = 0
    while chunk := await stream.read(65536):
        total += len(chunk)
        if tail:
            kept = (kept + chunk)[-limit:]
        elif len(kept) < limit:
            kept += chunk[:limit - len(kept)]
    text = kept.decode("utf-8", errors="replace")
    dropped = total - len(kept)
    if not dropped:
        return text
    note = f"[{dropped} bytes of output dropped]"
    return f"{note}\n{text}" if tail else f"{text}\n{note}"
