"""A timeline of a run in the Chrome / Perfetto trace-event format (``run.trace``).

Every phase of the loop runs inside a :func:`span`: it measures the phase's wall time (the
``time/*`` metrics read :attr:`Span.seconds`) and, while a trace is being written
(:func:`start_trace`), also records it as a complete event (``"ph": "X"``) on the track of the
thread that ran it. The loop's thread, the asynchronous rollout producer and the trainer each get
a track, so rollouts generated during training show as overlapping spans. With no trace open a
span costs two clock reads; nothing is allocated beyond the span itself and nothing is written.
While a ``torch.profiler`` runs, a span is also a ``record_function`` range of its trace, so the
profiler's timeline shows the loop's phases above the kernels (``bench/gpu_gaps.py`` reads them).

File format (the Trace Event Format of Chrome's trace viewer, which ui.perfetto.dev and
chrome://tracing read): the JSON object format, ``{"displayTimeUnit": "ms", "otherData": {...},
"traceEvents": [...]}``. Times ``ts`` and ``dur`` are microseconds; ``ts`` counts from the Unix
epoch (so a resumed run appending to the same file continues the same time axis). The file is
valid JSON after every event: each event is written with one ``pwrite`` over the closing ``]}``,
which it writes again after itself. A run that crashes or is killed keeps every event written
before, in a file every JSON reader loads. (The format lets a writer leave out the closing
bracket of the array form, but Perfetto's importer has refused such files, google/perfetto#926:
keeping the file complete avoids the question.)

Other processes (Ray mode: the trainer ranks and the engine actors) record into memory instead
(:func:`start_buffer`, the same :func:`span` API); the process that writes the file fetches their
events (:func:`drain` there) and adds them with :func:`merge`, each process keeping its own
``pid`` and ``process_name`` so the viewer shows one track group per process. Collectors
registered with :func:`add_collector` run when the trace stops, to fetch the last of them.

Usage::

    start_trace(run_dir / TRACE_FILE)
    with span("train", cat="train", rollout_id=3) as s:
        ...
    seconds = s.seconds
    instant("preempt", slot=4)
    stop_trace()
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from . import stall

__all__ = [
    "TRACE_FILE",
    "Span",
    "TraceBuffer",
    "TraceWriter",
    "active",
    "add_collector",
    "drain",
    "file_writer",
    "instant",
    "merge",
    "now_us",
    "read_trace",
    "remove_collector",
    "span",
    "spans_over",
    "start_buffer",
    "start_trace",
    "stop_trace",
    "writing",
]

log = logging.getLogger(__name__)

TRACE_FILE = "trace.json"
"""Its name inside the run directory."""

T = TypeVar("T")
_TAIL = b"\n]}\n"
_HEAD = '{{"displayTimeUnit": "ms", "otherData": {otherData}, "traceEvents": [\n'


class _Recorder:
    """What a trace of one process records into: its clock (``perf_counter`` shifted to Unix time
    once, so events of one process never go back) and its thread tracks."""

    def __init__(self, main_thread: str):
        self.pid = os.getpid()
        self.main_thread = main_thread
        self._lock = threading.Lock()
        self._named: set[int] = set()
        self._offset_ns = time.time_ns() - time.perf_counter_ns()

    def write(self, event: dict[str, Any]) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _name_process(self, process_name: str, labels: str, sort_index: int | None) -> None:
        self.write({"ph": "M", "name": "process_name", "pid": self.pid, "tid": 0, "args": {"name": process_name}})
        self.write({"ph": "M", "name": "process_labels", "pid": self.pid, "tid": 0, "args": {"labels": labels}})
        if sort_index is not None:
            self.write(
                {"ph": "M", "name": "process_sort_index", "pid": self.pid, "tid": 0, "args": {"sort_index": sort_index}}
            )

    def now_us(self, perf_ns: int | None = None) -> float:
        """Microseconds since the Unix epoch of ``perf_ns`` (a ``time.perf_counter_ns()`` reading; now if None)."""
        return ((time.perf_counter_ns() if perf_ns is None else perf_ns) + self._offset_ns) / 1000.0

    def thread_track(self) -> int:
        """This thread's track id (its native thread id); names the track on first use
        (``main_thread`` for the main thread, else the thread's name)."""
        tid = threading.get_native_id()
        if tid not in self._named:
            self._named.add(tid)
            t = threading.current_thread()
            main = t is threading.main_thread()
            name = self.main_thread if main else t.name
            self.write({"ph": "M", "name": "thread_name", "tid": tid, "args": {"name": name}})
            self.write({"ph": "M", "name": "thread_sort_index", "tid": tid, "args": {"sort_index": 0 if main else 1}})
        return tid

    def complete(self, name: str, cat: str, start_ns: int, end_ns: int, args: dict[str, Any] | None) -> None:
        """A complete event (``"ph": "X"``) from two ``perf_counter_ns`` readings, on this thread's track."""
        event = {
            "ph": "X",
            "name": name,
            "cat": cat,
            "ts": round(self.now_us(start_ns), 3),
            "dur": round(max(end_ns - start_ns, 0) / 1000.0, 3),
            "tid": self.thread_track(),
        }
        if args:
            event["args"] = args
        self.write(event)

    def close(self) -> None:
        """Stop recording; idempotent."""


class TraceWriter(_Recorder):
    """Appends trace events to ``path`` (thread-safe), keeping the file a complete JSON object.

    An existing file that ends like one this class writes (a resumed run) is continued; any other
    file at ``path`` is replaced.

    Args:
        path: the ``trace.json`` to write.
        process_name: the name of this process's track group in the viewer.

    Raises:
        OSError: ``path`` cannot be opened for writing.
    """

    def __init__(self, path: str | Path, process_name: str = "reinforge"):
        super().__init__("loop")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        size = os.fstat(self._fd).st_size
        continued = size > len(_TAIL) and os.pread(self._fd, len(_TAIL), size - len(_TAIL)) == _TAIL
        if continued:
            self._end, self._first = size - len(_TAIL), False
        else:
            os.ftruncate(self._fd, 0)
            head = _HEAD.format(otherData=json.dumps({"producer": "reinforge", "start_unix_s": time.time()}))
            data = head.encode() + _TAIL
            os.pwrite(self._fd, data, 0)
            self._end, self._first = len(head.encode()), True
        self._name_process(process_name, f"pid {self.pid}" + (" (continued)" if continued else ""), 0)

    def write(self, event: dict[str, Any]) -> None:
        """Append one event (a dict of the trace-event format; ``pid`` is filled in when missing)."""
        self.write_many([event])

    def write_many(self, events: list[dict[str, Any]]) -> None:
        """Append events with one ``pwrite`` (``pid`` filled in where missing)."""
        if not events:
            return
        texts = []
        for event in events:
            event.setdefault("pid", self.pid)
            texts.append(json.dumps(event, separators=(",", ":"), default=str).encode())
        with self._lock:
            if self._fd < 0:
                return
            data = (b"" if self._first else b",\n") + b",\n".join(texts)
            os.pwrite(self._fd, data + _TAIL, self._end)
            self._end += len(data)
            self._first = False

    def close(self) -> None:
        """Stop writing (the file is already complete); idempotent."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


class TraceBuffer(_Recorder):
    """Holds the events of a process whose trace another process writes (a Ray actor), until
    :meth:`drain` hands them over (thread-safe).

    Args:
        process_name: the name of this process's track group (``trainer rank 0``, ``engine 1``).
        main_thread: the name of the main thread's track.
        sort_index: where the viewer puts the group (the writing process's is 0).
    """

    def __init__(self, process_name: str, main_thread: str = "main", sort_index: int | None = None):
        super().__init__(main_thread)
        self.process_name = process_name
        self.events: list[dict[str, Any]] = []
        self._name_process(process_name, f"pid {self.pid} on {socket.gethostname()}", sort_index)

    def write(self, event: dict[str, Any]) -> None:
        event.setdefault("pid", self.pid)
        with self._lock:
            self.events.append(event)

    def drain(self) -> list[dict[str, Any]]:
        """The events recorded since the last call (metadata included), and forget them."""
        with self._lock:
            out, self.events = self.events, []
        return out


_writer: _Recorder | None = None
_collectors: list[Callable[[], None]] = []


def start_trace(path: str | Path, process_name: str = "reinforge") -> TraceWriter:
    """Open the process's trace at ``path`` (closing one already open) and make :func:`span`,
    :func:`instant` record into it."""
    global _writer
    stop_trace()
    _writer = TraceWriter(path, process_name)
    return _writer


def start_buffer(process_name: str, main_thread: str = "main", sort_index: int | None = None) -> TraceBuffer:
    """Record this process's spans into memory (a process whose events another one writes:
    :func:`drain` hands them over), closing a trace already open."""
    global _writer
    stop_trace()
    buffer = TraceBuffer(process_name, main_thread, sort_index)
    _writer = buffer
    return buffer


def drain() -> list[dict[str, Any]]:
    """The events recorded into this process's buffer since the last call ([] when it records
    into none)."""
    writer = _writer
    return writer.drain() if isinstance(writer, TraceBuffer) else []


def merge(events: list[dict[str, Any]], shift_us: float = 0.0, pid: int | None = None) -> int:
    """Add another process's events (from its :func:`drain`) to the trace this process writes:
    their ``ts`` moved by ``shift_us`` (its clock's offset from this one), their ``pid`` replaced
    by ``pid`` when given. Returns how many were written (0 when no trace file is open)."""
    writer = _writer
    if not isinstance(writer, TraceWriter) or not events:
        return 0
    for e in events:
        if shift_us and "ts" in e:
            e["ts"] = round(e["ts"] + shift_us, 3)
        if pid is not None:
            e["pid"] = pid
    writer.write_many(events)
    return len(events)


def now_us() -> float:
    """This process's trace clock now: microseconds since the Unix epoch."""
    writer = _writer
    return writer.now_us() if writer is not None else time.time_ns() / 1000.0


def add_collector(fn: Callable[[], None]) -> None:
    """Run ``fn`` when the trace stops, before the file is closed (it fetches other processes'
    last events and :func:`merge` s them)."""
    if fn not in _collectors:
        _collectors.append(fn)


def remove_collector(fn: Callable[[], None]) -> None:
    """Forget a collector added by :func:`add_collector` (no error when it is not there)."""
    if fn in _collectors:
        _collectors.remove(fn)


def stop_trace() -> None:
    """Close the process's trace, if one is open, after running the collectors (a collector
    that fails is logged and skipped); spans stop recording."""
    global _writer
    if isinstance(_writer, TraceWriter):
        for fn in list(_collectors):
            try:
                fn()
            except Exception as e:  # the trace is a diagnostic: never fail the run for it
                log.warning("trace: collecting other processes' events failed (%s: %s)", type(e).__name__, e)
    writer, _writer = _writer, None
    if writer is not None:
        writer.close()


def active() -> bool:
    """Whether a trace is being recorded (written, or buffered for another process)."""
    return _writer is not None


def writing() -> bool:
    """Whether this process writes a trace file (other processes' events can be merged)."""
    return isinstance(_writer, TraceWriter)


def file_writer() -> TraceWriter | None:
    """The trace file this process writes, if any."""
    writer = _writer
    return writer if isinstance(writer, TraceWriter) else None


class Span:
    """A timed phase: a context manager that measures its wall time and records it as a complete
    event when a trace is open. Use :func:`span` to make one.

    Attributes:
        seconds: the phase's wall time in seconds (``time.perf_counter``), set when it ends (0.0 before).
        args: shown with the event in the viewer; may be added to inside the block.
    """

    __slots__ = ("name", "cat", "args", "seconds", "_start", "_profiled", "_phase")

    def __init__(self, name: str, cat: str, args: dict[str, Any]):
        self.name, self.cat, self.args = name, cat, args
        self.seconds = 0.0
        self._start = 0
        self._profiled: Any = None
        self._phase: Any = None

    def __enter__(self) -> Span:
        torch = sys.modules.get("torch")  # (not imported for it: a run without torch has no torch profiler)
        if torch is not None and torch.autograd.profiler._is_profiler_enabled:
            # a torch.profiler is running: the phase is a record_function range of its trace too
            self._profiled = torch.profiler.record_function(self.name)
            self._profiled.__enter__()
        self._phase = stall.enter_phase(self.name)  # the stall doctor's view of what this thread does
        self._start = time.perf_counter_ns()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        end = time.perf_counter_ns()
        self.seconds = (end - self._start) / 1e9
        stall.exit_phase(self._phase)  # a phase that ends is progress
        if self._profiled is not None:
            self._profiled.__exit__(exc_type, exc, tb)
            self._profiled = None
        writer = _writer
        if writer is not None:
            if exc_type is not None:
                self.args["error"] = exc_type.__name__
            writer.complete(self.name, self.cat, self._start, end, self.args)


def span(name: str, cat: str = "loop", **args: Any) -> Span:
    """A :class:`Span` named ``name`` (category ``cat``; ``args`` are shown with the event)."""
    return Span(name, cat, args)


def spans_over(name: str, items: Iterable[T], cat: str = "loop") -> Iterator[T]:
    """``items``, each loop body that handles one inside a span ``name`` (args: its ``index``):
    ``for mb in spans_over("micro_batch", mbs, "train"): ...`` times every iteration without
    indenting the loop."""
    for i, item in enumerate(items):
        with Span(name, cat, {"index": i}):
            yield item


def instant(name: str, cat: str = "loop", **args: Any) -> None:
    """A point event (``"ph": "i"``, thread scope) on this thread's track, when a trace is open."""
    writer = _writer
    if writer is not None:
        writer.write(
            {
                "ph": "i",
                "s": "t",
                "name": name,
                "cat": cat,
                "ts": round(writer.now_us(), 3),
                "tid": writer.thread_track(),
                **({"args": args} if args else {}),
            }
        )


def read_trace(path: str | Path) -> list[dict[str, Any]]:
    """The events of a trace file (this module's object form, or the array form with or without
    its closing bracket).

    Raises:
        ValueError: the file is not a trace (the message names it).
    """
    text = Path(path).read_text().strip()
    if text.startswith("[") and not text.endswith("]"):
        text = text.rstrip(",") + "]"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a JSON trace ({e})") from e
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ValueError(f"{path}: no traceEvents list")
    return events
