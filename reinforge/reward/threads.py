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
