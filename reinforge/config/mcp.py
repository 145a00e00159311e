"""The entries of ``agent.mcp_servers`` (docs/agents.md#mcp-tools), read and checked: :class:`MCPServerSpec`,
:func:`parse_server_specs`, and :func:`require_sdk` (the MCP SDK is installed). The config checks them
at load (``AgentConfig.check``); :mod:`reinforge.tools.mcp` starts the servers they name."""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

KEY = "agent.mcp_servers"
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
