"""Where an environment's plain (``def``) methods run: a fresh daemon thread per call, so that a
hung call costs only its own episode.

A worker pool would keep a hung call's thread busy for good: with ``agent.tool_concurrency=1``
every later episode would wait behind it and fail at ``agent.env_timeout``, and the interpreter
would wait for the thread at exit (``concurrent.futures`` joins its workers), keeping the process
alive after the run's summary or a SIGTERM. Here each call gets a thread of its own (daemonic:
never waited for at exit) and one of ``slots`` slots (``agent.tool_concurrency``), taken when the
call starts; a call abandoned at its timeout gives its slot back at once, so the pool re-grows
around a hung call. The timeout starts when the call has its slot (waiting for one is not the
method's time).

:func:`exit_guard` keeps environment code from ending the trainer with ``os._exit``: within an
environment call (the trainer's process, the call's context) ``os._exit(n)`` raises
:class:`EnvironmentExit` instead, which the agent loop turns into that episode's infrastructure
failure naming the method. (A forked child, e.g. a ``multiprocessing`` worker of the
environment, exits as usual; a thread the environment starts itself does not carry the call's
context and is not guarded; a signal such as ``os.kill(os.getpid(), 9)`` cannot be caught.)
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_CALL: contextvars.ContextVar[str | None] = contextvars.ContextVar("reinforge_env_call", default=None)
_real_exit = os._exit
_guard_pid: int | None = None


class EnvironmentExit(BaseException):
    """``os._exit(code)`` (or ``how``: ``sys.exit``) called by environment code (``method``)
    within an environment call."""

    def __init__(self, method: str, code: Any, how: str = "os._exit"):
        super().__init__(f"{method} called {how}({code})")
        self.method, self.code, self.how = method, code, how


def _guarded_exit(code: int) -> None:
    method = _CALL.get()
    if method is not None and os.getpid() == _guard_pid:
        raise EnvironmentExit(method, code)
    _real_exit(code)


def install_exit_guard() -> None:
    """Put the guard on ``os._exit`` for this process (idempotent; module docstring)."""
    global _guard_pid
    _guard_pid = os.getpid()
    os._exit = _guarded_exit  # type: ignore[assignment]


@contextmanager
def exit_guard(method: str) -> Iterator[None]:
    """Within the block (and the threads :class:`EnvThreads` starts from it), ``os._exit`` raises
    :class:`EnvironmentExit` naming ``method``."""
    token = _CALL.set(method)
    try:
        yield
    finally:
        _CALL.reset(token)


class _Call:
    """One call's state, shared by its thread and its caller under the pool's lock."""

    def __init__(self) -> None:
        self.abandoned = False
        self.holding = False  # holds one of the slots


class EnvThreads:
    """Plain environment methods in daemon threads, at most ``slots`` running at once, not
    counting abandoned ones (module docstring).

    Args:
        slots: calls running at once (``agent.tool_concurrency``), >= 1.
    """

    def __init__(self, slots: int):
        if slots < 1:
            raise ValueError(f"agent.tool_concurrency must be >= 1, got {slots}")
        self._slots = threading.Semaphore(slots)
        self._lock = threading.Lock()

    async def call(self, fn: Callable[..., Any], args: tuple[Any, ...], timeout: float) -> Any:
        """``fn(*args)`` in a thread of its own, in a copy of the caller's context; returns what
        it returned, raises what it raised.

        Raises:
            TimeoutError: it did not return within ``timeout`` seconds of getting its slot (the
                thread is abandoned, its slot given back).
        """
        loop = asyncio.get_running_loop()
        started, done = loop.create_future(), loop.create_future()
        call, context = _Call(), contextvars.copy_context()

        def settle(fut: asyncio.Future[Any], result: Any = None, error: BaseException | None = None) -> None:
            def set_it() -> None:
                if fut.done():
                    return
                if error is not None:
                    fut.set_exception(error)
                else:
                    fut.set_result(result)

            try:
                loop.call_soon_threadsafe(set_it)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

        def run() -> None:
            self._slots.acquire()
            with self._lock:
                if call.abandoned:
                    self._slots.release()
                    return
                call.holding = True
            settle(started)
            try:
                out = context.run(fn, *args)
            except BaseException as e:  # noqa: BLE001 - handed to the caller, which classifies it
                settle(done, error=e)
            else:
                settle(done, out)
            finally:
                self._release(call)

        threading.Thread(target=run, name=f"env-{getattr(fn, '__qualname__', 'call')}", daemon=True).start()
        try:
            await started
            return await asyncio.wait_for(done, timeout)
        finally:  # returned, raised, timed out or cancelled: the slot is free for the next call
            with self._lock:
                call.abandoned = True  # a thread still waiting for a slot will not run
            self._release(call)

    def _release(self, call: _Call) -> None:
        with self._lock:
            if call.holding:
                call.holding = False
                self._slots.release()
