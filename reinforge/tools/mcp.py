"""MCP tools: the tools of Model Context Protocol servers (``agent.mcp_servers``), offered to the
model beside the built-in ones. See docs/agents.md#mcp-tools.

Each entry of ``agent.mcp_servers`` names a server the user trusts and how to start it over stdio
(``{name, command, args, env, cwd, tools, prefix, startup_timeout, max_restarts}``;
:func:`parse_server_specs`). :func:`load_mcp_tools` (called by ``load_tools``) lists the servers'
tools and returns them as :class:`~reinforge.tools.toolset.Tool` objects with their JSON schemas
in the ``{"type": "function", "function": {...}}`` layout; the tools share one
:class:`MCPServers`, their ``resource``, which the :class:`~reinforge.tools.toolset.ToolSet` that
takes them starts and closes. Calls go through ``ToolSet.call`` like any tool (arguments checked
against the schema before the server sees them, errors as messages for the model).

The servers run in :mod:`reinforge.tools.mcp_client` (one event-loop thread per ToolSet; restarts,
hangs, error kinds ``mcp_error`` / ``timeout`` / ``mcp_server``). The servers are the user's own
processes (trusted config), not model-written code: they are not sandboxed.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .mcp_client import MCP_ERROR, MCPServers, MCPStartError
from .toolset import Tool

if TYPE_CHECKING:
    from ..config.agent import AgentConfig

__all__ = [
    "MCP_ERROR",
    "MCPServerSpec",
    "MCPServers",
    "MCPStartError",
    "function_schema",
    "load_mcp_tools",
    "parse_server_specs",
    "require_sdk",
    "tool_listings",
]

KEY = "agent.mcp_servers"
OUTPUT_CHARS_PER_TOKEN = 32  # outputs are cut at this many characters per agent.tool_output_max_tokens
_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_PREFIX = re.compile(r"^[A-Za-z0-9_.-]*$")
_FIELDS = ("name", "command", "args", "env", "cwd", "tools", "prefix", "startup_timeout", "max_restarts")


@dataclass
class MCPServerSpec:
    """One entry of ``agent.mcp_servers`` (defaults and meaning in docs/agents.md#mcp-tools)."""

    index: int
    name: str
    command: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    tools: list[str] | None = None
    prefix: str = ""
    startup_timeout: float = 30.0
    max_restarts: int = 3

    @property
    def key(self) -> str:
        return f"{KEY}[{self.index}]"

    @property
    def label(self) -> str:
        return f"{self.key} ({self.name!r})"

    def launch_key(self) -> str:
        """What identifies the process this entry starts (the tool-listing cache's key)."""
        return json.dumps([self.command, self.args, self.env, self.cwd], sort_keys=True)


def parse_server_specs(raw: list[Any]) -> list[MCPServerSpec]:
    """The entries of ``agent.mcp_servers``, checked.

    Raises:
        ValueError: an entry that is not a mapping, an unknown or missing key, a value of the wrong
            type, a ``cwd`` that is not a folder, or two servers with one name (the message names
            ``agent.mcp_servers[i].<key>``).
    """
    if not isinstance(raw, (list, tuple)):
        raise ValueError(f"{KEY}: expected a list of servers ({{name, command, args, ...}}), got {raw!r}")
    specs: list[MCPServerSpec] = []
    for i, entry in enumerate(raw):
        key = f"{KEY}[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{key}: expected a mapping {{name, command, args, env, cwd, ...}}, got {entry!r}")
        unknown = sorted(set(entry) - set(_FIELDS))
        if unknown:
            raise ValueError(f"{key}: unknown key(s) {', '.join(map(repr, unknown))}; known: {', '.join(_FIELDS)}")
        for required in ("name", "command"):
            if not isinstance(entry.get(required), str) or not entry[required].strip():
                raise ValueError(f"{key}.{required}: required, a non-empty string (got {entry.get(required)!r})")
        name = entry["name"]
        if not _NAME.match(name):
            raise ValueError(f"{key}.name: {name!r} may hold only letters, digits, '_' and '-'")
        if any(s.name == name for s in specs):
            raise ValueError(f"{key}.name: another server is already named {name!r}")
        spec = MCPServerSpec(i, name, entry["command"])
        spec.args = _strings(entry.get("args", []), f"{key}.args")
        env = entry.get("env") or {}
        if not isinstance(env, dict):
            raise ValueError(f"{key}.env: expected a mapping of variable names to strings, got {env!r}")
        for k, v in env.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise ValueError(f"{key}.env.{k}: expected a string, got {v!r} (quote it in YAML)")
        spec.env = dict(env)
        cwd = entry.get("cwd")
        if cwd is not None and (not isinstance(cwd, str) or not os.path.isdir(cwd)):
            raise ValueError(f"{key}.cwd: {cwd!r} is not a folder")
        spec.cwd = cwd
        if entry.get("tools") is not None:
            spec.tools = _strings(entry["tools"], f"{key}.tools")
        prefix = entry.get("prefix", "")
        if not isinstance(prefix, str) or not _PREFIX.match(prefix):
            raise ValueError(f"{key}.prefix: {prefix!r} may hold only letters, digits, '_', '.' and '-'")
        spec.prefix = prefix
        timeout = entry.get("startup_timeout", spec.startup_timeout)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
            raise ValueError(f"{key}.startup_timeout: expected a number of seconds > 0, got {timeout!r}")
        spec.startup_timeout = float(timeout)
        restarts = entry.get("max_restarts", spec.max_restarts)
        if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
            raise ValueError(f"{key}.max_restarts: expected an integer >= 0, got {restarts!r}")
        spec.max_restarts = restarts
        specs.append(spec)
    return specs


def _strings(value: Any, key: str) -> list[str]:
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{key}: expected a list of strings, got {value!r}")
    for j, v in enumerate(value):
        if not isinstance(v, str):
            raise ValueError(f"{key}[{j}]: expected a string, got {v!r} (quote it in YAML)")
    return list(value)


def require_sdk() -> None:
    """Raises ValueError naming ``agent.mcp_servers`` when the ``mcp`` SDK (2.x) is not installed."""
    try:
        from mcp import ClientSession, stdio_client  # noqa: F401
    except ImportError as e:
        raise ValueError(f"{KEY} needs the MCP SDK (mcp>=2): pip install 'reinforge[mcp]' ({e})") from None


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
                    function_schema(exposed, offered[name]),
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


def function_schema(name: str, tool: dict[str, Any]) -> dict[str, Any]:
    """The function-calling schema of an MCP tool under ``name``: its description and its input
    schema, with JSON-Schema ``title`` keys dropped and ``null`` alternatives (``type: [T, null]``,
    ``anyOf: [{T}, {type: null}]``) written as ``nullable``, as :mod:`reinforge.tools.schema` does."""
    params = _clean(dict(tool.get("input_schema") or {}))
    params["type"] = "object"
    params.setdefault("properties", {})
    return {
        "type": "function",
        "function": {"name": name, "description": (tool.get("description") or "").strip(), "parameters": params},
    }


def _clean(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return schema
    out = {k: v for k, v in schema.items() if k != "title"}
    kind = out.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        if len(kinds) < len(kind):
            out["nullable"] = True
        if len(kinds) == 1:
            out["type"] = kinds[0]
        else:  # several types: an anyOf, which the argument check leaves to the server
            del out["type"]
            out["anyOf"] = [{"type": k} for k in kinds]
    options = out.get("anyOf")
    if isinstance(options, list):
        rest = [o for o in options if o != {"type": "null"}]
        if len(rest) < len(options):
            out["nullable"] = True
            if len(rest) == 1 and isinstance(rest[0], dict):
                del out["anyOf"]
                out = {**_clean(rest[0]), **out}
            else:
                out["anyOf"] = rest
        if "anyOf" in out:
            out["anyOf"] = [_clean(o) for o in out["anyOf"]]
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: _clean(v) for k, v in out["properties"].items()}
    if "items" in out:
        out["items"] = _clean(out["items"])
    return out
