"""Tools the policy may call: loading them from the config and running one call safely.

A tool is a plain Python function (sync or ``async``) with type hints and a Google-style
docstring; its JSON schema is derived from them (:mod:`reinforge.tools.schema`). The config
names tools in ``agent.tools``, either by a name registered in :data:`TOOLS` (the built-ins:
``calculator``, ``python``) or by a ``module:function`` path; ``agent.mcp_servers`` adds the tools
of MCP servers (:mod:`reinforge.tools.mcp`).

:meth:`ToolSet.call` never raises for anything the model or the tool does: an unknown tool, bad
arguments, an exception, a call past ``agent.tool_timeout``, a sandboxed program that tries the
network... each becomes a :class:`ToolResult` whose ``output`` is an error message for the model
and whose ``error`` names the kind (counted in the rollout metrics).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ..utils.imports import load_function
from ..utils.registry import Registry, did_you_mean
from .mcp import load_mcp_tools
from .schema import ToolArgumentError, check_arguments
from .types import BAD_ARGUMENTS, EXCEPTION, TIMEOUT, UNKNOWN_TOOL, Tool, ToolCall, ToolError, ToolResult

if TYPE_CHECKING:
    from ..config.agent import AgentConfig
    from ..sandbox import Sandboxes

TOOLS: Registry[Callable[..., Any]] = Registry("tool", "agent.tools")
"""Tools by name. A target registered with ``factory=True`` is called with the ``agent`` config
section and the run's :class:`~reinforge.sandbox.Sandboxes` (or None) and returns the tool function
(tools with configurable limits, e.g. ``python``)."""
TOOLS.register("calculator", "reinforge.tools.builtin:calculator")
TOOLS.register("python", "reinforge.tools.builtin:make_python", factory=True)


def load_tools(names: list[str], agent: AgentConfig | None = None, sandboxes: Sandboxes | None = None) -> list[Tool]:
    """The tools of ``agent.tools``: registered names or ``module:function`` paths; then, when
    ``agent`` is given, those of its ``mcp_servers`` (each server started once to read its tool
    list; the servers the tools call start when a :class:`ToolSet` takes them). ``sandboxes``: the
    run's, handed to the tool factories (the ``python`` tool); None: each makes its own.

    Raises:
        ValueError: an unknown name, a path that does not import, two tools with one name, or a
            function without a usable schema (the message names ``agent.tools``); an MCP server
            that does not start or whose tools clash (``MCPStartError``, naming
            ``agent.mcp_servers[i]``).
    """
    tools: list[Tool] = []
    for i, spec in enumerate(names):
        key = f"agent.tools[{i}]"
        if ":" in spec:
            fn = load_function(spec, key)
        else:
            if spec not in TOOLS:
                raise ValueError(
                    f"{key}: unknown tool {spec!r}{did_you_mean(spec, TOOLS.names())}; registered: "
                    f"{', '.join(TOOLS.names())} (or give a "
                    f"'module:function' path)"
                )
            entry = TOOLS.entry(spec)
            fn = entry.load()
            if entry.info.get("factory"):
                fn = fn(agent, sandboxes)
        try:
            tool = Tool.from_function(fn)
        except TypeError as e:
            raise ValueError(f"{key}={spec!r}: {e}") from None
        if any(t.name == tool.name for t in tools):
            raise ValueError(f"{key}={spec!r}: a tool named {tool.name!r} is already loaded")
        tools.append(tool)
    if agent is not None and getattr(agent, "mcp_servers", None):
        tools += load_mcp_tools(agent, {t.name: f"agent.tools[{i}]" for i, t in enumerate(tools)})
    return tools


class ToolSet:
    """Named tools and how to run a call: arguments checked against the schema, plain functions
    in a thread pool of ``max_workers``, every call bounded by ``timeout`` seconds.

    A plain function past its timeout keeps its worker thread until it returns (Python cannot
    stop a thread); ``async`` tools are cancelled (the ``python`` tool kills its process). A tool
    function with the attribute ``self_timed = True`` bounds its own time (the ``python`` tool:
    waiting for a sandbox slot is not the model's time) and is not cut at ``timeout``.

    The tools' resources (``Tool.resource``: MCP servers) start here and stop at :meth:`close`.

    Raises:
        Exception: what a resource's ``start()`` raises (e.g. ``MCPStartError``); those already
            started are closed again.
    """

    def __init__(self, tools: list[Tool], timeout: float = 10.0, max_workers: int = 8):
        self.tools = {t.name: t for t in tools}
        self.timeout = timeout
        self._resources: list[Any] = []
        for r in {id(t.resource): t.resource for t in tools if t.resource is not None}.values():
            try:
                r.start()
            except BaseException:
                self.close()
                raise
            self._resources.append(r)
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="tool")

    @classmethod
    def from_config(cls, agent: AgentConfig, sandboxes: Sandboxes | None = None) -> ToolSet:
        """The tools of the ``agent`` section, their sandboxed programs run in ``sandboxes`` (the run's)."""
        return cls(load_tools(agent.tools, agent, sandboxes), agent.tool_timeout, agent.tool_concurrency)

    @property
    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema for t in self.tools.values()]

    async def call(self, call: ToolCall) -> ToolResult:
        """Run one call; never raises (failures are results with ``error`` set); the result carries
        the call's ``arguments``."""
        result = await self._call(call)
        result.arguments = call.arguments
        return result

    async def _call(self, call: ToolCall) -> ToolResult:
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(self.tools) or "none"
            return ToolResult.failure(call.name, UNKNOWN_TOOL, f"unknown tool {call.name!r}; available tools: {known}")
        try:
            args = check_arguments(tool.schema, call.arguments)
        except ToolArgumentError as e:
            return ToolResult.failure(call.name, BAD_ARGUMENTS, f"bad arguments for {call.name}: {e}")
        start = time.perf_counter()
        try:
            if inspect.iscoroutinefunction(tool.fn):
                timeout = None if getattr(tool.fn, "self_timed", False) else self.timeout
                out = await asyncio.wait_for(tool.fn(**args), timeout)
            else:
                loop, context = asyncio.get_running_loop(), contextvars.copy_context()  # the episode's (sandbox runs)
                out = await asyncio.wait_for(
                    loop.run_in_executor(self._pool, context.run, lambda: tool.fn(**args)), self.timeout
                )
        except TimeoutError:
            return ToolResult.failure(
                call.name, TIMEOUT, f"{call.name} did not finish within {self.timeout:g} s", time.perf_counter() - start
            )
        except ToolError as e:
            return ToolResult.failure(call.name, e.kind, str(e), time.perf_counter() - start)
        except Exception as e:  # a tool's bug must not end the rollout
            return ToolResult.failure(
                call.name, EXCEPTION, f"{call.name} raised {type(e).__name__}: {e}", time.perf_counter() - start
            )
        return ToolResult(call.name, out if isinstance(out, str) else _to_text(out), None, time.perf_counter() - start)

    def close(self) -> None:
        """Stop the tools' resources (MCP servers) and the thread pool; safe to call twice."""
        resources, self._resources = self._resources, []
        for r in resources:
            r.close()
        if hasattr(self, "_pool"):
            self._pool.shutdown(wait=False, cancel_futures=True)


def _to_text(value: Any) -> str:
    import json

    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)
