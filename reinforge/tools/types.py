"""The types every part of ``tools`` shares, and that environments and the agent loop use: a call the
model made (:class:`ToolCall`), its outcome (:class:`ToolResult`), a tool (:class:`Tool`), the error
a tool raises (:class:`ToolError`) and the error kinds of a result (``ToolResult.error``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .schema import function_schema

# Error kinds (ToolResult.error); tools may raise ToolError with their own.
PARSE, UNKNOWN_TOOL, BAD_ARGUMENTS = "parse", "unknown_tool", "bad_arguments"
EXCEPTION, TIMEOUT = "exception", "timeout"
SANDBOX_FAILURE = "sandbox"  # the sandbox itself failed (infrastructure, not the model's doing)
MCP_SERVER = "mcp_server"  # an MCP server stopped, hangs or is down (infrastructure, not the model's doing)


class ToolError(Exception):
    """Raised by a tool for a failure it classifies itself (``kind``, e.g. ``"network"``); the
    message is what the model sees."""

    def __init__(self, message: str, kind: str = EXCEPTION):
        super().__init__(message)
        self.kind = kind


@dataclass
class ToolCall:
    """A call the model made: the tool's name and its decoded JSON arguments."""

    name: str
    arguments: Any = field(default_factory=dict)


@dataclass
class ToolResult:
    """A call's outcome: ``output`` (shown to the model; an error message when it failed),
    ``error`` (None, or the kind: ``parse``, ``unknown_tool``, ``bad_arguments``, ``exception``,
    ``timeout``, ``sandbox`` (infrastructure), or a tool's own ``ToolError.kind``), and wall-clock
    ``seconds``."""

    name: str | None
    output: str
    error: str | None = None
    seconds: float = 0.0
    arguments: Any = None  # the call's arguments as the model wrote them (None for a call that did not parse)

    @classmethod
    def failure(
        cls, name: str | None, kind: str, message: str, seconds: float = 0.0, arguments: Any = None
    ) -> ToolResult:
        return cls(name, f"Error: {message}", kind, seconds, arguments)


@dataclass
class Tool:
    """A callable with its function-calling schema (``{"type": "function", "function": {...}}``).

    ``resource``: what the tool needs running (the MCP servers of :mod:`reinforge.tools.mcp`), an
    object with ``start()`` and ``close()``, shared by several tools; the :class:`ToolSet` that takes
    the tool starts it and closes it with itself.
    """

    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]
    resource: Any = None

    @classmethod
    def from_function(cls, fn: Callable[..., Any], name: str | None = None) -> Tool:
        """Raises TypeError: the signature has no JSON schema (see ``function_schema``)."""
        schema = function_schema(fn, name)
        return cls(schema["function"]["name"], fn, schema)
