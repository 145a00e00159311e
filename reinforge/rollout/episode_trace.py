"""One agent episode turn by turn in the run's trace (``run.trace``; docs/agents.md#an-episode-in-the-trace).

The agent loop runs many episodes as coroutines of one thread, so their phases would overlap on
that thread's track; a traced episode gets a track of its own instead, ``episode <k>`` for the
rollout's sample ``k`` (``k < agent.trace_episodes``; the episodes of successive rollouts follow
one another on it). Its spans, nested::

    episode                     the whole episode (args: sample, group, status, reward, turns)
      env.reset                 the environment made and env.reset()
      turn                      one model turn and the environment's answer (args: index)
        model.generate          the engine's generation of the turn (args: tokens, finish, last_token)
        env.step                env.step(turn) (args: env, calls, reward, done)
          tool <name>           each tool call of the step, from the step's start for its
                                ``ToolResult.seconds`` (calls of a step run concurrently; args: error)
        observation             the observation's tokens rendered (args: tokens)
      env.reward                env.reward()
      env.close                 env.close()

Spans are collected in memory while the episode runs and written when it ends, so an episode
that is not traced costs one comparison. With no trace open nothing is collected.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from ..utils import trace

TRACK_BASE = 1_000_000_000
"""Track ids of episode tracks (``TRACK_BASE + k``): far above any thread id, which the other tracks use."""


def _writer() -> Any:
    """The process's open trace recorder (``write`` and ``now_us``), or None."""
    return getattr(trace, "_writer", None) if trace.active() else None


def span(tr: EpisodeTrace | None, name: str, **args: Any) -> AbstractContextManager[dict[str, Any]]:
    """``tr.span(name, **args)``, or a block that records nothing when ``tr`` is None."""
    return tr.span(name, **args) if tr is not None else nullcontext(args)


class EpisodeTrace:
    """The spans of one episode (module docstring), written by :meth:`flush` on track ``slot``."""

    def __init__(self, slot: int):
        self.slot = slot
        self.spans: list[tuple[str, int, int, dict[str, Any]]] = []

    @classmethod
    def maybe(cls, sample_index: int, episodes: int) -> EpisodeTrace | None:
        """A trace for sample ``sample_index`` of its rollout when it is among the first ``episodes``
        and a trace is open, else None."""
        if sample_index >= episodes or _writer() is None:
            return None
        return cls(sample_index)

    @contextmanager
    def span(self, name: str, **args: Any) -> Iterator[dict[str, Any]]:
        """Time the block as span ``name``; the yielded dict is its args (may be added to)."""
        start = time.perf_counter_ns()
        try:
            yield args
        except BaseException as e:
            args["error"] = type(e).__name__
            raise
        finally:
            self.spans.append((name, start, time.perf_counter_ns(), args))

    def add(self, name: str, start_ns: int, end_ns: int, **args: Any) -> None:
        """A span from two ``time.perf_counter_ns`` readings."""
        self.spans.append((name, start_ns, max(end_ns, start_ns), args))

    def flush(self) -> int:
        """Write the spans to the open trace on this episode's track; returns how many."""
        writer = _writer()
        if writer is None or not self.spans:
            return 0
        tid = TRACK_BASE + self.slot
        writer.write({"ph": "M", "name": "thread_name", "tid": tid, "args": {"name": f"episode {self.slot}"}})
        writer.write({"ph": "M", "name": "thread_sort_index", "tid": tid, "args": {"sort_index": 2 + self.slot}})
        for name, start, end, args in sorted(self.spans, key=lambda s: (s[1], -s[2])):
            event = {
                "ph": "X",
                "name": name,
                "cat": "agent",
                "ts": round(writer.now_us(start), 3),
                "dur": round((end - start) / 1000.0, 3),
                "tid": tid,
            }
            if args:
                event["args"] = args
            writer.write(event)
        n, self.spans = len(self.spans), []
        return n
