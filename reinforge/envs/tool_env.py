"""``ToolEnv``: the environment of a plain tool-calling agent (``agent.environment: tools``).

Each turn's calls run through the run's :class:`~reinforge.tools.ToolSet` (``agent.tools``),
concurrently; their outputs, and a message for each call that could not be parsed, come back as
``tool`` messages. A turn without any call is the final answer (``done``). It holds no state and
gives no reward: the configured reward scores the answer.
"""

from __future__ import annotations

import asyncio

from ..tools import ToolResult
from ..tools.types import PARSE
from .base import Environment, Step, Turn


class ToolEnv(Environment):
    """Tools only (module docstring)."""

    async def step(self, turn: Turn) -> Step:
        if turn.is_final:
            return Step(done=True)
        results = [ToolResult.failure(None, PARSE, e) for e in turn.errors]
        results += await asyncio.gather(*(self.ctx.tools.call(c) for c in turn.calls))
        messages = [{"role": "tool", "name": r.name or "", "content": r.output} for r in results]
        return Step(messages=messages, tool_results=results)
