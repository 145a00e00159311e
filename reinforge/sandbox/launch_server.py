"""The sandbox's launch server: one small process per trainer that forks the launcher of each run.

Starting a sandbox used to begin with a fresh interpreter for the launcher (``python -I -S -c
LAUNCHER``, :mod:`.isolation`): 10-25 ms of every start on the 2-core machine, before ``bwrap``.
The server is that interpreter started once (``python -I -S -c SERVER``, ``ctypes`` loaded and the
launcher compiled); for each run it ``fork``\\ s a child that runs the very same launcher code (the
cgroup, the staging mounts, the uid drop, the overlay, the keyring, the parent-death signal, the
parent check) and ``exec``\\ s ``bwrap``. Nothing of the security steps changes: they run in a new
process per run, in the same order, on the same arguments.

The chain of parent-death signals: the server dies with the trainer thread that started it (a
reader thread that lives as long as the server: :class:`LaunchServer`), each run's process with
the server, ``bwrap``'s pid 1 with ``bwrap``. The child keeps no descriptor of the server: its
standard streams and the run's descriptors are put at the numbers the arguments name, everything
else is closed before the launcher runs (the program cannot reach the server).

Protocol (a ``SOCK_SEQPACKET`` socket pair; fields NUL-separated): the trainer sends ``id, n,
n target numbers, the launcher's arguments...`` with the run's descriptors (stdin, stdout, stderr,
then the ``n``) attached; the server answers ``S id pid`` with a pidfd of the child attached (the
trainer kills through it: no pid can be reused under it), ``E id message`` when it could not fork,
and ``X id status`` when the child exited (``-signal`` when killed, as ``subprocess`` reports it).

When the server dies (killed, out of memory), runs it had not started are sent again to a new one
(a transparent restart); runs it had started died with it (parent-death signal) and end as
infrastructure failures (:class:`ServerDied`), never as the program's error.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from .isolation import LAUNCHER, host_env

log = logging.getLogger(__name__)

SERVER = r"""
import ctypes, fcntl, os, selectors, signal, socket, sys
sock = socket.socket(fileno=int(sys.argv[1]))
trainer, me = int(sys.argv[2]), os.getpid()
launcher = compile(sys.argv[3], "<reinforge sandbox launcher>", "exec")
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(1, 9, 0, 0, 0) != 0 or os.getppid() != trainer:  # PR_SET_PDEATHSIG: SIGKILL with the trainer
    os._exit(1)
os.chdir("/")
sel = selectors.DefaultSelector()
sel.register(sock, selectors.EVENT_READ)
running = {}  # pidfd -> (request id, pid)


def send(fields, fds=()):
    data = "\0".join(str(f) for f in fields).encode()
    try:
        socket.send_fds(sock, [data], list(fds))
    except OSError:
        os._exit(0)  # the trainer is gone


def child(argv, fds, targets):
    # the run's process: its descriptors in place, nothing else open, then the launcher (it execs bwrap)
    try:
        os.setsid()
        for s in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD):
            signal.signal(s, signal.SIG_DFL)
        top = max([*targets, *fds]) + 1
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, top) for fd in fds]
        for fd, target in zip(high, targets):
            os.dup2(fd, target)
        lo = 0
        for fd in sorted(set(targets)):
            if fd > lo:  # closerange(a, a) would close everything from a on (close_range(a, a - 1))
                os.closerange(lo, fd)
            lo = fd + 1
        os.closerange(lo, 1 << 20)
        argv[1] = str(me)  # the parent the launcher checks
        sys.argv = ["launcher", *argv]
        exec(launcher, {"__name__": "__launcher__"})
    except BaseException as e:
        os.write(2, ("reinforge sandbox launcher: %s: %s\n" % (type(e).__name__, e)).encode())
    os._exit(125)


def serve(msg, fds):
    fields = msg.decode().split("\0")
    rid, n = fields[0], int(fields[1])
    targets = [0, 1, 2, *(int(x) for x in fields[2:2 + n])]
    argv = fields[2 + n:]
    try:
        if len(fds) != len(targets):
            raise OSError("%d descriptors for %d places" % (len(fds), len(targets)))
        pid = os.fork()
    except OSError as e:
        for fd in fds:
            os.close(fd)
        send(["E", rid, "fork: %s" % e])
        return
    if pid == 0:
        child(argv, fds, targets)
    for fd in fds:
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    running[pidfd] = (rid, pid)
    sel.register(pidfd, selectors.EVENT_READ)
    send(["S", rid, pid], [pidfd])


while True:
    for key, _ in sel.select():
        if key.fileobj is sock:
            msg, fds, flags, _ = socket.recv_fds(sock, 1 << 16, 64)
            if not msg:
                os._exit(0)  # the trainer closed its end
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):  # a request cut short: refuse it whole
                for fd in fds:
                    os.close(fd)
                rid = msg.split(b"\0", 1)[0].decode(errors="replace")
                send(["E", rid, "the launch request was too large"], [])
                continue
            serve(msg, fds)
        else:
            rid, pid = running.pop(key.fd)
            sel.unregister(key.fd)
            os.close(key.fd)
            _, status = os.waitpid(pid, 0)
            send(["X", rid, os.waitstatus_to_exitcode(status)])
"""


class ServerDied(RuntimeError):
    """The launch server died: before the run started (it is sent again) or during it (the run is
    an infrastructure failure)."""


class LaunchError(RuntimeError):
    """The server could not make the run's process (fork failed: no memory or processes left)."""


@dataclass
class _Request:
    loop: asyncio.AbstractEventLoop
    started: asyncio.Future
    exited: asyncio.Future
    pidfd: int | None = None


@dataclass
class _Server:
    """One running server: its process, our end of the socket, the requests in flight."""

    proc: subprocess.Popen
    sock: socket.socket
    owner: int  # the trainer's pid (a forked child of the trainer starts its own server)
    pending: dict[str, _Request] = field(default_factory=dict)
    dead: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


def _deliver(req: _Request, fut: asyncio.Future, value: Any = None, error: BaseException | None = None) -> None:
    """Resolve ``fut`` in its event loop, from the reader thread. A run started for a caller that no
    longer waits (cancelled, or its loop closed) is killed."""

    def orphan() -> None:
        if fut is req.started and req.pidfd is not None:
            _kill_pidfd(req.pidfd)
            os.close(req.pidfd)
            req.pidfd = None

    def resolve() -> None:
        if fut.done():
            orphan()
        elif error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(value)

    try:
        req.loop.call_soon_threadsafe(resolve)
    except RuntimeError:  # the loop closed
        orphan()


def _kill_pidfd(pidfd: int) -> None:
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        pass


class LaunchServer:
    """The trainer's side: starts the server when first needed (and again after it died), sends
    runs to it, reads its answers in a thread of its own. One per process (:func:`server`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._ids = itertools.count()
        self.restarts = 0  # servers started after the first (the previous one died)

    @property
    def pid(self) -> int | None:
        """The running server's pid, None before the first run or after it died."""
        s = self._server
        return s.proc.pid if s is not None and not s.dead and s.owner == os.getpid() else None

    def _running(self) -> _Server:
        with self._lock:
            s = self._server
            if s is None or s.dead or s.owner != os.getpid():
                if s is not None and s.owner == os.getpid():
                    self.restarts += 1
                s = self._server = self._start()
            return s

    def _start(self) -> _Server:
        """Start a server from a new reader thread, which then lives exactly as long as it: the
        server's parent-death signal follows the thread that forked it."""
        ready: list[Any] = []
        spawned = threading.Event()
        thread = threading.Thread(target=self._serve, args=(ready, spawned), name="sandbox-launch-server", daemon=True)
        thread.start()
        spawned.wait()
        if isinstance(ready[0], BaseException):
            raise ready[0]
        return ready[0]

    def _serve(self, ready: list[Any], spawned: threading.Event) -> None:
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            with theirs:
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", "-c", SERVER, str(theirs.fileno()), str(os.getpid()), LAUNCHER],
                    pass_fds=(theirs.fileno(),),
                    env=host_env(),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    start_new_session=True,
                )
            s = _Server(proc, ours, os.getpid())
            ready.append(s)
        except BaseException as e:  # noqa: BLE001 - given to the caller
            ready.append(e)
            return
        finally:
            spawned.set()
        try:
            while True:
                try:
                    msg, fds, _, _ = socket.recv_fds(s.sock, 4096, 1)
                except OSError:
                    msg, fds = b"", []
                if not msg:
                    break
                self._answer(s, msg.decode().split("\0"), fds)
        finally:
            self._died(s)

    def _answer(self, s: _Server, fields: list[str], fds: list[int]) -> None:
        kind, rid = fields[0], fields[1]
        with s.lock:
            req = s.pending.get(rid)
            if kind in ("E", "X"):
                s.pending.pop(rid, None)
        if req is None:
            for fd in fds:
                os.close(fd)
        elif kind == "S":
            req.pidfd = fds[0] if fds else None
            _deliver(req, req.started, (int(fields[2]), req.pidfd))
        elif kind == "E":
            _deliver(req, req.started, error=LaunchError(fields[2]))
        else:
            _deliver(req, req.exited, int(fields[2]))

    def _died(self, s: _Server) -> None:
        """The server is gone: pending runs fail with :class:`ServerDied` (not started: sent again
        by :meth:`launch`; started: they died with it, an infrastructure failure)."""
        with s.lock:
            s.dead = True
            pending, s.pending = s.pending, {}
        try:
            s.sock.close()
        except OSError:
            pass
        try:
            s.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            s.proc.kill()
            s.proc.wait()
        why = f"the sandbox launch server died (exit status {s.proc.returncode})"
        for req in pending.values():
            if req.pidfd is None:  # not started (its answer is read in this thread: no race)
                _deliver(req, req.started, error=ServerDied(why))
            _deliver(req, req.exited, error=ServerDied(why))

    async def launch(self, args: list[str], fds: list[int], targets: list[int]) -> Launched:
        """Start one run: the launcher with ``args`` (:func:`.isolation.launcher_args` then the
        command), ``fds`` = stdin, stdout, stderr and then descriptors the run gets at ``targets``.
        The caller keeps its descriptors (and closes them after this returns). A server that died
        before starting the run is replaced and the run sent again (once).

        Raises:
            LaunchError: the process could not be made.
            ServerDied: the server could not be started, or died twice in a row.
        """
        loop = asyncio.get_running_loop()
        for attempt in range(2):
            s = self._running() if self.pid is not None else await asyncio.to_thread(self._running)
            req = _Request(loop, loop.create_future(), loop.create_future())
            rid = str(next(self._ids))
            fields = [rid, str(len(targets)), *map(str, targets), *args]
            with s.lock:
                if s.dead:
                    continue
                s.pending[rid] = req
            try:
                socket.send_fds(s.sock, ["\0".join(fields).encode()], fds)
            except OSError:
                with s.lock:
                    s.pending.pop(rid, None)
                s.dead = True
                _shut(s.sock)  # the server exits and its reader thread ends; the next attempt starts another
                if attempt:
                    raise ServerDied("the sandbox launch server does not answer") from None
                continue
            try:
                pid, pidfd = await req.started
            except ServerDied:
                if attempt:
                    raise
                continue
            return Launched(pid, pidfd, req.exited)
        raise ServerDied("the sandbox launch server died twice before starting the run")


@dataclass
class Launched:
    """A run the server started: ``pid``, ``pidfd`` (ours to close), ``exited`` (its exit status)."""

    pid: int
    pidfd: int | None
    exited: asyncio.Future

    def kill(self) -> None:
        """SIGKILL the run's process (bwrap; its pid 1 and everything inside die with it)."""
        if self.pidfd is not None:
            _kill_pidfd(self.pidfd)

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


_server = LaunchServer()
_usable: list[bool] = []


def server() -> LaunchServer | None:
    """This process's launch server, or None where one cannot work here (no ``pidfd_open``,
    ``socket.send_fds``: Linux < 5.3 or Python < 3.9; the launcher then starts per run, with a
    warning once)."""
    if not _usable:
        ok = hasattr(os, "pidfd_open") and hasattr(socket, "send_fds") and hasattr(signal, "pidfd_send_signal")
        if ok:
            try:
                os.close(os.pidfd_open(os.getpid()))
            except OSError:
                ok = False
        if not ok:
            log.warning("python sandbox: no launch server here (pidfd_open missing); each run starts its launcher")
        _usable.append(ok)
    return _server if _usable[0] else None


def _after_fork_in_child() -> None:
    """A forked trainer process shares no server with its parent: it closes its copy of the socket
    and starts its own server when it needs one."""
    s, _server._server = _server._server, None
    _server._lock = threading.Lock()
    if s is not None:
        try:
            s.sock.close()
        except OSError:
            pass


os.register_at_fork(after_in_child=_after_fork_in_child)


def _shut(sock: socket.socket) -> None:
    """Close our end of a server's socket (the server exits at end of file; runs in flight die with it)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
