"""Running model-written Python in a subprocess with limits.

Each run gets:

* a **fresh scratch directory** as its working directory (also ``HOME`` and ``TMPDIR``), deleted
  afterwards;
* a **time limit** (the process group is killed; a CPU-time rlimit is a second guard);
* a **memory limit**: ``RLIMIT_AS`` (address space), so large allocations raise ``MemoryError``;
  also ``RLIMIT_FSIZE`` (largest file written) and no core dumps;
* **no network**: a prelude replaces ``socket`` so that creating an internet socket or resolving a
  name raises ``PermissionError`` (and records the attempt); where unprivileged network
  namespaces work (``unshare -rn``), the process also runs in an empty network namespace, so
  code that bypasses the prelude (``ctypes``) finds no interface either;
* an **isolated interpreter** (``python -I``: no user site-packages, no ``PYTHON*`` variables),
  a minimal environment and no stdin; output is captured up to ``max_output_bytes``.

This contains mistakes and resource exhaustion of a policy that is learning to write code; it is
not a security boundary against hostile code (run the trainer in a container for that).
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

NETWORK_MARK = ".network_attempt"

# Runs before the user's code (the user's program is main.py in the working directory).
_PRELUDE = r"""
import os, resource, sys
_mem, _fsize, _cpu = (int(a) for a in sys.argv[1:4])
_mark = os.path.abspath(sys.argv[4])
resource.setrlimit(resource.RLIMIT_AS, (_mem, _mem))
resource.setrlimit(resource.RLIMIT_FSIZE, (_fsize, _fsize))
resource.setrlimit(resource.RLIMIT_CPU, (_cpu, _cpu + 1))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

import socket as _socket_mod, _socket

def _deny(*args, **kwargs):
    with open(_mark, "a") as f:
        f.write("1\n")
    raise PermissionError(1, "network access is disabled in this sandbox")

_INET = (_socket.AF_INET, _socket.AF_INET6)

class _NoInternetSocket(_socket_mod.socket):
    def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
        if fileno is None and (family == -1 or family in _INET):
            _deny()
        super().__init__(family, type, proto, fileno)

for _m in (_socket_mod, _socket):
    _m.socket = _NoInternetSocket
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


@dataclass
class SandboxLimits:
    """Limits of one run: wall-clock ``timeout`` (seconds), address space ``memory_mb``, largest
    file ``file_size_mb``, captured ``max_output_bytes`` per stream."""

    timeout: float = 10.0
    memory_mb: int = 1024
    file_size_mb: int = 16
    max_output_bytes: int = 65536


@dataclass
class SandboxResult:
    """What a run did: its output (decoded, capped), exit status (None when killed at the time
    limit), whether it timed out, ran out of memory, or tried to use the network."""

    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool
    seconds: float
    network_attempts: int = 0

    @property
    def out_of_memory(self) -> bool:
        return "MemoryError" in self.stderr


@functools.lru_cache(maxsize=1)
def network_namespace_available() -> bool:
    """Whether ``unshare -rn`` (an unprivileged, empty network namespace) works here."""
    exe = shutil.which("unshare")
    if exe is None or not sys.platform.startswith("linux"):
        return False
    try:
        return subprocess.run([exe, "-rn", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


async def run_python(code: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``code`` as a Python program under ``limits`` (module docstring).

    Cancelling the coroutine (a caller's own timeout) kills the process. Never raises for what
    the program does: failures are in the result (exit status, stderr, ``timed_out``,
    ``network_attempts``).

    Raises:
        OSError: the interpreter could not be started.
    """
    lim = limits or SandboxLimits()
    scratch = tempfile.mkdtemp(prefix="reinforge-sandbox-")
    start = time.perf_counter()
    proc = reads = None
    try:
        with open(os.path.join(scratch, "main.py"), "w") as f:
            f.write(code)
        cmd = [sys.executable, "-I", "-c", _PRELUDE, str(lim.memory_mb * 2**20), str(lim.file_size_mb * 2**20),
               str(max(1, int(lim.timeout) + 1)), NETWORK_MARK]
        if network_namespace_available():
            cmd = ["unshare", "-rn", *cmd]
        env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8",
               "PYTHONIOENCODING": "utf-8", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
               "MKL_NUM_THREADS": "1"}
        proc = await asyncio.create_subprocess_exec(
            *cmd, cwd=scratch, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True)
        reads = asyncio.ensure_future(asyncio.gather(_read_capped(proc.stdout, lim.max_output_bytes),
                                                     _read_capped(proc.stderr, lim.max_output_bytes, tail=True)))
        timed_out = False
        try:
            await asyncio.wait_for(proc.wait(), lim.timeout)
        except TimeoutError:
            timed_out = True
            _kill(proc)
            await proc.wait()
        try:  # a process it left behind may hold the pipes open: do not wait for it
            out, err = await asyncio.wait_for(reads, 2.0)
        except TimeoutError:
            out, err = "", "(output lost: a background process kept the output open)"
        mark = os.path.join(scratch, NETWORK_MARK)
        attempts = len(open(mark).read().split()) if os.path.exists(mark) else 0
        out, err = out.replace(scratch + os.sep, ""), err.replace(scratch + os.sep, "")
        return SandboxResult(out, err, None if timed_out else proc.returncode, timed_out,
                             time.perf_counter() - start, attempts)
    finally:
        if proc is not None and proc.returncode is None:  # cancelled: do not leave it running
            _kill(proc)
        if reads is not None and not reads.done():
            reads.cancel()
        transport = getattr(proc, "_transport", None)  # asyncio leaves it to the GC, which warns once the loop closed
        if transport is not None:
            transport.close()
        shutil.rmtree(scratch, ignore_errors=True)


def _kill(proc: asyncio.subprocess.Process) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


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
