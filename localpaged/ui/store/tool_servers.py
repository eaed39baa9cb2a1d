"""The MCP servers the user added (part of `Store`): the `tool_servers` table, schema version 6.
A server is a name, a kind ('stdio': `target` is the argv list that starts it; 'http': `target`
is its streamable-HTTP URL) and when it was added. Nothing here runs a server: `ui/tools/`
does, and only for the servers listed here.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from .db import StoreBase, guarded
from .schema import TOOL_SERVER_KINDS

MAX_SERVER_NAME = 80


@dataclass(frozen=True)
class ToolServer:
    id: int
    name: str
    kind: str                        # one of TOOL_SERVER_KINDS
    target: tuple[str, ...] | str    # stdio: the argv; http: the URL

    @property
    def label(self) -> str:
        """How the panel names it: its name, then what it runs or where it is."""
        where = " ".join(self.target) if self.kind == "stdio" else self.target
        return f"{self.name} ({self.kind}: {where[:120]})"


def _server(row: dict) -> ToolServer | None:
    """A row as a ToolServer; None for one another program wrote wrongly (skipped, not fatal)."""
    try:
        target = json.loads(row["target"])
    except (TypeError, ValueError):
        return None
    if row["kind"] == "stdio" and isinstance(target, list) and target and all(
            isinstance(a, str) for a in target):
        return ToolServer(row["id"], str(row["name"]), "stdio", tuple(target))
    if row["kind"] == "http" and isinstance(target, str) and target:
        return ToolServer(row["id"], str(row["name"]), "http", target)
    return None


class ToolServerRows(StoreBase):

    @guarded
    def add_tool_server(self, name: str, kind: str, target: list[str] | str) -> ToolServer:
        """ValueError naming what is wrong (nothing stored then)."""
        name = " ".join((name or "").split())
        if not name or len(name) > MAX_SERVER_NAME:
            raise ValueError(f"a tool server needs a name of 1 to {MAX_SERVER_NAME} characters")
        if kind not in TOOL_SERVER_KINDS:
            raise ValueError(f"a tool server's kind is one of {list(TOOL_SERVER_KINDS)}, "
                             f"got {kind!r}")
        if kind == "stdio" and not (isinstance(target, (list, tuple)) and target and all(
                isinstance(a, str) and a for a in target)):
            raise ValueError("a stdio tool server needs a command: a non-empty list of arguments")
        if kind == "http" and not (isinstance(target, str) and target.startswith(
                ("http://", "https://"))):
            raise ValueError("an HTTP tool server needs an http:// or https:// URL")
        if any(s.name == name for s in self.tool_servers()):
            raise ValueError(f"there is already a tool server named {name!r}")
        value = list(target) if kind == "stdio" else target
        with self._write():
            sid = self.db.table("tool_servers").insert({
                "name": name, "kind": kind, "target": json.dumps(value),
                "created": time.time()}).last_pk
        return self.tool_server(sid)

    @guarded
    def tool_server(self, server_id: int) -> ToolServer:
        rows = self._rows("SELECT * FROM tool_servers WHERE id = ?", [server_id])
        server = _server(rows[0]) if rows else None
        if server is None:
            raise KeyError(f"no tool server {server_id}")
        return server

    @guarded
    def tool_servers(self) -> list[ToolServer]:
        """Every readable server, oldest first."""
        rows = self._rows("SELECT * FROM tool_servers ORDER BY id")
        return [s for s in map(_server, rows) if s is not None]

    @guarded
    def delete_tool_server(self, server_id: int) -> bool:
        with self._write():
            return self.db.execute("DELETE FROM tool_servers WHERE id = ?",
                                   [server_id]).rowcount > 0
