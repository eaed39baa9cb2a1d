"""The store's row types, `Conversation` and `Message`, and how a database row becomes one.

Reading never fails on a value of the wrong type: a row written by an older or buggy import, or
by another program (timestamps as strings, a list where stats belong, sampling that is not an
object, content stored as a blob) is read with a safe value instead, so one bad row cannot stop
the sidebar or a conversation from loading. Each column is logged the first time it needs this.
What a safe value is: a number-like or ISO-8601 string for a timestamp, else 0.0; text decoded
or converted with str(); the default ({}, None) for JSON that is not an object; None for an id
that is not an integer; the column's default for a value outside its allowed set.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .schema import CONTEXT_POLICIES, PREPARED, ROLES, STATUSES

log = logging.getLogger(__name__)


@dataclass
class Conversation:
    id: int
    title: str
    created: float  # Unix seconds
    updated: float  # bumped by every write to the conversation or its messages
    system_prompt: str
    model: str | None
    sampling: dict[str, Any]  # default sampling settings for new replies
    active_root_id: int | None
    options: dict[str, Any] = field(default_factory=dict)  # app options (see ui/prepared/logic.py)
    context_policy: str = "drop_oldest"  # one of CONTEXT_POLICIES
    pinned: bool = False              # listed first
    archived: bool = False            # listed only when archived ones are asked for
    tags: list[str] = field(default_factory=list)   # sorted, each once


@dataclass
class Message:
    id: int
    conversation_id: int
    parent_id: int | None  # None: a root
    role: str  # one of ROLES
    content: str
    created: float
    sampling: dict[str, Any] | None  # settings this reply was generated with
    active_child_id: int | None  # None: a leaf
    status: str  # one of STATUSES
    stats: dict[str, Any]  # see STATS_KEYS
    prepared: str | None = None  # one of PREPARED: a reply made in the background, opened or not
    token_ids: list[int] | None = None  # a reply's tokens as generated (None: unknown)
    extra: dict[str, Any] = field(default_factory=dict)  # tool calls, a tool card, attachments


def conversation_from_row(row: dict) -> Conversation:
    r = _Row("conversations", row)
    return Conversation(
        id=row["id"], title=r.text("title"), created=r.time("created"),
        updated=r.time("updated"), system_prompt=r.text("system_prompt"),
        model=r.text("model", None), sampling=r.json_object("sampling", {}),
        active_root_id=r.ref("active_root_id"), options=r.json_object("options", {}),
        context_policy=r.choice("context_policy", CONTEXT_POLICIES),
        pinned=r.flag("pinned"), archived=r.flag("archived"), tags=r.strings("tags"))


def message_from_row(row: dict) -> Message:
    r = _Row("messages", row)
    return Message(
        id=row["id"], conversation_id=row["conversation_id"], parent_id=r.ref("parent_id"),
        role=r.choice("role", ROLES, "user"), content=r.text("content"),
        created=r.time("created"), sampling=r.json_object("sampling", None),
        active_child_id=r.ref("active_child_id"), status=r.choice("status", STATUSES),
        stats=r.json_object("stats", {}), prepared=r.choice("prepared", PREPARED),
        token_ids=r.token_ids("token_ids"), extra=r.json_object("extra", {}))


_logged: set[str] = set()       # "table.column" already reported


class _Row:
    """One row's columns read as their declared types (see the module docstring)."""

    def __init__(self, table: str, row: dict) -> None:
        self.table, self.row = table, row

    def _fallback(self, column: str, used: Any) -> Any:
        name = f"{self.table}.{column}"
        if name not in _logged:
            _logged.add(name)
            log.warning("%s of row %s holds %.80r, which the store never writes: read as %r "
                        "(later such values of this column are read alike, unlogged)",
                        name, self.row.get("id"), self.row.get(column), used)
        return used

    def time(self, column: str) -> float:
        value = self.row.get(column)
        if type(value) in (int, float) and math.isfinite(value):
            return float(value)
        return self._fallback(column, _seconds(value))

    def text(self, column: str, default: str | None = "") -> str | None:
        value = self.row.get(column)
        if value is None or isinstance(value, str):
            return default if value is None else value
        if isinstance(value, bytes):
            return self._fallback(column, value.decode("utf-8", "replace"))
        return self._fallback(column, str(value))

    def json_object(self, column: str, default: dict | None) -> dict | None:
        value = self.row.get(column)
        if value is None:
            return default
        try:
            parsed = json.loads(value)
        except (TypeError, ValueError):
            parsed = None
        if isinstance(parsed, dict):
            return parsed
        return self._fallback(column, default)

    def ref(self, column: str) -> int | None:
        value = self.row.get(column)
        if value is None or type(value) is int:
            return value
        return self._fallback(column, None)

    def choice(self, column: str, allowed: tuple, default: Any = ...) -> Any:
        value = self.row.get(column)
        if value in allowed:
            return value
        return self._fallback(column, allowed[0] if default is ... else default)

    def flag(self, column: str) -> bool:
        value = self.row.get(column)
        if value in (None, 0, 1):
            return bool(value)
        return self._fallback(column, False)

    def strings(self, column: str) -> list[str]:
        """A JSON list of strings (the `tags` a query gathered); [] when absent."""
        value = self.row.get(column)
        try:
            parsed = [] if value is None else json.loads(value)
        except (TypeError, ValueError):
            parsed = None
        if isinstance(parsed, list) and all(isinstance(t, str) for t in parsed):
            return parsed
        return self._fallback(column, [])

    def token_ids(self, column: str) -> list[int] | None:
        value = self.row.get(column)
        if not value:
            return None
        try:
            ids = json.loads(value)
        except (TypeError, ValueError):
            ids = None
        if isinstance(ids, list) and all(type(i) is int for i in ids):
            return ids
        return self._fallback(column, None)


def _seconds(value: Any) -> float:
    """Unix seconds from a stray timestamp value: a number-like or ISO-8601 string; else 0."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        for parse in (float, lambda s: datetime.fromisoformat(s.strip()).timestamp()):
            try:
                seconds = parse(value)
            except (ValueError, OverflowError, OSError):
                continue
            if math.isfinite(seconds):
                return seconds
    return 0.0
