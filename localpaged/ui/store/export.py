"""Copies of a conversation (part of `Store`): fork (a new conversation holding one path),
export to JSON (the whole tree) and Markdown (the active path), and import from that JSON.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any

from .images import image_refs
from .rows import Conversation, message_from_row
from .schema import SCHEMA_VERSION
from .tree import MessageTree, guarded
from .validate import EXPORT_FORMAT, check_export


class ExportImport(MessageTree):
    """Needs `get_conversation` and `_insert_conversation` (in `Store`), `_write_tags`
    (`Organise`)."""

    @guarded
    def fork_conversation(self, message_id: int, title: str | None = None) -> Conversation:
        """A new conversation with the same settings (system prompt, model, sampling
        settings, context policy, options) holding a copy of the path up to `message_id`
        (timestamps, sampling, stats, status, reply token ids and their alternatives copied)."""
        path = self.path_to(message_id)
        src = self.get_conversation(path[0].conversation_id)
        with self._write():
            cid = self._insert_conversation(title or f"{src.title} (fork)", src.system_prompt,
                                            src.model, src.sampling)
            self.db.execute("UPDATE conversations SET context_policy = ?, options = ?"
                            " WHERE id = ?", [src.context_policy, json.dumps(src.options), cid])
            parent = None
            for m in path:
                parent = self._insert(cid, parent, m.role, m.content, m.sampling, m.status,
                                      m.stats, m.created, token_ids=m.token_ids, extra=m.extra)
                self.db.execute("INSERT INTO token_alternatives (message_id, data) SELECT ?, data"
                                " FROM token_alternatives WHERE message_id = ?", [parent, m.id])
        return self.get_conversation(cid)

    @guarded
    def export_json(self, conversation_id: int) -> dict[str, Any]:
        """The whole tree: {"format", "schema_version", "conversation": {...}, "messages":
        [{...}, ...], "images": {sha256: {"mime", "width", "height", "data"}}} with messages in
        creation order (parents before children) and each image their `extra.images` name
        once, its bytes base64; ids are this store's, used only to link messages inside the
        export."""
        conv = dataclasses.asdict(self.get_conversation(conversation_id))
        msgs = [message_from_row(r) for r in self._rows(
            "SELECT * FROM messages WHERE conversation_id = ? ORDER BY id", [conversation_id])]
        shas = [ref["sha256"] for m in msgs for ref in image_refs(m.extra)]
        images = {sha: {"mime": im.mime, "width": im.width, "height": im.height,
                        "data": base64.b64encode(im.data).decode("ascii")}
                  for sha, im in self._images_of(shas).items()}
        return {"format": EXPORT_FORMAT, "schema_version": SCHEMA_VERSION, "conversation": conv,
                "messages": [dataclasses.asdict(m) for m in msgs], "images": images}

    @guarded
    def import_json(self, data: dict[str, Any]) -> Conversation:
        """A new conversation from an export_json() dict (new ids; active branches kept).
        The whole export is checked first (`validate.py`): ValueError naming the field and
        the record, and nothing written, when it does not fit."""
        plan = check_export(data)
        c = plan.conversation
        with self._write():
            self._put_images(plan.images)
            cid = self._insert_conversation(c["title"], c["system_prompt"], c["model"],
                                            c["sampling"], c["created"], c["updated"])
            ids: dict[Any, int] = {}
            for m in plan.messages:     # parents first
                ids[m["id"]] = self._insert(cid, ids.get(m["parent_id"]), m["role"], m["content"],
                                            m["sampling"], m["status"], m["stats"], m["created"],
                                            extra=m["extra"])
            self._restore_active(cid, c["active_root_id"], plan.messages, ids)
            self._write_tags(cid, c["tags"])
        return self.get_conversation(cid)

    def _restore_active(self, cid: int, root: Any, msgs: list[dict], ids: dict) -> None:
        # _insert left the last-inserted child active; the export's choice wins where it names
        # one (check_export made sure it names a child of that parent, a root for the root).
        if root is not None:
            self._activate(cid, None, ids[root])
        for m in msgs:
            if m["active_child_id"] is not None:
                self._activate(cid, ids[m["id"]], ids[m["active_child_id"]])

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
            parts.append(f"### {_heading(m)}\n\n{_reasoning_markdown(m.extra)}{m.content}"
                         f"{_extra_markdown(m.extra)}{note}\n")
        return "\n".join(parts)


def _heading(m) -> str:
    """A message's section title: its role; a tool result names its tool."""
    if m.role == "tool":
        return f"Tool result: {str(m.extra.get('name', 'tool'))[:100]}"
    return m.role.capitalize()


def _reasoning_markdown(extra: dict[str, Any]) -> str:
    """A reply's reasoning (kept apart from its text) as a quoted block before it."""
    reasoning = str(extra.get("reasoning") or "").strip()
    if not reasoning:
        return ""
    return "*Reasoning:*\n\n" + "\n".join("> " + line for line in reasoning.splitlines()) + "\n\n"


def _extra_markdown(extra: dict[str, Any]) -> str:
    """What a message's `extra` adds to its Markdown export: the calls of a reply, the names
    of a message's attachments and images (their text and bytes are in the JSON export)."""
    out = ""
    for call in extra.get("tool_calls") or []:
        if isinstance(call, dict):
            out += (f"\n\n*Tool call* `{str(call.get('name', ''))[:100]}`:\n\n```json\n"
                    f"{str(call.get('arguments', ''))}\n```")
    for att in extra.get("attachments") or []:
        if isinstance(att, dict):
            out += f"\n\n*Attached:* {str(att.get('name', 'file'))[:200]}"
    for ref in image_refs(extra):
        out += f"\n\n*Image:* {str(ref.get('name', 'image'))[:200]}"
    return out
