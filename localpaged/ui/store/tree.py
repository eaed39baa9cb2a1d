"""The message tree of a conversation (part of `Store`): add, rewrite and delete messages,
children and siblings, the active path and branch switching, crash recovery of streaming replies.

Tree: a message's parent is in the same conversation; regenerate adds a sibling assistant reply,
editing a user message adds a sibling user message. The path shown is the active path: from the
conversation's active root, follow each message's active child (invariant in `schema.py`).
A streaming reply is written with status 'streaming' and re-written as it grows, then 'complete'
or 'stopped'; `mark_interrupted()` at start-up turns replies a crash left 'streaming' into
'interrupted', keeping their text.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from .db import guarded
from .images import MAX_IMAGES, ImageFile, StoredImages
from .rows import Message, message_from_row
from .schema import ACTIVE_PATH_SQL, PATH_TO_SQL, SUBTREE_SQL

log = logging.getLogger(__name__)


class MessageTree(StoredImages):
    """Needs `get_conversation` (in `Store`)."""

    @guarded
    def get_message(self, message_id: int) -> Message:
        return message_from_row(self._row("messages", message_id, "message"))

    @guarded
    def add_message(self, conversation_id: int, parent_id: int | None, role: str, content: str,
                    sampling: dict[str, Any] | None = None, status: str = "complete",
                    stats: dict[str, Any] | None = None, prepared: str | None = None,
                    activate: bool = True, extra: dict[str, Any] | None = None,
                    images: list[ImageFile] | tuple = ()) -> Message:
        """Add a child of `parent_id` (None: a new root) and make it the active child (unless
        `activate` is off: a reply prepared in the background stays off the shown path).
        `extra`: tool calls, a tool card or attachments (schema.py, version 6); `images` (a
        user message's, images.py) are kept with it, in the same transaction, and named in
        its `extra["images"]`."""
        self._check(role=role, status=status, prepared=prepared)
        if images:
            if role != "user" or len(images) > MAX_IMAGES:
                raise ValueError(f"only a user message carries images, at most {MAX_IMAGES}")
            extra = {**(extra or {}), "images": [im.ref() for im in images]}
        self.get_conversation(conversation_id)
        # Invariant: a message's parent is in the same conversation.
        if parent_id is not None and self.get_message(parent_id).conversation_id != conversation_id:
            raise ValueError(f"message {parent_id} is not in conversation {conversation_id}")
        with self._write():
            self._put_images(list(images))
            mid = self._insert(conversation_id, parent_id, role, content, sampling, status,
                               stats or {}, time.time(), prepared, activate, extra=extra)
            self._touch(conversation_id)
        return self.get_message(mid)

    def _insert(self, cid: int, parent_id: int | None, role: str, content: str,
                sampling: dict | None, status: str, stats: dict, created: float,
                prepared: str | None = None, activate: bool = True,
                token_ids: list[int] | None = None, extra: dict | None = None) -> int:
        mid = self.db.table("messages").insert({
            "conversation_id": cid, "parent_id": parent_id, "role": role, "content": content,
            "created": created, "status": status, "stats": json.dumps(stats),
            "sampling": None if sampling is None else json.dumps(sampling),
            "prepared": prepared,
            "token_ids": None if token_ids is None else json.dumps(token_ids),
            "extra": json.dumps(extra or {})}).last_pk
        if activate:
            self._activate(cid, parent_id, mid)
        return mid

    def _activate(self, cid: int, parent_id: int | None, mid: int) -> None:
        if parent_id is None:
            self.db.execute("UPDATE conversations SET active_root_id = ? WHERE id = ?", [mid, cid])
        else:
            self.db.execute("UPDATE messages SET active_child_id = ? WHERE id = ?",
                            [mid, parent_id])

    @guarded
    def update_message(self, message_id: int, *, content: str | None = None,
                       status: str | None = None,
                       stats: dict[str, Any] | None = None,
                       prepared: str | None = None,
                       token_ids: list[int] | None = None,
                       extra: dict[str, Any] | None = None) -> Message:
        """Rewrite a message (a streaming reply as it grows); `stats` and `extra` are merged
        into the old ones; `token_ids` (a reply's tokens, kept in step with `content`) replaces
        the old. Committed before returning."""
        self._check(status=status, prepared=prepared)
        old = self.get_message(message_id)
        new = {"content": content, "status": status, "prepared": prepared,
               "stats": None if stats is None else json.dumps({**old.stats, **stats}),
               "token_ids": None if token_ids is None else json.dumps(list(token_ids)),
               "extra": None if extra is None else json.dumps({**old.extra, **extra})}
        new = {k: v for k, v in new.items() if v is not None}
        with self._write():
            if new:
                self.db.table("messages").update(message_id, new)
            self._touch(old.conversation_id)
        return self.get_message(message_id)

    @guarded
    def delete_message(self, message_id: int) -> None:
        """Delete a message and its subtree; the parent's newest remaining child (or the newest
        remaining root) becomes active if the deleted one was."""
        m = self.get_message(message_id)
        ids = json.dumps([r["id"] for r in self._rows(SUBTREE_SQL, [message_id])])
        with self._write():
            # Flatten the subtree before deleting it (see delete_conversation).
            self.db.execute("UPDATE messages SET parent_id = NULL, active_child_id = NULL"
                            " WHERE id IN (SELECT value FROM json_each(?))", [ids])
            self.db.execute("DELETE FROM messages WHERE id IN (SELECT value FROM json_each(?))",
                            [ids])
            self._drop_unreferenced()
            rest = self._children(m.conversation_id, m.parent_id)
            if rest and self._active_of(m.conversation_id, m.parent_id) is None:
                self._activate(m.conversation_id, m.parent_id, rest[-1].id)
            self._touch(m.conversation_id)

    def _children(self, cid: int, parent_id: int | None) -> list[Message]:
        if parent_id is None:
            where, arg = "parent_id IS NULL AND conversation_id = ?", cid
        else:
            where, arg = "parent_id = ?", parent_id
        rows = self._rows(f"SELECT * FROM messages WHERE {where} ORDER BY id", [arg])
        return [message_from_row(r) for r in rows]

    def _active_of(self, cid: int, parent_id: int | None) -> int | None:
        if parent_id is None:
            return self.get_conversation(cid).active_root_id
        return self.get_message(parent_id).active_child_id

    @guarded
    def children(self, message_id: int | None,
                 conversation_id: int | None = None) -> list[Message]:
        """Children of `message_id` in creation order; with message_id=None, the roots of
        `conversation_id` (then required)."""
        if message_id is None and conversation_id is None:
            raise TypeError("children(None) needs conversation_id")
        if message_id is not None:
            conversation_id = self.get_message(message_id).conversation_id
        return self._children(conversation_id, message_id)

    @guarded
    def siblings(self, message_id: int) -> tuple[list[int], int]:
        """(ids of the message and its siblings in creation order, index of the message), for
        the `‹ 2/3 ›` control (index is 0-based)."""
        m = self.get_message(message_id)
        ids = [c.id for c in self._children(m.conversation_id, m.parent_id)]
        return ids, ids.index(message_id)

    @guarded
    def set_active(self, message_id: int) -> list[Message]:
        """Switch branch: make the message, and every ancestor, the active child of its parent.
        Returns the new active path (it passes through the message, then follows the active
        children below it)."""
        path = self.path_to(message_id)
        with self._write():
            for m in path:
                self._activate(m.conversation_id, m.parent_id, m.id)
        return self.active_path(path[0].conversation_id)

    @guarded
    def active_path(self, conversation_id: int) -> list[Message]:
        """Messages from the active root down the active children to a leaf ([] if empty)."""
        return [message_from_row(r) for r in self._rows(ACTIVE_PATH_SQL, [conversation_id])]

    @guarded
    def path_to(self, message_id: int) -> list[Message]:
        """Messages from the root down to `message_id` (inclusive)."""
        rows = self._rows(PATH_TO_SQL, [message_id])
        if not rows:
            raise KeyError(f"no message {message_id}")
        return [message_from_row(r) for r in rows]

    @guarded
    def subtree(self, message_id: int) -> list[Message]:
        """The message and every message below it, in creation order (what delete_message
        removes); KeyError if there is no such message."""
        self.get_message(message_id)
        rows = self._rows("SELECT * FROM messages WHERE id IN (" + SUBTREE_SQL + ") ORDER BY id",
                          [message_id])
        return [message_from_row(r) for r in rows]

    @guarded
    def mark_interrupted(self) -> int:
        """At start-up: replies left 'streaming' by a crashed writer become 'interrupted'
        (text kept); replies being prepared in the background that nobody opened are deleted
        (leaves, never active). Returns how many were marked. Do not call while this file has a
        live writer."""
        with self._write():
            self.db.execute("DELETE FROM messages WHERE status = 'streaming'"
                            " AND prepared = 'unseen'")
            n = self.db.execute("UPDATE messages SET status = 'interrupted'"
                                " WHERE status = 'streaming'").rowcount
        if n:
            log.warning("%s: %d reply(ies) cut off by a crash marked 'interrupted'", self.path, n)
        return n

    @guarded
    def messages(self, conversation_id: int) -> list[Message]:
        """Every message of the conversation in creation order (parents before children)."""
        rows = self._rows("SELECT * FROM messages WHERE conversation_id = ? ORDER BY id",
                          [conversation_id])
        return [message_from_row(r) for r in rows]
