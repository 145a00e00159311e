"""Daemon worker threads for synchronous reward calls that the caller may stop waiting for.

``concurrent.futures.ThreadPoolExecutor`` does not fit: its workers are joined at interpreter exit, so
one reward call that never returns would hang the end of the run, and a stuck call holds its worker
for good. Here a worker that is still busy is simply not reused: a job submitted while no worker is
idle starts a new one, so a call abandoned after ``reward.timeout`` costs one thread until it returns
and never delays the others. Reusing threads matters because starting one costs about 0.3 ms of
the host (a GRPO rollout of 256 samples spent 80-95 ms of an 0.85 s step starting one thread per
sample on an H200 machine: ``bench/grpo_step_profile.py``).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable


class Job:
    """One call handed to a worker: ``finished`` is set when ``fn`` has returned (or raised)."""

    __slots__ = ("fn", "then", "finished")

    def __init__(self, fn: Callable[[], None], then: Callable[[], None] | None):
        self.fn, self.then = fn, then
        self.finished = threading.Event()


class DaemonWorkers:
    """Run jobs on reused daemon threads; a new thread when none is idle (see the module doc).

    ``submit(fn, then)`` returns the :class:`Job` at once. The worker runs ``fn()``, counts itself
    idle, then runs ``then()`` (so a caller woken by ``then`` finds the worker free for its next job).
    Exceptions escaping either are swallowed so that the worker survives: report them from inside.
    Thread-safe; after a fork the child starts workers of its own. ``threads`` counts the workers started
    so far (idle, busy or stuck)."""

    def __init__(self, name: str = "reward"):
        self.name = name
        self.threads = 0
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()  # a forked child has none of the parent's threads: it starts its own
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()  # None: an idle worker ends
        self._lock = threading.Lock()
        self._idle = 0  # workers waiting in get() that no submitted job has claimed yet

    def submit(self, fn: Callable[[], None], then: Callable[[], None] | None = None) -> Job:
        if os.getpid() != self._pid:
            self._reset()
        job = Job(fn, then)
        with self._lock:
            start = self._idle == 0
            if start:
                self.threads += 1
            else:
                self._idle -= 1  # that worker will take this job: every put has one taker
        self._jobs.put(job)
        if start:
            threading.Thread(target=self._work, name=self.name, daemon=True).start()
        return job

    def close(self) -> None:
        """End the idle workers (a busy one stays until its job returns, then idles); a later
        :meth:`submit` starts new ones."""
        with self._lock:
            n, self._idle = self._idle, 0
        for _ in range(n):
            self._jobs.put(None)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job.fn()
            except BaseException:  # noqa: BLE001, S110 - the job reports its own errors
                pass
            finally:
                job.finished.set()
            with self._lock:
                self._idle += 1
            if job.then is not None:
                try:
                    job.then()
                except BaseException:  # noqa: BLE001, S110
                    pass


class InSequence:
    """Calls ``fns[i](items[i])`` one after another on one worker of ``workers``: one thread handoff for
    the whole list instead of one per call, for functions that would only take turns on the GIL. The
    caller's :meth:`wait` watches each call's clock and abandons the run at the first call that takes
    longer than ``timeout`` seconds (its worker finishes that call and stops; the result is dropped).

    ``outcomes`` holds ``(True, value)`` or ``(False, exception)`` of every call that finished before
    :meth:`wait` returned, in order; a ``BaseException`` (``sys.exit`` in the function) is handed back as
    ``wrap(fn, e)``. ``job`` is the worker's :class:`Job` (the caller counts it while an abandoned call runs).
    ``before(fn)`` runs on the worker before each call (it sets the worker's context)."""

    def __init__(
        self,
        workers: DaemonWorkers,
        items: list,
        fns: list[Callable],
        wrap: Callable[[Callable, BaseException], Exception],
        before: Callable[[Callable], None] | None = None,
    ):
        self.items, self.fns, self.wrap, self.before = items, fns, wrap, before
        self.outcomes: list[tuple[bool, object]] = []
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._stop = False
        self.job = workers.submit(self._run)

    def _run(self) -> None:
        for item, fn in zip(self.items, self.fns):
            with self._lock:
                if self._stop:
                    return
                self._started = time.monotonic()
            if self.before is not None:
                self.before(fn)
            try:
                out: tuple[bool, object] = (True, fn(item))
            except Exception as e:  # noqa: BLE001 - handed to the caller
                out = (False, e)
            except BaseException as e:  # sys.exit, KeyboardInterrupt raised inside the function
                out = (False, self.wrap(fn, e))
            with self._lock:
                if self._stop:  # abandoned meanwhile: the caller has counted this call as timed out
                    return
                self.outcomes.append(out)

    def wait(self, timeout: float) -> int | None:
        """Wait for the run; None when every call finished, else the index of the call that ran past
        ``timeout`` (the run is abandoned there: the calls after it are left to the caller)."""
        while True:
            with self._lock:
                i, deadline = len(self.outcomes), self._started + timeout
            if self.job.finished.wait(max(0.0, deadline - time.monotonic())):
                return None
            with self._lock:
                if len(self.outcomes) == i and self._started + timeout <= time.monotonic():
                    self._stop = True
                    return i
