"""Copies of a conversation (part of `Store`): fork (a new conversation holding one path),
export to JSON (the whole tree) and Markdown (the active path), and import from that JSON.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from .schema import SCHEMA_VERSION, Conversation, message_from_row, parents_first
from .tree import MessageTree, guarded

EXPORT_FORMAT = "localpaged.conversation"


class ExportImport(MessageTree):
    """Needs `get_conversation` and `_insert_conversation` (in `Store`)."""

    @guarded
    def fork_conversation(self, message_id: int, title: str | None = None) -> Conversation:
        """A new conversation with the same settings holding a copy of the path up to
        `message_id` (timestamps, sampling, stats, status and reply token ids copied)."""
        path = self.path_to(message_id)
        src = self.get_conversation(path[0].conversation_id)
        with self._write():
            cid = self._insert_conversation(title or f"{src.title} (fork)", src.system_prompt,
                                            src.model, src.sampling)
            parent = None
            for m in path:
                parent = self._insert(cid, parent, m.role, m.content, m.sampling, m.status,
                                      m.stats, m.created, token_ids=m.token_ids)
        return self.get_conversation(cid)

    @guarded
    def export_json(self, conversation_id: int) -> dict[str, Any]:
        """The whole tree: {"format", "schema_version", "conversation": {...}, "messages":
        [{...}, ...]} with messages in creation order (parents before children); ids are this
        store's, used only to link messages inside the export."""
        conv = dataclasses.asdict(self.get_conversation(conversation_id))
        msgs = self._rows("SELECT * FROM messages WHERE conversation_id = ? ORDER BY id",
                          [conversation_id])
        return {"format": EXPORT_FORMAT, "schema_version": SCHEMA_VERSION, "conversation": conv,
                "messages": [dataclasses.asdict(message_from_row(r)) for r in msgs]}

    @guarded
    def import_json(self, data: dict[str, Any]) -> Conversation:
        """A new conversation from an export_json() dict (new ids; active branches kept)."""
        if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
            raise ValueError(f"import_json: not a {EXPORT_FORMAT} export")
        c, msgs = data["conversation"], parents_first(data.get("messages", []))
        for m in msgs:
            self._check(role=m["role"], status=m.get("status", "complete"))
        now = time.time()
        with self._write():
            cid = self._insert_conversation(
                c.get("title", "Imported chat"), c.get("system_prompt", ""), c.get("model"),
                c.get("sampling"), c.get("created"), c.get("updated"))
            ids: dict[Any, int] = {}
            for m in msgs:
                ids[m["id"]] = self._insert(cid, ids.get(m.get("parent_id")), m["role"],
                                            m["content"], m.get("sampling"),
                                            m.get("status", "complete"), m.get("stats") or {},
                                            m.get("created", now))
            self._restore_active(cid, c, msgs, ids)
        return self.get_conversation(cid)

    def _restore_active(self, cid: int, c: dict, msgs: list[dict], ids: dict) -> None:
        # _insert left the last-inserted child active; the export's choice wins where it names
        # a child of that parent (a root for active_root_id).
        parent_of = {m["id"]: m.get("parent_id") for m in msgs}
        root = c.get("active_root_id")
        if root in ids and parent_of[root] is None:
            self._activate(cid, None, ids[root])
        for m in msgs:
            child = m.get("active_child_id")
            if child in ids and parent_of[child] == m["id"]:
                self._activate(cid, ids[m["id"]], ids[child])

    @guarded
    def export_markdown(self, conversation_id: int) -> str:
        """The active path as Markdown: title, model, system prompt, then one section per
        message; a reply that did not complete is marked with its status."""
        conv = self.get_conversation(conversation_id)
        parts = [f"# {conv.title}\n"]
        if conv.model:
            parts.append(f"*Model: {conv.model}*\n")
        if conv.system_prompt:
            parts.append(f"### System\n\n{conv.system_prompt}\n")
        for m in self.active_path(conversation_id):
            note = "" if m.status == "complete" else f"\n\n*(reply {m.status})*"
            parts.append(f"### {m.role.capitalize()}\n\n{m.content}{note}\n")
        return "\n".join(parts)
