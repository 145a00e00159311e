"""The client side of MCP tools (:mod:`reinforge.tools.mcp`): :class:`MCPServers` runs the servers
of one ToolSet, each a stdio client session of the ``mcp`` SDK (2.x), on an event-loop thread of its
own; calls from the rollouts' event loops reach it through ``asyncio.run_coroutine_threadsafe``.

A server's life: started (the handshake and the tool list within ``startup_timeout``), then
supervised. When its process exits (its stdout closes: noticed at once, also between calls) or it
hangs (a call timed out and a ping got no answer within ``agent.tool_timeout`` either), it is stopped
(stdin closed, then SIGTERM and SIGKILL to its process group, by the SDK) and started again, at
most ``max_restarts`` times over the run; after that it is down and its tools answer with an error.
Calls that arrive during a restart wait for it (not counted in their time). Error kinds:
``mcp_error`` (the tool reported an error or the server answered one; the server is fine: the
model's), ``timeout`` (the call ran past ``agent.tool_timeout`` while the server still answers a
ping: the tool was slow on the model's arguments), ``mcp_server`` (the server stopped during the
call, hangs, did not come back in time, or is down: infrastructure, not the model's doing; the agent
loop fails the episode, ``reinforge.rollout.agent``).
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import json
import logging
import os
import threading
from typing import TYPE_CHECKING, Any

from .types import MCP_SERVER, TIMEOUT, ToolError

if TYPE_CHECKING:
    from ..config.mcp import MCPServerSpec

logger = logging.getLogger("reinforge.tools.mcp")
try:
    _GROUP: Any = builtins.BaseExceptionGroup  # type: ignore[attr-defined]
except AttributeError:  # Python 3.10: anyio's backport
    from exceptiongroup import BaseExceptionGroup as _GROUP

MCP_ERROR = "mcp_error"  # the tool or the server reported an error (the server is fine)
STOP_GRACE = 10.0  # seconds the SDK may take to stop a server (stdin closed, SIGTERM, SIGKILL)


class MCPStartError(ValueError):
    """A server that could not be started, or whose tools do not fit the config; the message
    names its entry (``agent.mcp_servers[i]``)."""


def result_text(result: Any, max_chars: int) -> tuple[str, bool]:
    """``(text, is_error)`` of a ``CallToolResult``: its text blocks (an embedded text resource's
    text; a placeholder for images, audio, blobs and links), else its structured content as JSON;
    cut at ``max_chars``."""
    parts: list[str] = []
    for block in result.content or []:
        kind = getattr(block, "type", None)
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {block.mime_type}]")
        elif kind == "resource":
            res = block.resource
            text = getattr(res, "text", None)
            parts.append(text if text is not None else f"[resource: {res.uri} ({res.mime_type or 'binary'})]")
        elif kind == "resource_link":
            parts.append(f"[resource: {block.uri}]")
    text = "\n".join(parts)
    if not parts and result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False, default=str)
    return text[:max_chars], bool(result.is_error)


class MCPServers:
    """The MCP servers of one ToolSet: each a stdio client session, all on one event-loop thread.

    :meth:`start` starts them (the ToolSet that takes their tools calls it), :meth:`close` stops
    them; :meth:`tool_function` makes the ``async`` function of one tool. The function bounds its
    own time (``self_timed``): waiting for a server that is restarting is not the model's time;
    the call itself is cut at ``call_timeout``.
    """

    def __init__(self, specs: list[MCPServerSpec], call_timeout: float, max_output_chars: int):
        self.servers = [_Server(s, self) for s in specs]
        self.call_timeout = call_timeout
        self.max_output_chars = max_output_chars
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._index = {s.index: server for s, server in zip(specs, self.servers)}

    def start(self) -> None:
        """Start every server and read its tools.

        Raises:
            RuntimeError: started twice.
            MCPStartError: a server that did not start (the others are stopped again).
        """
        if self.loop is not None or self._closed:
            raise RuntimeError("MCPServers.start: already started")
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="mcp-servers", daemon=True)
        self._thread.start()
        limit = max(s.spec.startup_timeout for s in self.servers) + 2 * STOP_GRACE
        try:
            asyncio.run_coroutine_threadsafe(self._start_all(), self.loop).result(limit)
        except BaseException:
            self.close()
            raise

    async def _start_all(self) -> None:
        results = await asyncio.gather(*(s.start() for s in self.servers), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r

    def tool_function(self, index: int, tool: str, exposed: str) -> Any:
        """The ``async`` function the ToolSet calls for ``tool`` of the server of ``agent.mcp_servers[index]``."""

        async def call(**arguments: Any) -> str:
            return await self.call(index, tool, exposed, arguments)

        call.__name__ = exposed
        call.self_timed = True  # type: ignore[attr-defined]
        return call

    async def call(self, index: int, tool: str, exposed: str, arguments: dict[str, Any]) -> str:
        """Call ``tool`` from any event loop.

        Raises:
            ToolError: kinds ``mcp_error``, ``timeout``, ``mcp_server`` (module docstring).
        """
        server = self._index[index]
        loop = self.loop
        gone = ToolError(f"{exposed} is unavailable: its MCP server {server.spec.name!r} is not running", MCP_SERVER)
        if loop is None or self._closed:
            raise gone
        future = asyncio.run_coroutine_threadsafe(server.call(tool, exposed, arguments), loop)
        # every wait inside is bounded (the call, then a ping); this bound only guards against a loop stopped under it
        bound = server.spec.startup_timeout + 2 * STOP_GRACE + 2 * self.call_timeout
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), bound)
        except asyncio.TimeoutError:
            future.cancel()
            raise gone from None
        except asyncio.CancelledError:
            if self._closed and future.cancelled():  # closed during the call, not the caller cancelled
                raise gone from None
            raise

    def close(self) -> None:
        """Stop every server (stdin closed, then SIGTERM / SIGKILL to its process group by the SDK)
        and the event-loop thread; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        loop, thread = self.loop, self._thread
        if loop is None or thread is None:
            return
        if loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(self._close_all(), loop).result(STOP_GRACE + 5)
            except Exception as e:  # noqa: BLE001 - closing must not raise
                logger.warning("MCP servers did not stop cleanly: %s", e)
            loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        if not thread.is_alive():
            loop.close()

    async def _close_all(self) -> None:
        await asyncio.gather(*(s.stop() for s in self.servers), return_exceptions=True)
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in rest:
            t.cancel()
        await asyncio.gather(*rest, return_exceptions=True)


class _Server:
    """One server over the run, on the MCPServers loop: a supervisor task runs the process and
    its session, and restarts it when it stopped (at most ``max_restarts`` times)."""

    def __init__(self, spec: MCPServerSpec, hub: MCPServers):
        self.spec = spec
        self.hub = hub
        self.listing: list[dict[str, Any]] = []
        self.state = "new"  # new, up, restarting, failed (did not start), down (restarts used up), closed
        self.restarts = 0
        self._ready: asyncio.Future[Any] | None = None  # the live session, or None when failed / down
        self._stop: asyncio.Event | None = None
        self._reason = ""
        self._error = ""
        self._runner: asyncio.Task[None] | None = None
        self._probe: asyncio.Task[bool] | None = None  # the ping after a call timed out
        self._closing = False
        self._stderr: _StderrTail | None = None

    # lifetime
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        self._runner = loop.create_task(self._supervise())
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), self.spec.startup_timeout + STOP_GRACE)
        except asyncio.TimeoutError:
            self._error = f"no answer within {self.spec.startup_timeout:g} s"
        if self.state != "up":
            raise MCPStartError(f"{self.spec.label}: could not start `{self._command()}`: {self._error}")

    async def stop(self) -> None:
        self._closing = True
        self.state = "closed"
        if self._stop is not None:
            self._stop.set()
        if self._runner is not None:
            try:
                await asyncio.wait_for(self._runner, STOP_GRACE)
            except (asyncio.TimeoutError, asyncio.CancelledError, Exception):  # noqa: BLE001
                pass

    async def _supervise(self) -> None:
        loop = asyncio.get_running_loop()
        came_up = False
        while True:
            self._stop = stop = asyncio.Event()
            self._reason = ""
            try:
                await self._run_once(stop)
                reason = self._reason or "its connection closed"
            except Exception as e:  # noqa: BLE001 - any failure of the process or the session
                reason = _describe(e, self.spec.startup_timeout)
            if self._closing:
                return
            came_up = came_up or self.state in ("up", "restarting")
            if self._ready is None or self._ready.done():
                self._ready = loop.create_future()  # calls from now on wait for the restart
            reason += await self._stderr_tail()
            if self._closing:
                return
            if not came_up:
                self.state, self._error = "failed", reason
                self._ready.set_result(None)
                return
            if self.restarts >= self.spec.max_restarts:
                self.state = "down"
                self._error = (
                    f"it stopped {self.restarts + 1} times ({self.spec.key}.max_restarts={self.spec.max_restarts})"
                )
                logger.error(
                    "MCP server %s stopped (%s) and is not restarted again: its tools answer with an "
                    "error for the rest of the run",
                    self.spec.label,
                    reason,
                )
                self._ready.set_result(None)
                return
            self.restarts += 1
            self.state = "restarting"
            logger.warning(
                "MCP server %s stopped (%s); restart %d of at most %d",
                self.spec.label,
                reason,
                self.restarts,
                self.spec.max_restarts,
            )

    async def _run_once(self, stop: asyncio.Event) -> None:
        from mcp import ClientSession, StdioServerParameters, stdio_client

        spec = self.spec
        self._stderr = stderr = _StderrTail(spec.name)
        params = StdioServerParameters(command=spec.command, args=spec.args, env=spec.env or None, cwd=spec.cwd)
        try:
            async with stdio_client(params, errlog=stderr.file) as (read, write):
                stderr.close_writer()
                read = _EndWatch(read, lambda: self._died(stop, "its process exited (the connection closed)"))
                async with ClientSession(read, write) as session:
                    await asyncio.wait_for(self._handshake(session), spec.startup_timeout)
                    if self._closing:
                        return
                    self.state = "up"
                    assert self._ready is not None
                    if self._ready.done():
                        self._ready = asyncio.get_running_loop().create_future()
                    self._ready.set_result(session)
                    await stop.wait()
        finally:
            stderr.close_writer()

    async def _handshake(self, session: Any) -> None:
        from mcp.types import PaginatedRequestParams

        await session.initialize()
        page = await session.list_tools()
        tools = list(page.tools)
        for _ in range(100):
            if not page.next_cursor:
                break
            page = await session.list_tools(params=PaginatedRequestParams(cursor=page.next_cursor))
            tools += page.tools
        listing = [
            {"name": t.name, "description": t.description or t.title or "", "input_schema": dict(t.input_schema or {})}
            for t in tools
        ]
        if self.listing and {t["name"] for t in listing} != {t["name"] for t in self.listing}:
            logger.warning(
                "MCP server %s now offers %s (was: %s)",
                self.spec.label,
                ", ".join(t["name"] for t in listing),
                ", ".join(t["name"] for t in self.listing),
            )
        self.listing = listing

    # calls
    async def call(self, tool: str, exposed: str, arguments: dict[str, Any]) -> str:
        from mcp import MCPError

        session = await self._session(exposed)
        stop = self._stop
        timeout = self.hub.call_timeout
        try:
            result = await asyncio.wait_for(session.call_tool(tool, arguments), timeout)
        except asyncio.TimeoutError:
            if await self._hangs(session, stop):  # the server, not the call: infrastructure
                raise ToolError(
                    f"{exposed} did not finish within {timeout:g} s and its MCP server {self.spec.name!r} did not "
                    f"answer a ping within {timeout:g} s either: it hangs (restarted)",
                    MCP_SERVER,
                ) from None
            raise ToolError(f"{exposed} did not finish within {timeout:g} s", TIMEOUT) from None
        except Exception as e:  # noqa: BLE001 - sorted below: a dead server, an error answer, a client failure
            if _disconnected(e):
                self._died(stop, f"its connection closed during a call of {tool}")
                raise ToolError(
                    f"{exposed} failed: its MCP server {self.spec.name!r} stopped during the call", MCP_SERVER
                ) from None
            message = e.message if isinstance(e, MCPError) else f"{type(e).__name__}: {e}"
            raise ToolError(f"{exposed}: the MCP server answered with an error: {message}", MCP_ERROR) from None
        text, is_error = result_text(result, self.hub.max_output_chars)
        if is_error:
            raise ToolError(text or f"{exposed} reported an error", MCP_ERROR)
        return text

    async def _session(self, exposed: str) -> Any:
        """The live session; waits for a restart in progress (not counted in the call's time)."""
        ready = self._ready
        if ready is not None and not ready.done():
            try:
                await asyncio.wait_for(asyncio.shield(ready), self.spec.startup_timeout + STOP_GRACE)
            except asyncio.TimeoutError:
                pass
        session = ready.result() if ready is not None and ready.done() else None
        if session is None:
            if self.state == "restarting":
                why = "is restarting and did not come back in time"
            else:
                why = f"is down: {self._error}" if self._error else "is not running"
            raise ToolError(f"{exposed} is unavailable: its MCP server {self.spec.name!r} {why}", MCP_SERVER)
        return session

    def _died(self, stop: asyncio.Event | None, reason: str) -> None:
        """Mark the session of ``stop`` dead (once): the supervisor stops its process and restarts."""
        if stop is None or stop is not self._stop or stop.is_set() or self.state != "up":
            return
        self._reason = reason
        self.state = "restarting"
        if self._ready is not None and self._ready.done():
            self._ready = asyncio.get_running_loop().create_future()
        stop.set()

    async def _hangs(self, session: Any, stop: asyncio.Event | None) -> bool:
        """After a call timed out: whether the server hangs. It is pinged (one ping at a time, shared by
        the calls that timed out meanwhile); no answer within the call timeout means it hangs, and it is
        marked dead (restarted). A server already stopped or restarting meanwhile counts as hanging too."""
        if stop is not self._stop or self.state != "up":
            return True
        probe = self._probe
        if probe is None or probe.done():
            probe = self._probe = asyncio.get_running_loop().create_task(self._ping(session, stop))
        return await asyncio.shield(probe)

    async def _ping(self, session: Any, stop: asyncio.Event | None) -> bool:
        timeout = self.hub.call_timeout
        try:
            await asyncio.wait_for(session.send_ping(), timeout)
            return False
        except Exception:  # noqa: BLE001 - no answer, whatever the way
            self._died(stop, f"it did not answer a ping within {timeout:g} s after a call timed out")
            return True

    def _command(self) -> str:
        return " ".join([self.spec.command, *self.spec.args])

    async def _stderr_tail(self) -> str:
        stderr = self._stderr
        tail = await asyncio.get_running_loop().run_in_executor(None, stderr.tail) if stderr is not None else ""
        return f"; its stderr ended with:\n{tail}" if tail else ""


class _StderrTail:
    """A server's stderr, read by a thread: logged at DEBUG (logger ``reinforge.tools.mcp``), its
    last lines kept for error messages."""

    def __init__(self, name: str, lines: int = 20):
        read_fd, write_fd = os.pipe()
        self.file = os.fdopen(write_fd, "w")
        self.name = name
        self._lines: collections.deque[str] = collections.deque(maxlen=lines)
        self._thread = threading.Thread(target=self._read, args=(read_fd,), name=f"mcp-stderr-{name}", daemon=True)
        self._thread.start()

    def close_writer(self) -> None:
        """Close this process's end once the server has its own (so the reader sees its end)."""
        if not self.file.closed:
            self.file.close()

    def _read(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as f:
            for raw in f:
                line = raw.decode(errors="replace").rstrip()
                self._lines.append(line[:300])
                logger.debug("[%s] %s", self.name, line)

    def tail(self, wait: float = 1.0) -> str:
        self._thread.join(wait)  # the process has ended: let the reader take its last lines
        return "\n".join(self._lines)[-2000:]


class _EndWatch:
    """The session's read stream, calling ``on_end`` when it ends: the server's stdout closed, i.e.
    its process exited (noticed at once, not at the next call)."""

    def __init__(self, stream: Any, on_end: Any):
        self._stream, self._on_end = stream, on_end

    async def receive(self) -> Any:
        import anyio

        try:
            return await self._stream.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._on_end()
            raise

    def __aiter__(self) -> _EndWatch:
        return self

    async def __anext__(self) -> Any:
        import anyio

        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _EndWatch:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._stream.aclose()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _disconnected(e: BaseException) -> bool:
    """Whether ``e`` says the server's connection is gone (the process stopped)."""
    import anyio
    from mcp import MCPError
    from mcp.types import CONNECTION_CLOSED

    if isinstance(e, MCPError):
        return e.code == CONNECTION_CLOSED
    return isinstance(
        e, (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, ConnectionError, EOFError)
    )


def _describe(e: BaseException, startup_timeout: float) -> str:
    """A one-line reason for a failed start or session (an exception group's first leaf)."""
    while isinstance(e, _GROUP) and e.exceptions:
        e = e.exceptions[0]
    if isinstance(e, (asyncio.TimeoutError, TimeoutError)):
        return f"no answer to the MCP handshake within {startup_timeout:g} s"
    if _disconnected(e):
        return "the process closed the connection (it exited?)"
    return f"{type(e).__name__}: {e}"
