"""MCP tools: the tools of Model Context Protocol servers (``agent.mcp_servers``), offered to the
model beside the built-in ones. See docs/agents.md#mcp-tools.

Each entry of ``agent.mcp_servers`` names a server the user trusts and how to start it over stdio
(``{name, command, args, env, cwd, tools, prefix, startup_timeout, max_restarts}``;
:func:`reinforge.config.mcp.parse_server_specs`). :func:`load_mcp_tools` (called by ``load_tools``) lists the servers'
tools and returns them as :class:`~reinforge.tools.types.Tool` objects with their JSON schemas
in the ``{"type": "function", "function": {...}}`` layout; the tools share one
:class:`MCPServers`, their ``resource``, which the :class:`~reinforge.tools.toolset.ToolSet` that
takes them starts and closes. Calls go through ``ToolSet.call`` like any tool (arguments checked
against the schema before the server sees them, errors as messages for the model).

The servers run in :mod:`reinforge.tools.mcp_client` (one event-loop thread per ToolSet; restarts,
hangs, error kinds ``mcp_error`` / ``timeout`` / ``mcp_server``). The servers are the user's own
processes (trusted config), not model-written code: they are not sandboxed.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ..config.mcp import MCPServerSpec, parse_server_specs, require_sdk
from .mcp_client import MCP_ERROR, MCPServers, MCPStartError
from .schema import function_schema
from .types import Tool

if TYPE_CHECKING:
    from ..config.agent import AgentConfig

__all__ = [
    "MCP_ERROR",
    "MCPServerSpec",
    "MCPServers",
    "MCPStartError",
    "load_mcp_tools",
    "parse_server_specs",
    "require_sdk",
    "tool_listings",
]

OUTPUT_CHARS_PER_TOKEN = 32  # outputs are cut at this many characters per agent.tool_output_max_tokens


# ---------------------------------------------------------------------------------------------- tools


def load_mcp_tools(agent: AgentConfig, taken: dict[str, str] | None = None) -> list[Tool]:
    """The tools of ``agent.mcp_servers`` (all of a server's tools, or those of its ``tools``),
    named ``prefix + tool name``. The tool lists are read by starting each server once (then
    stopped) and kept for the process, so the prompts and the run's ToolSet see the same lists;
    the servers the tools call start when a ToolSet takes them.

    Args:
        agent: the ``agent`` section (``mcp_servers``, ``tool_timeout``, ``tool_output_max_tokens``).
        taken: tool names already in use, mapped to what owns them (e.g. ``agent.tools[0]``).

    Raises:
        ValueError: a bad entry, the SDK missing, or a name that clashes with another tool.
        MCPStartError: a server that does not start, or lacks a tool named in its ``tools``.
    """
    specs = parse_server_specs(agent.mcp_servers)
    if not specs:
        return []
    require_sdk()
    hub = MCPServers(specs, agent.tool_timeout, OUTPUT_CHARS_PER_TOKEN * agent.tool_output_max_tokens)
    owners = dict(taken or {})
    tools: list[Tool] = []
    for spec, listing in zip(specs, tool_listings(specs)):
        offered = {t["name"]: t for t in listing}
        for name in spec.tools if spec.tools is not None else offered:
            if name not in offered:
                raise MCPStartError(
                    f"{spec.key}.tools: the server {spec.name!r} has no tool {name!r}; it offers "
                    f"{', '.join(offered) or 'none'}"
                )
            exposed = spec.prefix + name
            if exposed in owners:
                raise ValueError(
                    f"{spec.key}: the tool {exposed!r} of server {spec.name!r} clashes with the one of "
                    f"{owners[exposed]}; set {spec.key}.prefix (e.g. '{spec.name}_') or list the tools "
                    f"to offer in {spec.key}.tools"
                )
            owners[exposed] = spec.label
            tools.append(
                Tool(
                    exposed,
                    hub.tool_function(spec.index, name, exposed),
                    function_schema(offered[name], exposed),
                    resource=hub,
                )
            )
    return tools


_LISTINGS: dict[str, list[dict[str, Any]]] = {}
_LISTINGS_LOCK = threading.Lock()


def tool_listings(specs: list[MCPServerSpec]) -> list[list[dict[str, Any]]]:
    """Each server's tools (``{name, description, input_schema}``), read once per process per
    launch command: the servers not read yet are started together, listed and stopped.

    Raises:
        MCPStartError: a server that does not start (the message names its entry).
    """
    with _LISTINGS_LOCK:
        todo = [s for s in specs if s.launch_key() not in _LISTINGS]
        if todo:
            probe = MCPServers(todo, call_timeout=1.0, max_output_chars=1)
            probe.start()
            try:
                for spec, server in zip(todo, probe.servers):
                    _LISTINGS[spec.launch_key()] = server.listing
            finally:
                probe.close()
        return [_LISTINGS[s.launch_key()] for s in specs]
