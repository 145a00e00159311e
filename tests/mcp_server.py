"""A small MCP server for tests/integration/test_mcp.py, run over stdio: ``python tests/mcp_server.py``.

Tools: ``add`` and ``echo`` (the two ordinary ones), ``calls`` (how many calls of ``add`` / ``echo``
this process has served), ``pid``, ``crash`` (the process exits at once), ``slow`` (sleeps without
blocking the server) and ``freeze`` (blocks the server's event loop: it answers nothing, pings
included), ``fail`` (raises). ``MCP_TEST_STDERR`` is written to stderr at start;
``MCP_TEST_EXIT_AT_START=1`` makes the process exit before the handshake.
"""

import asyncio
import os
import sys
import time

from mcp.server.mcpserver import MCPServer

app = MCPServer("reinforge-test")
served = 0


@app.tool()
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first.
        b: the second.
    """
    global served
    served += 1
    return a + b


@app.tool()
def echo(text: str, times: int = 1, sep: str | None = None) -> str:
    """Repeat a text."""
    global served
    served += 1
    return (sep or "").join([text] * times)


@app.tool()
def calls() -> int:
    """How many calls of add and echo this process has served."""
    return served


@app.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


@app.tool()
def crash() -> str:
    """Exit the server process at once."""
    os._exit(3)


@app.tool()
async def slow(seconds: float) -> str:
    """Sleep without blocking the server."""
    await asyncio.sleep(seconds)
    return "slept"


@app.tool()
async def freeze(seconds: float) -> str:
    """Block the server's event loop."""
    time.sleep(seconds)
    return "froze"


@app.tool()
def fail(message: str) -> str:
    """Raise an error."""
    from mcp.server.mcpserver.exceptions import ToolError

    raise ToolError(message)


if __name__ == "__main__":
    if os.environ.get("MCP_TEST_STDERR"):
        print(os.environ["MCP_TEST_STDERR"], file=sys.stderr, flush=True)
    if os.environ.get("MCP_TEST_EXIT_AT_START"):
        sys.exit(2)
    app.run()
