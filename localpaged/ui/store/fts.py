"""Full-text search over every message of every branch: an SQLite FTS5 index of
`messages.content` (`messages_fts`, an external-content table: it stores the index, the text
stays in `messages`), kept in step with the table by triggers on insert, update of content and
delete, so every write path of the store (and of an older localpaged) keeps it right.

Invariant: when the triggers exist, `messages_fts` indexes exactly the rows of `messages` with
their current content. `ensure_index` (run at every open, after the migrations) restores it:
it builds the index of a file that lacks it (migrated from schema 4, or last opened by a SQLite
without FTS5) from the rows as they are. Where this SQLite has no FTS5 the triggers are dropped
(a write would fail on them) and search falls back to LIKE, with a warning in the log; the next
open on a SQLite with FTS5 rebuilds the index.

Queries: the user's words, each quoted (no FTS5 syntax gets through), all required, the last
one as a prefix ("lisb" finds "Lisbon"); matching is by word, case- and accent-insensitive.
"""

from __future__ import annotations

import logging
import sqlite3

from sqlite_utils import Database

log = logging.getLogger(__name__)

FTS_TABLE = "messages_fts"
HIT_START, HIT_END = "\x02", "\x03"     # around each matched word in a snippet
SNIPPET_WORDS = 12

_CREATE = [
    f"""CREATE VIRTUAL TABLE IF NOT EXISTS {FTS_TABLE} USING fts5(content, content='messages',
        content_rowid='id', tokenize='unicode61 remove_diacritics 2')""",
    f"""CREATE TRIGGER IF NOT EXISTS messages_fts_insert AFTER INSERT ON messages BEGIN
        INSERT INTO {FTS_TABLE}(rowid, content) VALUES (new.id, new.content); END""",
    f"""CREATE TRIGGER IF NOT EXISTS messages_fts_delete AFTER DELETE ON messages BEGIN
        INSERT INTO {FTS_TABLE}({FTS_TABLE}, rowid, content) VALUES ('delete', old.id, old.content);
        END""",
    f"""CREATE TRIGGER IF NOT EXISTS messages_fts_update AFTER UPDATE OF content ON messages BEGIN
        INSERT INTO {FTS_TABLE}({FTS_TABLE}, rowid, content) VALUES ('delete', old.id, old.content);
        INSERT INTO {FTS_TABLE}(rowid, content) VALUES (new.id, new.content); END""",
]
_TRIGGERS = ("messages_fts_insert", "messages_fts_delete", "messages_fts_update")


def fts5_available(db: Database) -> bool:
    """Whether this SQLite can run FTS5 (compiled in, or not: a table is tried)."""
    try:
        if db.execute("SELECT sqlite_compileoption_used('ENABLE_FTS5')").fetchone()[0]:
            return True
        db.execute("CREATE VIRTUAL TABLE temp.lp_fts_probe USING fts5(x)")
        db.execute("DROP TABLE temp.lp_fts_probe")
        return True
    except sqlite3.Error:
        return False


def ensure_index(db: Database, path, available: bool) -> bool:
    """Make the invariant above hold (one transaction); returns whether FTS is in use."""
    names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
    have = set(_TRIGGERS) <= names and FTS_TABLE in db.table_names()
    if available and have:
        return True
    with db.atomic():
        if not available:
            for name in _TRIGGERS:
                db.execute(f"DROP TRIGGER IF EXISTS {name}")
        else:
            for sql in _CREATE:
                db.execute(sql)
            db.execute(f"INSERT INTO {FTS_TABLE}({FTS_TABLE}) VALUES ('rebuild')")
    if available:
        log.info("%s: full-text index of the messages built", path)
    else:
        log.warning("this SQLite (%s) has no FTS5: search over messages falls back to LIKE "
                    "(substring, slower on a large store)", sqlite3.sqlite_version)
    return available


def fts_query(text: str) -> str | None:
    """The FTS5 MATCH expression for the user's words (None: no words)."""
    words = text.split()
    if not words:
        return None
    quoted = ['"' + w.replace('"', '""') + '"' for w in words]
    return " ".join(quoted) + "*"


def like_pattern(text: str) -> str:
    """A LIKE pattern (ESCAPE '\\') matching `text` as a literal substring."""
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def hit_parts(snippet: str) -> list[tuple[str, bool]]:
    """A snippet as (text, matched) pieces, the markers gone (text as stored: escape it to show
    it as HTML)."""
    parts, rest = [], snippet
    while rest:
        start = rest.find(HIT_START)
        if start < 0:
            parts.append((rest, False))
            break
        end = rest.find(HIT_END, start)
        end = len(rest) if end < 0 else end
        if start:
            parts.append((rest[:start], False))
        parts.append((rest[start + 1:end], True))
        rest = rest[end + 1:]
    return [(t.replace(HIT_START, "").replace(HIT_END, ""), m) for t, m in parts if t]
