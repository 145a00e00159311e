"""Descriptors, streams and bound folders of one sandbox run (:func:`.sandbox.run_python`)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import tempfile
import time
from typing import TYPE_CHECKING

from .launch_server import ServerDied

if TYPE_CHECKING:
    from .launch_server import Launched, LaunchServer

START_MARK = b"\x00reinforge:started\x00"  # the prelude's first write (stderr)


def data_fd(data: bytes) -> int:
    """A readable descriptor of ``data`` (a pipe when it fits its buffer, else a temporary file)."""
    if len(data) <= 32768:
        r, w = os.pipe()
        os.write(w, data)
        os.close(w)
        return r
    f = tempfile.TemporaryFile()
    f.write(data)
    f.flush()
    fd = os.dup(f.fileno())
    f.close()
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def layers_of(binds: dict[str, str | list[str]] | None) -> dict[str, list[str]]:
    """``binds`` as ``{name: [absolute host paths, bottom first]}``, checked."""
    out = {}
    for name, value in (binds or {}).items():
        if not name or "/" in name or name in (".", "..", "main.py"):
            raise ValueError(f"run_python: {name!r} cannot name a folder bound into the working directory")
        paths = [value] if isinstance(value, str) else list(value)
        if not paths or not all(isinstance(p, str) and p for p in paths):
            raise ValueError(f"run_python: binds[{name!r}] must be a host folder or a list of them, not {value!r}")
        out[name] = [os.path.abspath(p) for p in paths]
    return out


def merged_copy(layers: list[str], made: list[str], dest: str | None = None) -> str:
    """A copy of ``layers`` merged (later layers' entries over earlier ones', as an overlay shows
    them), at ``dest`` or in a new temporary folder readable by any uid (appended to ``made``). Where
    no overlay can be mounted: it costs time in proportion to the files.

    The top layer is copied first and an entry that exists is never written again, so a link an
    earlier layer holds is copied as a link and never followed (a write through it could land in
    that layer's target: the shared base)."""
    if dest is None:
        dest = tempfile.mkdtemp(prefix="reinforge-merged-")
        made.append(dest)
        os.chmod(dest, 0o755)
    os.makedirs(dest, exist_ok=True)
    for layer in reversed(layers):
        for root, dirs, files in os.walk(layer):  # links to folders are listed, not entered
            rel = os.path.relpath(root, layer)
            target = dest if rel == "." else os.path.join(dest, rel)
            if os.path.islink(target) or not os.path.isdir(target):  # a layer above put a file or link here
                dirs[:] = []
                continue
            for name in dirs + files:
                src, dst = os.path.join(root, name), os.path.join(target, name)
                if os.path.lexists(dst):
                    continue
                if os.path.islink(src):
                    os.symlink(os.readlink(src), dst)
                elif os.path.isdir(src):
                    os.mkdir(dst)
                else:
                    shutil.copy2(src, dst, follow_symlinks=False)
    return dest


class BwrapStatus:
    """bwrap's JSON status descriptor (``--json-status-fd``), which the program cannot write to:
    ``child-pid`` (the host pid of the sandbox's pid 1, written once it is made) and, at the end,
    ``exit-code``. :meth:`read` takes what has arrived (it never blocks)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.records: list[dict] = []
        self._text = ""
        os.set_blocking(fd, False)

    def read(self) -> list[dict]:
        """Every record so far (those complete)."""
        data = b""
        try:
            while chunk := os.read(self.fd, 65536):
                data += chunk
        except BlockingIOError:
            pass
        self._text += data.decode(errors="replace")
        decoder, pos = json.JSONDecoder(), 0
        while pos < len(self._text):
            while pos < len(self._text) and self._text[pos].isspace():
                pos += 1
            try:
                obj, pos = decoder.raw_decode(self._text, pos)
            except json.JSONDecodeError:
                break
            if isinstance(obj, dict):
                self.records.append(obj)
        self._text = self._text[pos:]
        return self.records

    @property
    def init_pid(self) -> int | None:
        """The host pid of the sandbox's pid 1 (None before bwrap made it)."""
        pid = next((r["child-pid"] for r in self.read() if "child-pid" in r), None)
        return pid if isinstance(pid, int) and pid > 0 else None


def program_started(status_fd: int) -> bool:
    """Whether bwrap reported the program's start (a ``child-pid`` record on its JSON status
    descriptor ``status_fd``)."""
    return BwrapStatus(status_fd).init_pid is not None


def kill_init(init_pid: int, bwrap_pid: int) -> int | None:
    """SIGKILL the sandbox's pid 1 from outside (``init_pid``, a host pid from :class:`BwrapStatus`):
    the kernel then kills every process of its pid namespace, whatever they did to their own
    parent-death signals. Done only while the pid still names ``bwrap_pid``'s child (a pidfd is
    opened first and the parent checked after: a pid reused since cannot be hit); call it before
    killing bwrap. Returns the pidfd (the caller waits on it and closes it), None when the process is
    gone or is not bwrap's child."""
    try:
        fd = os.pidfd_open(init_pid)
    except (OSError, AttributeError):
        return None
    try:
        with open(f"/proc/{init_pid}/status") as f:
            ppid = next((int(line.split()[1]) for line in f if line.startswith("PPid:")), None)
    except (OSError, ValueError):
        ppid = None
    if ppid != bwrap_pid:
        os.close(fd)
        return None
    try:
        signal.pidfd_send_signal(fd, signal.SIGKILL)
    except OSError:
        pass
    return fd


async def wait_exited(pidfd: int, timeout: float) -> bool:
    """Wait (at most ``timeout`` seconds) until the process of ``pidfd`` has exited; for a pid
    namespace's init, every process of the namespace is gone by then. Returns whether it has."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.add_reader(pidfd, lambda: done.done() or done.set_result(True))
    try:
        await asyncio.wait_for(done, timeout)
        return True
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(pidfd)


async def read_capped(
    stream: asyncio.StreamReader | None, limit: int, tail: bool = False, mark: list[float] | None = None
) -> str:
    """All of ``stream`` read (so the writer never blocks); the first ``limit`` bytes kept, or the
    last ones with ``tail`` (the end of a traceback says what went wrong). With ``mark``, the first
    :data:`START_MARK` is taken out and the time it arrived appended to ``mark`` (the prelude writes
    it at once, in one write: it is never split, and nothing of the program comes before it)."""
    if stream is None:
        return ""
    kept = bytearray()
    total = 0
    while chunk := await stream.read(65536):
        if mark is not None and not mark and START_MARK in chunk:
            mark.append(time.perf_counter())
            chunk = chunk.replace(START_MARK, b"", 1)
        total += len(chunk)
        if tail:
            kept = (kept + chunk)[-limit:]
        elif len(kept) < limit:
            kept += chunk[: limit - len(kept)]
    text = kept.decode("utf-8", errors="replace")
    dropped = total - len(kept)
    if not dropped:
        return text
    note = f"[{dropped} bytes of output dropped]"
    return f"{note}\n{text}" if tail else f"{text}\n{note}"


class ServerRun:
    """A run started by the launch server (:mod:`.launch_server`), with what ``run_python`` uses
    of asyncio's ``Process``: ``pid``, ``returncode``, ``stdout``/``stderr`` readers, ``wait()``;
    ``died`` says why the run was cut short when the server died during it."""

    def __init__(self) -> None:
        self.launched: Launched | None = None
        self.pid = 0
        self.returncode: int | None = None
        self.died: str | None = None
        self.stdout: asyncio.StreamReader | None = None
        self.stderr: asyncio.StreamReader | None = None
        self._transports: list[asyncio.BaseTransport] = []

    @classmethod
    async def start(cls, server: LaunchServer, args: list[str], fds: list[int]) -> ServerRun:
        """Start the launcher with ``args``; the run gets ``fds`` at their own numbers, stdin from
        ``/dev/null`` and our pipes as stdout and stderr.

        Raises:
            LaunchError, ServerDied: the run could not be started.
        """
        run, loop = cls(), asyncio.get_running_loop()
        ours: list[int] = []
        try:
            ours.append(os.open(os.devnull, os.O_RDONLY))
            readers = []
            for _ in range(2):
                r, w = os.pipe()
                ours.append(w)
                reader = asyncio.StreamReader(limit=2**16, loop=loop)
                pipe = os.fdopen(r, "rb", buffering=0)
                transport, _ = await loop.connect_read_pipe(lambda rd=reader: asyncio.StreamReaderProtocol(rd), pipe)
                run._transports.append(transport)
                readers.append(reader)
            run.stdout, run.stderr = readers
            run.launched = await server.launch(args, [*ours, *fds], fds)
            run.pid = run.launched.pid
            return run
        except BaseException:
            run.close()
            raise
        finally:
            for fd in ours:  # the run holds its copies
                os.close(fd)

    async def wait(self) -> int | None:
        """The exit status (None when the server died during the run: :attr:`died`)."""
        assert self.launched is not None
        if self.returncode is None and self.died is None:
            try:  # shielded: a caller's timeout must not drop the status
                self.returncode = await asyncio.shield(self.launched.exited)
            except ServerDied as e:
                self.died = str(e)
        return self.returncode

    def kill(self) -> None:
        if self.launched is not None:
            self.launched.kill()

    def close(self) -> None:
        for t in self._transports:
            t.close()
        self._transports = []
        if self.launched is not None:
            self.launched.close()
