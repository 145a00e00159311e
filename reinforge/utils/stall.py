"""The stall doctor (``run.stall_timeout_s``, ``run.stall_action``): when a run makes no progress for
the timeout, say in one line what is stuck, write the stacks of every thread of every process of the
run to a file, then end the run (``fail``) or exit for the supervisor to relaunch it (``restart``).

Components report what they are doing into a registry that costs a clock read and a dict write:

* :func:`busy` (a context manager) around a call that may hang: ``with busy("sandbox", "sandbox 17
  (pid 4242)"): ...``; :meth:`Activity.beat` inside it records progress;
* :class:`Heartbeat` for a component that is busy now and then (the engine: sequences in flight,
  the time of the last decoded token);
* :func:`enter_phase` / :func:`exit_phase` (called by :class:`~reinforge.utils.trace.Span`): the
  phases open on each thread, so the loop's phase (``rollout_step > rollout > generate``) is known
  without further hooks; every phase that ends counts as progress.

Kinds of activity, most specific first (:data:`KINDS`): ``collective`` (a trainer rank inside a
process-group call), ``sandbox`` (a program running), ``env`` (an environment's reset / step /
reward), ``reward`` (a reward function running in a worker), ``engine`` (sequences in flight).

:class:`Doctor` runs in the driver: a daemon thread that checks every ``timeout / 4`` seconds
(at most 10) whether anything progressed. Other processes of the run (trainer ranks, reward
workers) call :func:`join`: a ``faulthandler`` dump of all their threads on :data:`SIGNAL` into
``<run_dir>/stall/dump-<pid>.txt``, and, for the trainer ranks, a thread publishing their
registry to ``<run_dir>/stall/proc-<pid>.json`` every ``timeout / 4`` seconds. They find the run's
directory in the environment (:data:`DIR_ENV`, set by :meth:`Doctor.start` before any of them starts).
On a stall the doctor picks the most specific, oldest activity of all processes (:func:`diagnose`,
:mod:`.stall_diagnosis`),
signals every joined process on this host, and gathers the dumps (its own included) into
``<run_dir>/stall/stacks-<UTC time>.txt``.

Exit statuses: :data:`STALLED` (124, as GNU ``timeout``; the supervisor does not relaunch it) for
``fail``, :data:`STALLED_RESTART` (75, sysexits' ``EX_TEMPFAIL``; relaunched by ``--max-restarts``)
for ``restart``. No checkpoint is written at the stall: the state in the middle of a stuck rollout
is not consistent; a relaunch resumes from the newest checkpoint (``run.recover_interval_s``).
"""

from __future__ import annotations

import atexit
import contextvars
import faulthandler
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .stall_diagnosis import KINDS, diagnose, seconds

__all__ = ["KINDS", "Activity", "Doctor", "Heartbeat", "Stall", "StallError", "busy", "diagnose", "join", "progress"]

log = logging.getLogger(__name__)

SIGNAL = signal.SIGUSR2
"""Makes a joined process dump the stacks of all its threads (``faulthandler``)."""

DIR_ENV = "REINFORGE_STALL_DIR"  # where joined processes write (set by Doctor.start, inherited)
TIMEOUT_ENV = "REINFORGE_STALL_TIMEOUT"  # the timeout, to pace the publishing
STALLED = 124  # run.stall_action=fail: the exit status (GNU timeout's); the supervisor does not relaunch it
STALLED_RESTART = 75  # run.stall_action=restart: the exit status (EX_TEMPFAIL); the supervisor relaunches it
ACTIONS = ("fail", "restart")

SUBJECT: contextvars.ContextVar[str | None] = contextvars.ContextVar("stall_subject", default=None)
"""What the current task works for (``"sample 4"``): added to the activities it opens."""

_last_progress = time.monotonic()
_open: dict[int, Activity] = {}
_phases: dict[int, list[tuple[str, float]]] = {}  # thread ident -> its open phases, outermost first
_joined: dict[str, Any] = {}  # this process's join(): role, rank, the dump file


def progress() -> None:
    """Something moved on (a phase ended, a token was decoded, a call returned)."""
    global _last_progress
    _last_progress = time.monotonic()


def last_progress() -> float:
    """``time.monotonic()`` of the last progress in this process."""
    return _last_progress


class Activity:
    """One thing a component is doing, registered while it lasts (:func:`busy`).

    Attributes:
        kind: one of :data:`KINDS` (or another word: reported only when nothing more specific is busy).
        what: says which one, e.g. ``"reward worker 2 (pid 4242) inside my_mod:fn"``.
        since: ``time.monotonic()`` when it began; ``last``: of its last :meth:`beat`.
        fields: numbers the diagnosis reads (the engine's ``sequences``; a collective's ``rank``).
    """

    __slots__ = ("kind", "what", "since", "last", "fields")

    def __init__(self, kind: str, what: str, fields: dict[str, Any]):
        self.kind, self.what, self.fields = kind, what, fields
        self.since = self.last = time.monotonic()
        _open[id(self)] = self
        progress()

    def beat(self, **fields: Any) -> None:
        """It progressed (and its ``fields`` changed)."""
        if fields:
            self.fields.update(fields)
        self.last = time.monotonic()
        progress()

    def close(self) -> None:
        """It ended (whatever the outcome); closing twice is harmless (and so is closing at interpreter exit,
        when the module's globals are already None)."""
        if _open is not None and _open.pop(id(self), None) is not None:
            progress()

    def __enter__(self) -> Activity:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def describe(self, now: float) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "what": self.what,
            "age_s": now - self.since,
            "idle_s": now - self.last,
            "fields": dict(self.fields),
        }


def busy(kind: str, what: str, **fields: Any) -> Activity:
    """Register that ``what`` (of ``kind``) begins now; use as ``with busy(...):`` (or call
    :meth:`Activity.close`). The task's :data:`SUBJECT` (``"sample 4"``) is added to ``what``."""
    subject = SUBJECT.get()
    return Activity(kind, f"{what} of {subject}" if subject else what, fields)


class Heartbeat:
    """A component that is busy now and then, e.g. the engine: :meth:`busy` while it has work (the
    first call opens an :class:`Activity`), :meth:`beat` when it produced something, :meth:`idle`
    when it has nothing left."""

    __slots__ = ("kind", "what", "activity")

    def __init__(self, kind: str, what: str):
        self.kind, self.what = kind, what
        self.activity: Activity | None = None

    def busy(self, **fields: Any) -> None:
        if self.activity is None:
            self.activity = Activity(self.kind, self.what, fields)
        else:
            self.activity.fields.update(fields)

    def beat(self) -> None:
        if self.activity is not None:
            self.activity.beat()

    def idle(self) -> None:
        if self.activity is not None:
            self.activity.close()
            self.activity = None

    def __del__(self) -> None:  # a component dropped while busy (an engine shut down mid-rollout) is busy no more
        self.idle()


def enter_phase(name: str) -> tuple[str, float]:
    """Phase ``name`` began on this thread (``trace.Span``); returns the token for :func:`exit_phase`."""
    entry = (name, time.monotonic())
    ident = threading.get_ident()
    stack = _phases.get(ident)
    if stack is None:
        stack = _phases[ident] = []
    stack.append(entry)
    return entry


def exit_phase(entry: tuple[str, float]) -> None:
    """The phase of ``entry`` ended: progress."""
    stack = _phases.get(threading.get_ident())
    if stack:
        if stack[-1] is entry:
            stack.pop()
        elif entry in stack:  # (a generator's span closed out of order)
            stack.remove(entry)
    progress()


def snapshot(role: str = "driver", rank: int | None = None) -> dict[str, Any]:
    """This process's registry as plain data (what :func:`join` publishes and :func:`diagnose` reads):
    ``idle_s`` since its last progress, its open activities and each live thread's open phases."""
    now = time.monotonic()
    names = {t.ident: t.name for t in threading.enumerate()}
    phases = []
    for ident, stack in list(_phases.items()):
        entries = list(stack)
        if entries and ident in names:
            phases.append({"thread": names[ident], "phases": [n for n, _ in entries], "age_s": now - entries[-1][1]})
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "role": role,
        "rank": rank,
        "written": time.time(),
        "idle_s": now - _last_progress,
        "activities": [a.describe(now) for a in list(_open.values())],
        "phases": phases,
    }


# ----------------------------------------------------------------------------- other processes


def _stall_dir() -> Path | None:
    value = os.environ.get(DIR_ENV)
    return Path(value) if value else None


def _publish_interval() -> float:
    try:
        timeout = float(os.environ.get(TIMEOUT_ENV, "1800"))
    except ValueError:
        timeout = 1800.0
    return min(10.0, max(0.1, timeout / 4))


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, path)


def join(role: str, rank: int | None = None, publish: bool = True) -> bool:
    """Make this process part of the run's stall reports (a trainer rank, a reward worker): its
    threads' stacks are dumped into ``<run_dir>/stall/dump-<pid>.txt`` on :data:`SIGNAL`, and with
    ``publish`` its registry goes to ``proc-<pid>.json`` every ``timeout / 4`` s (a daemon thread).
    A no-op (False) when no doctor runs (:data:`DIR_ENV` unset) or it joined already."""
    d = _stall_dir()
    if d is None or _joined:
        return False
    d.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    dump = open(d / f"dump-{pid}.txt", "w")  # noqa: SIM115 - faulthandler writes to it until the process ends
    faulthandler.register(SIGNAL, file=dump, all_threads=True, chain=False)
    _joined.update(role=role, rank=rank, dump=dump)
    path, started = d / f"proc-{pid}.json", _start_time(pid)
    _write_json(path, {**snapshot(role, rank), "started": started})
    atexit.register(path.unlink, missing_ok=True)
    if publish:
        interval = _publish_interval()

        def loop() -> None:
            while True:
                time.sleep(interval)
                try:
                    _write_json(path, {**snapshot(role, rank), "started": started})
                except OSError:
                    return  # the run directory is gone

        threading.Thread(target=loop, name="stall-publish", daemon=True).start()
    return True


def child_env() -> dict[str, str]:
    """The environment a process must be started with to :func:`join` the run (empty when no
    doctor is prepared): for processes that do not inherit this one's, e.g. the actors of a Ray
    cluster started before the run (``runtime_env={"env_vars": child_env()}``)."""
    return {k: os.environ[k] for k in (DIR_ENV, TIMEOUT_ENV) if k in os.environ}


def ray_options() -> dict[str, Any]:
    """Ray actor options that make an actor :func:`join` the run (``runtime_env`` with :func:`child_env`;
    empty when no doctor is prepared)."""
    env = child_env()
    return {"runtime_env": {"env_vars": env}} if env else {}


def _start_time(pid: int) -> str | None:
    """The kernel's start time of process ``pid`` (``/proc/<pid>/stat`` field 22), None where there is
    no ``/proc`` or no such process: with the pid it names one process, even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(report: dict[str, Any]) -> bool:
    """Whether the process of a published ``report`` (of this host) still runs (not another process
    that got its pid)."""
    pid = int(report["pid"])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    started = report.get("started")
    return started is None or _start_time(pid) in (None, started)


def read_reports(d: Path, skip_pid: int) -> list[dict[str, Any]]:
    """The published reports of the joined processes but ``skip_pid``, ``idle_s`` and the ages
    brought up to now; the files of this host's processes that ended are removed (a later process
    with the same pid is never signalled: the report holds the process's start time)."""
    out, host, now = [], socket.gethostname(), time.time()
    for p in sorted(d.glob("proc-*.json")):
        try:
            rep = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if rep.get("host") == host and not _alive(rep):
            p.unlink(missing_ok=True)  # it ended: its pid may be another process's soon
            continue
        if rep.get("pid") == skip_pid:
            continue
        late = max(0.0, now - float(rep.get("written", now)))
        rep["idle_s"] = float(rep.get("idle_s", 0.0)) + late
        for a in rep.get("activities", []):
            a["age_s"] += late
            a["idle_s"] += late
        for ph in rep.get("phases", []):
            ph["age_s"] += late
        out.append(rep)
    return out


# ----------------------------------------------------------------------------- the doctor


class StallError(RuntimeError):
    """No progress for ``run.stall_timeout_s``: the message says what is stuck (the supervisor
    records it in ``restarts.jsonl``)."""


@dataclass
class Stall:
    """What the doctor found: the one ``line``, the ``stacks`` file, the seconds without progress."""

    line: str
    stacks: Path
    idle_s: float


class Doctor:
    """The watchdog thread of the driver (module docstring).

    Args:
        run_dir: the run directory; the doctor writes under ``run_dir/stall``.
        timeout_s: seconds without progress that make a stall (``run.stall_timeout_s``).
        action: ``fail`` or ``restart`` (``run.stall_action``): what :meth:`end_run` does.
        on_stall: called with the :class:`Stall` instead of :meth:`end_run` (tests; the doctor
            stops after calling it).

    Raises:
        ValueError: ``timeout_s`` not positive, or an unknown ``action`` (naming the key).
    """

    def __init__(
        self,
        run_dir: str | Path,
        timeout_s: float,
        action: str = "fail",
        on_stall: Callable[[Stall], None] | None = None,
    ):
        if not timeout_s > 0:
            raise ValueError(f"run.stall_timeout_s={timeout_s!r} must be > 0 seconds (null turns the doctor off)")
        if action not in ACTIONS:
            raise ValueError(f"run.stall_action={action!r} must be one of {', '.join(ACTIONS)}")
        self.dir = Path(run_dir) / "stall"
        self.timeout_s, self.action = float(timeout_s), action
        self.on_stall = on_stall or self.end_run
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._env: dict[str, str | None] = {}
        self._started = 0.0
        self.stalled: Stall | None = None  # what the doctor found (then it stopped watching)

    def prepare(self) -> Doctor:
        """Set the environment joined processes read (call it before they start) and clear the
        files of an earlier attempt. :meth:`start` calls it when it was not called."""
        if self._env:
            return self
        self.dir.mkdir(parents=True, exist_ok=True)
        for p in [*self.dir.glob("proc-*.json"), *self.dir.glob("dump-*.txt")]:
            p.unlink(missing_ok=True)  # an earlier attempt's (its processes are gone: the run dir is locked)
        for key, value in ((DIR_ENV, str(self.dir)), (TIMEOUT_ENV, str(self.timeout_s))):
            self._env[key] = os.environ.get(key)
            os.environ[key] = value
        return self

    def start(self) -> Doctor:
        """Start watching (:meth:`prepare` first if it was not called); progress counts from now."""
        self.prepare()
        if self._thread is not None:
            return self
        progress()
        self._started = time.monotonic()
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="stall-doctor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching (the run ended or is being shut down) and restore the environment."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None
        for key, value in self._env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._env = {}
        if self.stalled is None and self.dir.is_dir():  # nothing to look at: leave no files behind
            for p in [*self.dir.glob("proc-*.json"), *self.dir.glob("dump-*.txt")]:
                if p.suffix == ".json" or p.stat().st_size == 0:
                    p.unlink(missing_ok=True)
            if not any(self.dir.iterdir()):
                self.dir.rmdir()

    def __enter__(self) -> Doctor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _watch(self) -> None:
        poll = min(10.0, self.timeout_s / 4)
        while not self._stop.wait(poll):
            found = self.check()
            if found is not None:
                self._stop.set()
                self.stalled = found
                self.on_stall(found)
                return

    def check(self) -> Stall | None:
        """A :class:`Stall` when no process of the run progressed for the timeout (stacks written),
        else None."""
        mine = snapshot("driver")
        mine["idle_s"] = min(mine["idle_s"], time.monotonic() - self._started)
        others = read_reports(self.dir, os.getpid())
        idle = min([mine["idle_s"], *(r["idle_s"] for r in others)])
        if idle < self.timeout_s:
            return None
        line = diagnose([mine, *others])
        return Stall(line, self.write_stacks(), idle)

    def joined_here(self) -> dict[int, str]:
        """``{pid: role}`` of the live joined processes of this host (not this one)."""
        host, out = socket.gethostname(), {}
        for p in self.dir.glob("proc-*.json"):
            try:
                rep = json.loads(p.read_text())
                pid = int(rep["pid"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if rep.get("host") == host and pid != os.getpid() and _alive(rep):
                out[pid] = str(rep.get("role", "process"))
        return out

    def write_stacks(self, wait_s: float = 3.0) -> Path:
        """Signal the joined processes of this host, wait up to ``wait_s`` for their dumps, and write
        them after this process's own into ``stall/stacks-<UTC time>-<pid>.txt``; returns its path.
        (Processes of other hosts dump nothing here: their stacks are not in the file.)"""
        joined = self.joined_here()
        sizes = {}
        for pid in joined:
            raw = self.dir / f"dump-{pid}.txt"
            sizes[pid] = raw.stat().st_size if raw.exists() else 0
            try:
                os.kill(pid, SIGNAL)
            except OSError:
                pass
        out = self.dir / f"stacks-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{os.getpid()}.txt"
        with out.open("w") as f:
            f.write(f"==== pid {os.getpid()} (driver) ====\n")
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
            f.flush()
            deadline = time.monotonic() + wait_s
            pending = dict(joined)
            seen = dict(sizes)
            while pending and time.monotonic() < deadline:
                time.sleep(0.1)
                for pid in list(pending):
                    raw = self.dir / f"dump-{pid}.txt"
                    size = raw.stat().st_size if raw.exists() else 0
                    if size > sizes[pid] and size == seen[pid]:
                        pending.pop(pid)  # its dump stopped growing
                    seen[pid] = size
            texts: dict[int, str] = {}
            for pid in joined:
                raw = self.dir / f"dump-{pid}.txt"
                if raw.exists() and raw.stat().st_size > sizes[pid]:
                    with raw.open("rb") as r:
                        r.seek(sizes[pid])
                        texts[pid] = r.read().decode(errors="replace")
            for pid, role in joined.items():
                f.write(f"\n==== pid {pid} ({role}) ====\n")
                f.write(texts.get(pid) or f"(no dump within {wait_s:g} s: the process may be stuck in the kernel)\n")
        return out

    def end_run(self, stall: Stall) -> None:
        """Say what is stuck (one line, logged at ERROR), record it for the supervisor, stop the
        joined processes of this host, and exit this process at once: :data:`STALLED` for ``fail``,
        :data:`STALLED_RESTART` for ``restart`` (the stuck threads cannot be joined)."""
        from .failures import record_failure

        code = STALLED if self.action == "fail" else STALLED_RESTART
        then = (
            "run.stall_action=fail: stopping (exit status 124, not relaunched)"
            if self.action == "fail"
            else "run.stall_action=restart: exiting with status 75 to be relaunched from the newest checkpoint "
            "(by the supervisor: --max-restarts)"
        )
        message = (
            f"stalled: {stall.line}; no progress for {seconds(stall.idle_s)} "
            f"(run.stall_timeout_s={self.timeout_s:g}); stacks of every thread in {stall.stacks}; {then}"
        )
        log.error("%s", message)  # (on stderr: the CLI's log, or logging's last resort handler)
        record_failure(StallError(message))
        for pid in self.joined_here():  # trainer ranks and workers: nothing of the run keeps running
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        logging.shutdown()
        os._exit(code)


def doctor_for(run: Any, run_dir: str | Path) -> Doctor | None:
    """The doctor of a run from its ``run`` config section (``stall_timeout_s``, ``stall_action``),
    already prepared (:meth:`Doctor.prepare`: call it before any other process of the run starts); None
    when ``stall_timeout_s`` is null (off)."""
    if run.stall_timeout_s is None:
        return None
    return Doctor(run_dir, run.stall_timeout_s, run.stall_action).prepare()
