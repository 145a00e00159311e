"""Per-process tracks in a Ray run's trace (``run.trace``): each trainer rank and engine actor
records its own spans, the driver merges them into its ``trace.json``.

* **In the actors** (:class:`TracedActor`, a base of the trainer and engine actors): when the
  driver traces, :meth:`TracedActor.trace_start` makes the actor's process record into memory
  (:func:`reinforge.utils.trace.start_buffer`): every ``trace.span`` run there (the trainer's
  ``train_actor``, ``micro_batch``, ``optimizer_step``; the engine's ``generate``, preemptions)
  becomes an event with the process's own ``pid`` and name (``trainer rank 0``, ``engine 1``).
  Without a trace the actors record nothing: a span is two clock reads.
* **The clocks**: every process stamps events with Unix time (its monotonic clock shifted once).
  When the actor is started the driver reads its clock three times and keeps the reading with
  the shortest round trip (Cristian's method): an offset larger than half that round trip (a
  node whose clock is off) moves the actor's events onto the driver's axis; a smaller one is
  noise of the measurement (every process of one machine) and is left alone.
* **Collection** (:class:`ActorTraces`, on the driver): after every weight sync the driver asks
  each actor for the events recorded since the last time (``trace_drain``). Every actor is idle
  then (the sync holds the engines, asynchronous runs included) and answers at once; one that
  does not within ``COLLECT_WAIT_S`` is asked again at the next sync. Events fetched before the
  driver's trace file opens (the actors' setup, a checkpoint load, the first weight sync) are
  held and merged, with the processes' names, once it is open. When the trace stops
  (:func:`reinforge.utils.trace.stop_trace`, end of the run) the last events are fetched,
  waiting up to ``COLLECT_WAIT_S``. Events of an actor that died with them are lost; the rest
  of the trace is unaffected.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any

from ..utils import trace

log = logging.getLogger(__name__)

COLLECT_WAIT_S = 10.0
"""How long a collection waits for the actors' answers (at the end of the trace: for each of
its two rounds)."""

MAX_BACKLOG = 100_000
"""Events of one actor held while no trace file is open (before the run's trace starts: the
actors' setup, a checkpoint load, the first weight sync); older ones are left out beyond it."""


class TracedActor:
    """The trace methods of a Ray actor (its events recorded in memory, handed to the driver)."""

    def trace_start(self, process_name: str, main_thread: str, sort_index: int) -> dict[str, Any]:
        """Record this process's spans (until the actor ends); its pid and node."""
        import ray

        trace.start_buffer(process_name, main_thread, sort_index)
        return {"pid": os.getpid(), "node": ray.util.get_node_ip_address()}

    def trace_clock(self) -> float:
        """This process's trace clock (microseconds since the Unix epoch)."""
        return trace.now_us()

    def trace_drain(self) -> list[dict[str, Any]]:
        """The events recorded since the last call."""
        return trace.drain()


@dataclass
class _Track:
    handle: Any
    name: str
    pid: int  # the pid its events get in the merged file (its own unless that is taken)
    shift_us: float  # added to its timestamps: the driver's clock minus its clock (0: same clock)
    pending: Any = None  # a trace_drain() call not yet merged
    merged: int = 0  # events merged so far
    meta: list[dict[str, Any]] = field(default_factory=list)  # its process and thread names
    backlog: list[dict[str, Any]] = field(default_factory=list)  # events fetched while no trace was open
    written_to: Any = None  # the trace writer that has its names
    dropped: int = 0  # events beyond MAX_BACKLOG left out

    def take(self, events: list[dict[str, Any]]) -> None:
        """Hold events handed over by the actor until they can be merged."""
        self.meta += [e for e in events if e.get("ph") == "M"]
        self.backlog += [e for e in events if e.get("ph") != "M"]
        if len(self.backlog) > MAX_BACKLOG:
            self.dropped += len(self.backlog) - MAX_BACKLOG
            del self.backlog[:-MAX_BACKLOG]

    def flush(self) -> int:
        """Merge what it holds into the open trace (its names first, the first time); the number merged."""
        writer = trace.file_writer()
        if writer is None:
            return 0
        events, self.backlog = self.backlog, []
        if self.written_to is not writer:  # a trace opened after the actor started, or a new one
            events = [dict(e) for e in self.meta] + events
            self.written_to = writer
        n = trace.merge(events, self.shift_us, self.pid)
        self.merged += n
        return n


def clock_shift(handle: Any, tries: int = 3) -> float:
    """Microseconds to add to the actor's timestamps to put them on this process's clock: 0
    unless the measured offset exceeds the uncertainty of the measurement (half the shortest
    round trip of ``tries`` reads)."""
    import ray

    best: tuple[float, float] | None = None
    for _ in range(tries):
        t0 = trace.now_us()
        remote = ray.get(handle.trace_clock.remote())
        t1 = trace.now_us()
        if best is None or t1 - t0 < best[0]:
            best = (t1 - t0, (t0 + t1) / 2 - remote)
    assert best is not None
    rtt, shift = best
    return shift if abs(shift) > rtt / 2 else 0.0


class ActorTraces:
    """The driver's side: the actors whose events go into its trace, and their collection.

    :meth:`add` starts an actor's recording; :meth:`collect` merges what the actors recorded
    (registered with :func:`reinforge.utils.trace.add_collector`, so the end of the trace
    collects the rest); :meth:`close` collects and forgets them.
    """

    def __init__(self) -> None:
        self.tracks: dict[str, _Track] = {}
        self._pids: dict[tuple[str, int], int] = {(_node(), os.getpid()): os.getpid()}
        self._lock = threading.Lock()
        trace.add_collector(self.collect_final)

    def add(self, key: str, handle: Any, name: str, main_thread: str, sort_index: int) -> None:
        """Start recording in actor ``handle`` (replacing the track ``key`` had: a replaced engine),
        its events shown as process ``name``."""
        import ray

        info = ray.get(handle.trace_start.remote(name, main_thread, sort_index))
        shift = clock_shift(handle)
        if shift:
            log.info("trace: %s on %s: clock %.0f us off the driver's; its events are moved", name, info["node"], shift)
        with self._lock:
            pid = self._pids.get((info["node"], info["pid"]))
            if pid is None:  # same pid on another node: give it one of its own
                pid = info["pid"]
                while pid in self._pids.values():
                    pid += 1 << 22
                self._pids[(info["node"], info["pid"])] = pid
            old = self.tracks.get(key)
            if old is not None:  # a replaced actor: what was fetched from it still goes in
                old.flush()
            self.tracks[key] = _Track(handle, name, pid, shift)

    def collect(self, final: bool = False) -> int:
        """Fetch the events the actors recorded since the last collection and merge them into the
        open trace (held until one opens, up to ``MAX_BACKLOG`` per actor); the number merged.
        Waits up to ``COLLECT_WAIT_S`` for the answers; an actor that has not answered keeps its
        request for the next collection. ``final`` (the end of the trace): an answer to a request
        of an earlier collection is followed by a second request, so everything is fetched."""
        with self._lock:
            tracks = list(self.tracks.values())
            stale = self._fetch(tracks, warn=final)  # answered a request made before this call
            if final and stale:
                self._fetch(stale, warn=True)
            return sum(t.flush() for t in tracks)

    def _fetch(self, tracks: list[_Track], warn: bool) -> list[_Track]:
        """One round: ask the tracks without a request in flight, wait for every answer, take them;
        the tracks whose answer was to an older request."""
        import ray

        stale = [t for t in tracks if t.pending is not None]
        for t in tracks:
            if t.pending is None:
                t.pending = t.handle.trace_drain.remote()
        ready, _ = ray.wait([t.pending for t in tracks], num_returns=len(tracks), timeout=COLLECT_WAIT_S)
        done = set(ready)
        answered = []
        for t in tracks:
            if t.pending not in done:
                if warn:
                    log.warning("trace: %s did not hand over its last events within %.0f s", t.name, COLLECT_WAIT_S)
                continue
            ref, t.pending = t.pending, None
            try:
                t.take(ray.get(ref))
                answered.append(t)
            except Exception as e:  # the actor died: its events are gone, the trace goes on
                log.warning("trace: %s's events are lost (%s)", t.name, type(e).__name__)
        return [t for t in stale if t in answered]

    def collect_final(self) -> None:
        """Everything the actors recorded, waiting for busy ones (the end of the trace)."""
        self.collect(final=True)
        with self._lock:  # a drain submitted now would only return what was just collected
            for t in self.tracks.values():
                t.pending = None

    def close(self) -> None:
        """Collect what is left (when the trace is still open) and stop collecting."""
        if trace.writing():
            self.collect_final()
        trace.remove_collector(self.collect_final)
        self.tracks.clear()


def _node() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # no Ray here (tests)
        return "driver"
