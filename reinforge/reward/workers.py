"""User reward functions (``reward.function_path``) in worker processes.

A reward function is user code: it may call ``os._exit`` (directly, through ``from os import
_exit``, or from a thread it starts), crash the interpreter, hang in C code, or leak threads. In
the trainer's process each of these ends or slowly poisons the run. Here every call runs in a
worker process of a small pool (:class:`RewardProcessPool`), one call per worker at a time:

* a worker that ends during a call (``os._exit``, a segfault) is an error of that sample only,
  naming the exit code; the worker is replaced;
* a call past ``reward.timeout`` is ended by killing its worker (nothing is left running);
* ``sys.exit`` / ``KeyboardInterrupt`` raised by the function is an error of that sample;
* a worker whose resident memory (RSS, ``/proc/<pid>/status``) is past ``reward.worker_max_memory_mb``
  when its calls are answered is replaced by a new one, with a warning (a function that keeps memory
  between calls, such as a growing cache, would otherwise grow its worker without end).

Workers are plain ``python -m reinforge.reward.workers`` processes (not ``multiprocessing``: a
spawned child would re-import the trainer's ``__main__``, and with it torch), talking over two
pipes with pickled messages. They import only :mod:`reinforge.records` and the user's module,
ignore SIGINT (Ctrl-C is the trainer's to handle) and die with the trainer (``PR_SET_PDEATHSIG``,
and the end of their input pipe).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection, wait
from typing import Any

from ..utils import stall

START_TIMEOUT_S = 300.0  # importing the user's module (it may import a large library)
_numbers = itertools.count()  # reward workers of this process, numbered as started (the stall doctor's line)

log = logging.getLogger(__name__)


def resident_mb(pid: int) -> float | None:
    """Resident memory (``VmRSS``) of process ``pid`` in MiB; None where ``/proc`` does not tell (not
    Linux, the process gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclasses.dataclass
class Outcome:
    """What one call gave: ``kind`` is ``ok`` (``value`` is the result, ``info`` the sample's
    ``reward_info`` after the call), ``error`` (an exception, or ``sys.exit``), ``exit`` (the worker
    ended during the call) or ``timeout``; ``message`` says what happened for the last three."""

    kind: str
    value: Any = None
    info: dict[str, Any] | None = None
    message: str = ""


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class _Worker:
    def __init__(self, function_path: str):
        child_in, parent_out = os.pipe()
        parent_in, child_out = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "reinforge.reward.workers", str(child_in), str(child_out)],
            pass_fds=(child_in, child_out),
            stdin=subprocess.DEVNULL,
        )
        os.close(child_in)
        os.close(child_out)
        self.out = Connection(parent_out, readable=False)
        self.inp = Connection(parent_in, writable=False)
        self.state = "starting"  # starting -> ready <-> busy; dead
        self.tasks: collections.deque[int] = collections.deque()  # sent, not answered yet: tasks[0] is running
        self.deadline = time.monotonic() + START_TIMEOUT_S
        self.out.send({"function_path": function_path, "sys_path": list(sys.path), "cwd": os.getcwd()})
        self.number, self.function_path, self.activity = next(_numbers), function_path, None

    def report(self) -> None:
        """Tell the stall doctor which call runs since when (none: idle)."""
        if self.activity is not None:
            self.activity.close()
        what = f"reward worker {self.number} (pid {self.proc.pid}) inside {self.function_path}"
        self.activity = stall.Activity("reward", what, {}) if self.tasks and self.state == "busy" else None

    def call(self, batch: list[tuple[int, Any]], timeout: float) -> None:
        """Send ``[(index, sample), ...]``: the worker scores them in order, answering each."""
        self.out.send(("call", batch))
        self.state, self.deadline = "busy", time.monotonic() + timeout
        self.tasks.extend(i for i, _ in batch)
        self.report()

    def kill(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.kill()
        code = self.proc.wait()
        for c in (self.out, self.inp):
            c.close()
        self.state = "dead"
        self.report()
        return code


class RewardProcessPool:
    """At most ``size`` worker processes running ``function_path``, started when a batch needs them
    and kept between batches. :meth:`run` is thread-safe (batches are scored one at a time).

    Args:
        function_path: ``module:function``; the module is imported in the workers only.
        size: workers at most (``reward.concurrency``).
        timeout: seconds per call (``reward.timeout``); a call past it kills its worker.
        max_memory_mb: a worker whose resident memory is past this many MiB once its calls are
            answered is replaced (``reward.worker_max_memory_mb``; 0: no limit).
    """

    def __init__(self, function_path: str, size: int, timeout: float, max_memory_mb: float = 0):
        self.function_path, self.size, self.timeout = function_path, size, timeout
        self.max_memory_mb = max_memory_mb
        self.recycled = 0  # workers replaced for their memory
        self.workers: list[_Worker] = []
        self.is_async = False
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start one worker and wait until it has imported the function.

        Raises:
            ValueError: the function cannot be loaded (the message names ``reward.function_path``),
                or the worker ended while importing it.
        """
        with self._lock:
            self._ensure(1)
            while self.workers[0].state == "starting":
                self._wait_and_handle([None])

    def _ensure(self, n: int) -> None:
        self.workers = [w for w in self.workers if w.state != "dead"]
        while len(self.workers) < n:
            self.workers.append(_Worker(self.function_path))

    def run(self, samples: list[Any]) -> list[Outcome]:
        """One :class:`Outcome` per sample, in order. Samples are sent without ``routed_experts``, a
        few at a time to each worker (each call still has its own ``timeout``).

        Raises:
            ValueError: a new worker cannot load the function.
        """
        with self._lock:
            out: list[Outcome | None] = [None] * len(samples)
            todo = collections.deque(range(len(samples)))
            # as many workers as cores to start with; one more whenever all are busy for GROW_AFTER_S with
            # samples waiting (slow calls, e.g. a remote service), up to size
            target = min(self.size, os.cpu_count() or 1, math.ceil(len(samples) / self.MIN_PER_WORKER))
            while todo or any(w.state == "busy" for w in self.workers):
                self._ensure(max(target, min(self.size, sum(w.state != "dead" for w in self.workers))))
                ready = [w for w in self.workers if w.state == "ready"]
                per = max(1, min(self.MAX_PER_CALL, math.ceil(len(todo) / max(1, 2 * len(self.workers)))))
                for w in ready:
                    batch = [todo.popleft() for _ in range(min(per, len(todo)))]
                    if batch:
                        self._send(w, batch, samples, todo, out)
                answered = self._wait_and_handle(out, todo, self.GROW_AFTER_S if todo else None)
                if todo and not answered and target < self.size:
                    target += 1
            return [o if o is not None else Outcome("error", message="no result") for o in out]

    MIN_PER_WORKER = 4  # a batch of n samples starts at most n / 4 workers
    MAX_PER_CALL = 8
    GROW_AFTER_S = 0.05

    def _send(
        self, w: _Worker, batch: list[int], samples: list[Any], todo: collections.deque, out: list[Outcome | None]
    ) -> None:
        items = []
        for i in batch:
            s = samples[i]
            if dataclasses.is_dataclass(s) and getattr(s, "routed_experts", None) is not None:
                s = dataclasses.replace(s, routed_experts=None)  # a tensor: training input, not the reward's
            items.append((i, s))
        try:
            w.call(items, self.timeout)
        except (BrokenPipeError, ConnectionError, EOFError, OSError):
            w.kill()  # it ended while idle (a thread of an earlier call): not these samples' fault
            todo.extendleft(reversed(batch))
        except Exception as e:  # noqa: BLE001 - a sample that cannot be pickled: send them one by one
            if len(batch) > 1:
                for i in batch:
                    self._send(w, [i], samples, todo, out) if w.state == "ready" else todo.appendleft(i)
                return
            out[batch[0]] = Outcome(
                "error", message=f"the sample cannot be sent to the reward worker: {type(e).__name__}: {e}"
            )

    def _wait_and_handle(
        self, out: list[Outcome | None], todo: collections.deque | None = None, at_most: float | None = None
    ) -> bool:
        """Wait for answers (at most ``at_most`` s, or until the first deadline), handle them and the
        calls past their deadline; whether any worker answered."""
        live = [w for w in self.workers if w.state in ("starting", "busy")]
        if not live:
            return False
        left = max(0.0, min(w.deadline for w in live) - time.monotonic())
        ready = wait([w.inp for w in live], timeout=left if at_most is None else min(left, at_most))
        for w in live:
            if w.inp in ready:
                while w.state != "dead":  # every answer already in the pipe
                    try:
                        msg = w.inp.recv()
                    except (EOFError, OSError):
                        self._ended(w, out, todo)
                        break
                    self._handle(w, msg, out)
                    if w.state != "busy" or not w.inp.poll():
                        break
            elif time.monotonic() >= w.deadline:
                if w.state == "starting":
                    w.kill()
                    raise ValueError(
                        f"reward.function_path={self.function_path!r}: the reward worker did not finish "
                        f"importing it in {START_TIMEOUT_S:.0f} s"
                    )
                running, rest = w.tasks[0], list(w.tasks)[1:]
                w.kill()  # the only way to end a stuck call: nothing keeps running
                out[running] = Outcome(
                    "timeout", message=f"ran past reward.timeout={self.timeout:g}s (its worker was stopped)"
                )
                if todo is not None:
                    todo.extendleft(reversed(rest))
        return bool(ready)

    def _ended(self, w: _Worker, out: list[Outcome | None], todo: collections.deque | None) -> None:
        state, tasks = w.state, list(w.tasks)
        code = w.kill()
        if state == "starting":
            raise ValueError(
                f"reward.function_path={self.function_path!r}: the reward worker ended while importing "
                f"it ({describe_exit(code)})"
            )
        if state == "busy" and tasks:
            out[tasks[0]] = Outcome(
                "exit",
                message=f"ended its worker process ({describe_exit(code)}: os._exit, "
                f"or a crash); the worker was replaced",
            )
            if todo is not None:
                todo.extendleft(reversed(tasks[1:]))

    def _handle(self, w: _Worker, msg: tuple, out: list[Outcome | None]) -> None:
        if msg[0] == "ready":
            self.is_async = msg[1]
            w.state = "ready"
        elif msg[0] == "init_error":
            w.kill()
            raise ValueError(msg[1])
        elif msg[0] == "done":
            _, i, kind, value, info = msg
            out[i] = Outcome("ok", value, info) if kind == "ok" else Outcome("error", message=value)
            if w.tasks and w.tasks[0] == i:
                w.tasks.popleft()
            w.deadline = time.monotonic() + self.timeout  # the next sample of its batch starts now
            if not w.tasks:
                w.state = "ready"
            w.report()  # the next sample of its batch, or idle
            if not w.tasks:
                self._check_memory(w)

    def _check_memory(self, w: _Worker) -> None:
        """Replace idle worker ``w`` when its resident memory is past ``max_memory_mb`` (the next
        batch starts a new one)."""
        if not self.max_memory_mb:
            return
        rss = resident_mb(w.proc.pid)
        if rss is None or rss <= self.max_memory_mb:
            return
        w.kill()  # idle: no call is lost
        self.recycled += 1
        log.warning(
            "reward worker (pid %d) of reward.function_path=%s holds %.0f MiB, past reward.worker_max_memory_mb=%g: "
            "replaced by a new worker (%d so far). The function keeps memory between calls (a growing cache or "
            "list?); raise the limit if it needs that much",
            w.proc.pid,
            self.function_path,
            rss,
            self.max_memory_mb,
            self.recycled,
        )

    def close(self) -> None:
        """Stop every worker."""
        for w in self.workers:
            if w.state != "dead":
                try:
                    w.out.close()  # end of input: an idle worker returns
                    w.proc.wait(timeout=0.5)
                except (OSError, subprocess.TimeoutExpired):
                    pass
                w.kill()
        self.workers = []


# ----------------------------------------------------------------------------- the worker process


def _describe_exception(e: BaseException) -> str:
    import traceback

    frames = traceback.extract_tb(e.__traceback__)
    where = f" (in {frames[-1].name}, {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    return f"{type(e).__name__}: {e}{where}"


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def worker_main(read_fd: int, write_fd: int) -> None:
    """The worker's loop: load the function, then answer ``("call", index, sample)`` messages."""
    import inspect

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stall.join("reward worker", publish=False)  # its stacks in the stall doctor's report
    parent = os.getppid()
    _die_with_parent()
    inp, out = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    if os.getppid() != parent:
        return
    try:
        init = inp.recv()
    except EOFError:
        return
    sys.path[:] = init["sys_path"]
    try:
        from ..utils.imports import load_function

        fn = load_function(init["function_path"], "reward.function_path")
    except ValueError as e:
        out.send(("init_error", str(e)))
        return
    except BaseException as e:  # a SyntaxError or an exception raised by the module's code
        out.send(
            (
                "init_error",
                f"reward.function_path={init['function_path']!r}: importing it raised {_describe_exception(e)}",
            )
        )
        return
    if inspect.iscoroutinefunction(fn):  # its event loop before the first call's clock starts
        _event_loop()
    out.send(("ready", inspect.iscoroutinefunction(fn)))
    while True:
        try:
            _, batch = inp.recv()
        except EOFError:
            return
        for index, sample in batch:
            out.send(_call(fn, index, sample))


_LOOP: list[Any] = []  # the worker's event loop, made for the first awaitable result


def _event_loop() -> Any:
    if not _LOOP:
        import asyncio

        _LOOP.append(asyncio.new_event_loop())
    return _LOOP[0]


def _call(fn: Any, index: int, sample: Any) -> tuple:
    """``("done", index, "ok", value, reward_info)`` or ``("done", index, "error", message, None)``."""
    import inspect
    import pickle

    value: Any = None
    try:
        value = fn(sample)
        if inspect.isawaitable(value):
            value = _event_loop().run_until_complete(value)
        msg = ("done", index, "ok", value, dict(sample.reward_info))
    except Exception as e:  # noqa: BLE001 - reported as this sample's error
        return ("done", index, "error", _describe_exception(e), None)
    except BaseException as e:  # sys.exit, KeyboardInterrupt raised inside the function
        return ("done", index, "error", f"raised {type(e).__name__}({e})", None)
    try:
        pickle.dumps(msg)
    except Exception as e:  # noqa: BLE001 - an unpicklable result
        return (
            "done",
            index,
            "error",
            f"returned {type(value).__name__}, which cannot be sent back to the trainer ({type(e).__name__}: {e})",
            None,
        )
    return msg


if __name__ == "__main__":
    try:
        worker_main(int(sys.argv[1]), int(sys.argv[2]))
    except (BrokenPipeError, ConnectionError, EOFError):  # the trainer closed the pool or ended: nothing to say
        pass
