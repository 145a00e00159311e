"""Tools for agent rollouts: plain functions with a JSON schema from their signature
(``schema.py``), the shared types (``types.py``: a call, its result, a tool, the error kinds), the
registry and the safe call path (``toolset.py``), tool-call formats (``formats.py``), the built-ins
(``builtin.py``: calculator, python; the python tool runs in :mod:`reinforge.sandbox`) and the tools
of MCP servers (``mcp.py``, ``mcp_client.py``: ``agent.mcp_servers``). See docs/agents.md."""

from .formats import TOOL_CALL_FORMATS, ParsedMessage, ToolCallFormat, get_format
from .schema import ToolArgumentError, check_arguments, function_schema
from .toolset import TOOLS, ToolSet, load_tools
from .types import Tool, ToolCall, ToolError, ToolResult

__all__ = [
    "TOOLS",
    "TOOL_CALL_FORMATS",
    "ParsedMessage",
    "Tool",
    "ToolArgumentError",
    "ToolCall",
    "ToolCallFormat",
    "ToolError",
    "ToolResult",
    "ToolSet",
    "check_arguments",
    "function_schema",
    "get_format",
    "load_tools",
]
