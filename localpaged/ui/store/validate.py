"""The schema an import must meet (`ExportImport.import_json`): an export_json() dict is checked
whole before anything is written, and turned into records the store can insert as they are.

What is checked: the format marker; every field's type and size (caps below); ids are ints or
strings, unique; every parent id names a message of the export; the messages form a forest (no
cycles); roles and statuses are the store's; an active child is one of its parent's children and
the active root one of the roots; sampling and stats are JSON objects of bounded depth and size.
Images (`images`: sha256 -> {mime, width, height, data: base64}): each one's bytes must hash
to its key and read as an image (`images.read_image`: kind, size and pixel caps); every image a
user message names (`extra.images`) must be among them, and the names take the mime type and
size the bytes give. Unknown keys are ignored (a newer export may carry more); `token_ids` and `prepared` are not
imported (token ids are only valid for the model that made them), nor are `pinned` and
`archived` (an import arrives as a new conversation in the list); `tags` are (`clean_tags`).

Errors are ValueError naming the field and the record: "import_json: messages[17].content:
expected a string, got dict". Ordering is linear: children are found through one parent -> child
index and a list of children waiting for their parent.
"""

from __future__ import annotations

import base64
import binascii
import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from .images import MAX_IMAGES, SHA256, ImageFile, image_refs, read_image
from .organise import clean_tags
from .schema import ROLES, STATUSES

EXPORT_FORMAT = "localpaged.conversation"

MAX_MESSAGES = 100_000
MAX_CONTENT_CHARS = 1_000_000       # one message, or the system prompt
MAX_TOTAL_CHARS = 64_000_000        # all messages together
MAX_TITLE_CHARS = 1_000
MAX_MODEL_CHARS = 1_000
MAX_JSON_DEPTH = 8                  # sampling / stats: {"a": {"b": ...}} is depth 2
MAX_JSON_CHARS = 64_000             # sampling / stats, as JSON text
MAX_ID_CHARS = 200                  # a string id
MAX_EXTRA_CHARS = 4_000_000         # a message's extra: tool calls, a tool card, attachments
MAX_EXPORT_IMAGE_BYTES = 400_000_000    # all images of an export together (decoded)


@dataclass
class ImportPlan:
    """A checked export: the conversation's fields and its messages, parents first, and the
    images they name. Message records hold exactly: id, parent_id, role, content, sampling,
    status, stats, created, active_child_id, extra."""
    conversation: dict[str, Any]
    messages: list[dict[str, Any]]
    images: list[ImageFile]


def check_export(data: Any, now: float | None = None) -> ImportPlan:
    """The ImportPlan of an export_json() dict; ValueError naming the first bad field."""
    now = time.time() if now is None else now
    if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
        raise _error("", f"not a {EXPORT_FORMAT} export")
    conv = _conversation(_get(data, "conversation", dict, "", required=True), now)
    raw = _get(data, "messages", list, "") or []
    if len(raw) > MAX_MESSAGES:
        raise _error("messages", f"{len(raw)} messages, more than {MAX_MESSAGES}")
    msgs = [_message(m, f"messages[{i}]", now) for i, m in enumerate(raw)]
    total = sum(len(m["content"]) for m in msgs)
    if total > MAX_TOTAL_CHARS:
        raise _error("messages", f"{total} characters in all, more than {MAX_TOTAL_CHARS}")
    images = _images(_get(data, "images", dict, "") or {})
    named = {ref["sha256"] for m in msgs for ref in _name_images(m, images)}
    return ImportPlan(conv, parents_first(msgs, conv["active_root_id"]),
                      [im for sha, im in images.items() if sha in named])


def _images(raw: dict) -> dict[str, ImageFile]:
    """The export's images, each read from its bytes and checked against its key."""
    out: dict[str, ImageFile] = {}
    total = 0
    for sha, entry in raw.items():
        w = f"images[{str(sha)[:80]!r}]"
        if not SHA256.match(sha):
            raise _error(w, "an image's key must be the sha256 of its bytes (64 hex digits)")
        if not isinstance(entry, dict):
            raise _error(w, f"expected an object, got {_kind(entry)}")
        encoded = _get(entry, "data", str, w, required=True)
        try:
            data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise _error(f"{w}.data", "not base64") from None
        total += len(data)
        if total > MAX_EXPORT_IMAGE_BYTES:
            raise _error("images", f"more than {MAX_EXPORT_IMAGE_BYTES} bytes of images")
        try:
            image = read_image(data, sha)
        except ValueError as exc:
            raise _error(f"{w}.data", str(exc)) from None
        if image.sha256 != sha:
            raise _error(f"{w}.data", "its bytes' sha256 is not its key")
        out[sha] = image
    return out


def _name_images(m: dict, images: dict[str, ImageFile]) -> list[dict]:
    """A message's image names checked against the export's images and rewritten from them
    (each name kept, at most 200 characters); returns them."""
    raw = m["extra"].get("images")
    if raw is None:
        return []
    w = f"{m['_where']}.extra.images"
    refs = image_refs(m["extra"])
    if m["role"] != "user" or not isinstance(raw, list) or len(refs) != len(raw) \
            or len(refs) > MAX_IMAGES:
        raise _error(w, f"a user message's list of at most {MAX_IMAGES} images, each with "
                        "its sha256")
    named = []
    for j, ref in enumerate(refs):
        image = images.get(ref["sha256"])
        if image is None:
            raise _error(f"{w}[{j}].sha256", "no image of the export has this sha256")
        named.append({**image.ref(), "name": str(ref.get("name") or "image")[:200]})
    m["extra"] = {**m["extra"], "images": named}
    return named


def parents_first(msgs: list[dict], active_root_id: Any = None) -> list[dict]:
    """The messages ordered so that each parent precedes its children, otherwise in the order
    given (an export's own order is kept); linear time. ValueError on a duplicate id, a missing
    parent, a cycle or an active child that is not a child. Each record must carry `_where`
    (its field path), which is dropped from the result."""
    where = _unique_ids(msgs)
    children: dict[Any, list[dict]] = {}
    for m in msgs:
        if m["parent_id"] is not None and m["parent_id"] not in where:
            raise _error(f"{m['_where']}.parent_id", f"no message has id {m['parent_id']!r}")
        children.setdefault(m["parent_id"], []).append(m)
    _check_active(None, active_root_id, children, "conversation.active_root_id")
    placed: set = set()
    waiting: dict[Any, list[dict]] = {}     # parent id -> children seen before it was placed
    order: list[dict] = []
    for m in msgs:
        if m["parent_id"] is not None and m["parent_id"] not in placed:
            waiting.setdefault(m["parent_id"], []).append(m)
            continue
        ready = deque([m])
        while ready:                        # m, then whatever was waiting on it, and so on
            m = ready.popleft()
            _check_active(m["id"], m["active_child_id"], children, f"{m['_where']}.active_child_id")
            placed.add(m["id"])
            order.append(m)
            ready.extend(waiting.pop(m["id"], ()))
    if waiting:
        stuck = next(iter(waiting.values()))[0]
        raise _error(f"{stuck['_where']}.parent_id", "the messages' parents form a cycle")
    for m in order:
        del m["_where"]
    return order


def _unique_ids(msgs: list[dict]) -> dict[Any, str]:
    where: dict[Any, str] = {}
    for m in msgs:
        if m["id"] in where:
            raise _error(f"{m['_where']}.id", f"id {m['id']!r} is also {where[m['id']]}'s")
        where[m["id"]] = m["_where"]
    return where


def _check_active(parent: Any, active: Any, children: dict, field: str) -> None:
    if active is not None and all(c["id"] != active for c in children.get(parent, [])):
        raise _error(field, f"{active!r} is not one of its "
                            f"{'roots' if parent is None else 'children'}")


# -- records -------------------------------------------------------------------------------

def _conversation(c: dict, now: float) -> dict[str, Any]:
    w = "conversation"
    title = _text(c, "title", w, MAX_TITLE_CHARS, "Imported chat")
    return {"title": title or "Imported chat",
            "system_prompt": _text(c, "system_prompt", w, MAX_CONTENT_CHARS, ""),
            "model": _text(c, "model", w, MAX_MODEL_CHARS, None),
            "sampling": _json_object(c, "sampling", w) or {},
            "created": _time(c, "created", w, now), "updated": _time(c, "updated", w, now),
            "active_root_id": _id(c, "active_root_id", w, required=False),
            "tags": _tags(c, w)}


def _tags(c: dict, w: str) -> list[str]:
    try:
        return clean_tags(_get(c, "tags", list, w) or [])
    except ValueError as e:
        raise _error(f"{w}.tags", str(e)) from None


def _message(m: Any, w: str, now: float) -> dict[str, Any]:
    if not isinstance(m, dict):
        raise _error(w, f"expected an object, got {_kind(m)}")
    role = _get(m, "role", str, w, required=True)
    if role not in ROLES:
        raise _error(f"{w}.role", f"expected one of {list(ROLES)}, got {role!r}")
    status = _get(m, "status", str, w) or "complete"
    if status not in STATUSES:
        raise _error(f"{w}.status", f"expected one of {list(STATUSES)}, got {status!r}")
    return {"_where": w, "id": _id(m, "id", w, required=True),
            "parent_id": _id(m, "parent_id", w, required=False), "role": role,
            "content": _text(m, "content", w, MAX_CONTENT_CHARS, None, required=True),
            "sampling": _json_object(m, "sampling", w),
            # nothing streams into an imported reply: one cut off is kept as such
            "status": "interrupted" if status == "streaming" else status,
            "stats": _json_object(m, "stats", w) or {}, "created": _time(m, "created", w, now),
            "active_child_id": _id(m, "active_child_id", w, required=False),
            "extra": _json_object(m, "extra", w, MAX_EXTRA_CHARS) or {}}


# -- fields --------------------------------------------------------------------------------

_KINDS = {dict: "an object", list: "a list", str: "a string", int: "an integer",
          float: "a number", bool: "a boolean", type(None): "null"}


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _field(w: str, key: str) -> str:
    return f"{w}.{key}" if w else key


def _error(field: str, problem: str) -> ValueError:
    return ValueError(f"import_json: {field + ': ' if field else ''}{problem}")


def _get(record: dict, key: str, kind: type, w: str, required: bool = False) -> Any:
    """record[key] if it has type `kind`; None when absent or null (ValueError if required)."""
    value = record.get(key)
    if value is None:
        if required:
            raise _error(_field(w, key), f"missing (expected {_KINDS[kind]})")
        return None
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise _error(_field(w, key), f"expected {_KINDS[kind]}, got {_kind(value)}")
    return value


def _text(record: dict, key: str, w: str, cap: int, default: Any, required: bool = False) -> Any:
    value = _get(record, key, str, w, required)
    if value is not None and len(value) > cap:
        raise _error(f"{w}.{key}", f"{len(value)} characters, more than {cap}")
    return default if value is None else value


def _id(record: dict, key: str, w: str, required: bool) -> int | str | None:
    value = record.get(key)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise _error(f"{w}.{key}", f"expected an integer or string id, got {_kind(value)}")
    if isinstance(value, str) and not 0 < len(value) <= MAX_ID_CHARS:
        raise _error(f"{w}.{key}", f"a string id must have 1 to {MAX_ID_CHARS} characters")
    return value


def _time(record: dict, key: str, w: str, now: float) -> float:
    value = record.get(key)
    if value is None:
        return now
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value >= 0):
        raise _error(f"{w}.{key}", f"expected Unix seconds (a number >= 0), got {value!r:.40}")
    return float(value)


def _json_object(record: dict, key: str, w: str, cap: int = MAX_JSON_CHARS) -> dict | None:
    """record[key]: plain JSON of bounded depth, at most `cap` characters (an `extra` holds
    attachments' text: MAX_EXTRA_CHARS)."""
    value = _get(record, key, dict, w)
    if value:
        try:
            size = _json_size(value, 1)
        except _BadJson as e:
            raise _error(f"{w}.{key}" + "".join(reversed(e.path)), e.problem) from None
        if size > cap:
            raise _error(f"{w}.{key}", f"more than {cap} characters of JSON")
    return value


class _BadJson(Exception):
    """A value that is not plain JSON; `path` collects the keys to it, innermost first."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem, self.path = problem, []


def _json_size(value: Any, depth: int) -> int:
    """About how many characters `value` takes as JSON (strings and keys exactly, other
    scalars 24); _BadJson unless it is plain JSON (objects with string keys, lists, strings,
    finite numbers, booleans, null) nested at most MAX_JSON_DEPTH deep."""
    kind = type(value)
    if kind is str:
        return len(value) + 2
    if kind is int or kind is bool or value is None or (kind is float and math.isfinite(value)):
        return 24
    if kind is float:
        raise _BadJson(f"expected a finite number, got {value}")
    if kind is not dict and kind is not list:
        raise _BadJson(f"expected a JSON value, got {_kind(value)}")
    if depth > MAX_JSON_DEPTH:
        raise _BadJson(f"nested deeper than {MAX_JSON_DEPTH}")
    is_dict, size = kind is dict, 2
    for k, v in (value.items() if is_dict else enumerate(value)):
        if is_dict:
            if type(k) is not str:
                raise _BadJson(f"expected string keys, got {_kind(k)}")
            size += len(k) + 4
        item = type(v)
        if item is str:                     # the common flat cases inline: no call
            size += len(v) + 3
        elif item is int or item is bool or v is None or (item is float and math.isfinite(v)):
            size += 24
        else:
            try:
                size += _json_size(v, depth + 1) + 1
            except _BadJson as e:
                e.path.append(f".{k}" if is_dict else f"[{k}]")
                raise
    return size
