"""The MCP client of the chat app: lists a server's tools and calls one, over stdio (a command the
user gave, as an argv list: no shell) or streamable HTTP, with the official `mcp` SDK.

`McpClient` owns one asyncio event loop on its own daemon thread (the SDK is async; the UI's
handlers and turns are threads) and exposes blocking calls with a timeout. Each call opens its
own session (spawn or connect, initialize, one request, close): a server that hangs, dies or
writes garbage costs that one call, never a later one, and a timed-out call's process is
stopped by the SDK's transport as the session is cancelled. Nothing here runs unless a caller
names a server the user added.

A tool's result is text: its text parts joined (other content kinds named, not inlined), cut to
`max_chars` with the cut said in `ToolResult.total_chars`, so a result of megabytes reaches
neither the model nor the page whole.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from ..store import ToolServer

log = logging.getLogger(__name__)

LIST_TIMEOUT_S = 20.0
CALL_TIMEOUT_S = 60.0
MAX_RESULT_CHARS = 16_000


class ToolError(Exception):
    """A tool server that could not be reached or answered with an error; the message says
    which server and what happened, for the card."""


@dataclass(frozen=True)
class McpTool:
    name: str
    description: str
    input_schema: dict


@dataclass(frozen=True)
class ToolResult:
    text: str                 # at most max_chars characters
    total_chars: int          # the whole result's length (> len(text): it was cut)
    is_error: bool = False    # the tool itself reported an error

    @property
    def cut(self) -> bool:
        return self.total_chars > len(self.text)


class McpClient:
    """Blocking calls to MCP servers, run on one event loop thread (started on first use)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def _run(self, coro, timeout: float, what: str) -> Any:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="mcp-client",
                                 daemon=True).start()
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout), self._loop)
        try:
            return future.result(timeout + 10)      # wait_for ends it first, cleanly
        except (asyncio.TimeoutError, FutureTimeout):
            future.cancel()
            raise ToolError(f"{what}: no answer within {timeout:g} s (the server hangs?)") from None
        except ToolError:
            raise
        except BaseException as exc:  # noqa: BLE001 - an SDK or transport failure: say what
            raise ToolError(f"{what}: {_reason(exc)}") from None

    def list_tools(self, server: ToolServer, timeout: float = LIST_TIMEOUT_S) -> list[McpTool]:
        async def go(session) -> list[McpTool]:
            result = await session.list_tools()
            return [McpTool(t.name, t.description or "", dict(t.input_schema or {}))
                    for t in result.tools]
        return self._run(_with_session(server, go), timeout, f"listing the tools of {server.name}")

    def call_tool(self, server: ToolServer, name: str, arguments: dict, timeout: float =
                  CALL_TIMEOUT_S, max_chars: int = MAX_RESULT_CHARS) -> ToolResult:
        async def go(session) -> ToolResult:
            result = await session.call_tool(name, arguments)
            return result_text(result, max_chars)
        return self._run(_with_session(server, go), timeout, f"{name} on {server.name}")

    def close(self) -> None:
        with self._lock:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._loop = None


async def _with_session(server: ToolServer, body):
    """body(session) on a fresh, initialized session with the server."""
    from mcp import ClientSession
    if server.kind == "stdio":
        from mcp.client.stdio import StdioServerParameters, stdio_client
        params = StdioServerParameters(command=server.target[0], args=list(server.target[1:]))
        with open(os.devnull, "w") as errlog:        # a server's log is not the app's
            async with stdio_client(params, errlog=errlog) as streams:
                async with ClientSession(streams[0], streams[1]) as session:
                    await session.initialize()
                    return await body(session)
    from mcp.client.streamable_http import streamable_http_client
    async with streamable_http_client(server.target) as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            return await body(session)


def result_text(result: Any, max_chars: int) -> ToolResult:
    """A CallToolResult as text: text parts as they are, structured content as JSON when there
    is no text, other parts named ("[image]"); cut to max_chars."""
    parts = []
    for item in getattr(result, "content", None) or []:
        kind = getattr(item, "type", "")
        parts.append(item.text if kind == "text" else f"[{kind or 'content'}]")
    structured = getattr(result, "structured_content", None)
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False))
    text = "\n".join(parts)
    return ToolResult(text[:max_chars], len(text), bool(getattr(result, "is_error", False)))


def _reason(exc: BaseException) -> str:
    """The innermost message of an exception group (anyio wraps the SDK's errors in them)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    if isinstance(exc, (FileNotFoundError, PermissionError)):
        text = f"cannot start the server: {text}"
    return text if "closed" not in text.lower() else f"{text} (the server exited or closed " \
                                                      "its connection)"
