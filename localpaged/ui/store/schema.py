"""Data model of the conversation store (`store.py`): the DDL of the current version, the
migrations that bring an older file up to it, and the tree queries (the row types: `rows.py`).

The version lives in `PRAGMA user_version`:
  0  a new, empty file: the current schema is created directly.
  1  first release: `messages` had no `status` and no `stats` column.
  2  `messages.status` ('complete' | 'streaming' | 'stopped' | 'interrupted') and
     `messages.stats` (JSON: prompt_tokens, generated_tokens, ttft_s, tokens_per_s,
     prefix_tokens_reused, finish_reason).
  3  `messages.prepared` (NULL: an ordinary message; 'unseen': a reply prepared in the
     background that the user has not opened; 'seen': one they opened, see `ui/prepared/logic.py`),
     `conversations.options` (JSON: per-conversation app options, e.g. `alternatives`),
     `messages.token_ids` (JSON list of a reply's token ids, exactly as generated, so
     Continue resumes token-exact; NULL when unknown: older rows, a remote backend) and
     `conversations.context_policy` ('drop_oldest' | 'error' | 'compact': what a send does
     when the conversation no longer fits the model's context).
  4  `app_settings` (key -> JSON value: app-wide settings, e.g. `defaults`, the system
     prompt, sampling settings and context policy a new conversation starts with) and `presets`
     (named system prompts the user saved; the built-in ones are not stored, see
     `ui/settings/presets.py`). Added tables only: every conversation and message is kept as it was.
  5  `conversations.pinned` and `conversations.archived` (0 | 1: pinned ones are listed
     first, archived ones only when asked for), `tags` (conversation id, tag: any number of tags
     a conversation, each at most once) and the full-text index of the messages (`fts.py`: an
     FTS5 table kept by triggers; the migration indexes every existing message). Added columns
     and tables only: every conversation and message is kept as it was.
  6  role 'tool' (a tool's result, answering an assistant message's tool call) and
     `messages.extra` (JSON: an assistant message's `tool_calls`, a tool message's card: the
     call it answers, its arguments, state, duration; a user message's `attachments`), and
     `tool_servers` (the MCP servers the user added: name, kind 'stdio' | 'http', target: an
     argv list or a URL, as JSON). The role's CHECK changes, so `messages` is rebuilt
     (`rebuild_messages`: copied row for row, ids kept, foreign keys off while it runs).
  7  `token_alternatives` (message id -> a reply's tokens with their logprobs and top
     alternatives, packed: `alternatives.py`). An added table only.
  8  current: `images` (sha256 of an attached image file's bytes -> its mime type, width,
     height and bytes: `images.py`), which a user message names in `extra["images"]`. An
     added table only.

Branch points: `messages.active_child_id` names the child shown on the active path and
`conversations.active_root_id` names the shown root (a conversation may hold several roots when
the first user message was edited). Invariant kept by the store: every message that has children
has exactly one active child, which is one of its children, and every conversation with roots has
one active root, which is one of its roots.
"""

from __future__ import annotations

import logging
from pathlib import Path

from sqlite_utils import Database

from .errors import StoreError

log = logging.getLogger(__name__)

SCHEMA_VERSION = 8
ROLES = ("system", "user", "assistant", "tool")
STATUSES = ("complete", "streaming", "stopped", "interrupted")
PREPARED = (None, "unseen", "seen")     # messages.prepared
# Keys the app writes into Message.stats (others are kept as given).
STATS_KEYS = ("prompt_tokens", "generated_tokens", "ttft_s", "tokens_per_s",
              "prefix_tokens_reused", "finish_reason", "finish_detail", "context_dropped",
              "draft_tokens", "accepted_draft_tokens", "prefix_tokens_from_disk",
              "model", "images_from_cache", "image_tower_runs")
CONTEXT_POLICIES = ("drop_oldest", "error", "compact")


_STATUS_CHECK = "CHECK (status IN ('complete', 'streaming', 'stopped', 'interrupted'))"
_PREPARED_CHECK = "CHECK (prepared IS NULL OR prepared IN ('unseen', 'seen'))"
_ROLE_CHECK = "CHECK (role IN ('system', 'user', 'assistant', 'tool'))"
TOOL_SERVER_KINDS = ("stdio", "http")

# The messages table, named {name} (the migration to version 6 builds it beside the old one).
MESSAGES_DDL = f"""CREATE TABLE {{name}} (
        id INTEGER PRIMARY KEY,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE,
        role TEXT NOT NULL {_ROLE_CHECK},
        content TEXT NOT NULL,
        created REAL NOT NULL,
        sampling TEXT,
        active_child_id INTEGER REFERENCES messages(id) ON DELETE SET NULL,
        status TEXT NOT NULL DEFAULT 'complete' {_STATUS_CHECK},
        stats TEXT NOT NULL DEFAULT '{{{{}}}}',
        prepared TEXT {_PREPARED_CHECK},
        token_ids TEXT,
        extra TEXT NOT NULL DEFAULT '{{{{}}}}'
    )"""
_MESSAGE_INDEXES = [
    "CREATE INDEX messages_conversation ON messages(conversation_id)",
    "CREATE INDEX messages_parent ON messages(parent_id)",
    "CREATE INDEX messages_status ON messages(status)",
]
# Times are Unix seconds (REAL); sampling, stats are JSON text.
CREATE_CURRENT = [
    """CREATE TABLE conversations (
        id INTEGER PRIMARY KEY,
        title TEXT NOT NULL,
        created REAL NOT NULL,
        updated REAL NOT NULL,
        system_prompt TEXT NOT NULL DEFAULT '',
        model TEXT,
        sampling TEXT NOT NULL DEFAULT '{}',
        active_root_id INTEGER REFERENCES messages(id) ON DELETE SET NULL,
        options TEXT NOT NULL DEFAULT '{}',
        context_policy TEXT NOT NULL DEFAULT 'drop_oldest',
        pinned INTEGER NOT NULL DEFAULT 0 CHECK (pinned IN (0, 1)),
        archived INTEGER NOT NULL DEFAULT 0 CHECK (archived IN (0, 1))
    )""",
    MESSAGES_DDL.format(name="messages"),
    *_MESSAGE_INDEXES,
]
# Version 4's tables: in CREATE_CURRENT and, for an older file, in MIGRATIONS[3].
_APP_TABLES = [
    "CREATE TABLE app_settings (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE presets (
        name TEXT PRIMARY KEY,
        system_prompt TEXT NOT NULL,
        created REAL NOT NULL
    )""",
]
CREATE_CURRENT += _APP_TABLES
# Version 5's table (its columns of `conversations` are in the DDL above and in MIGRATIONS[4]).
_TAGS = [
    """CREATE TABLE tags (
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        tag TEXT NOT NULL,
        PRIMARY KEY (conversation_id, tag)
    ) WITHOUT ROWID""",
    "CREATE INDEX tags_tag ON tags(tag)",
]
CREATE_CURRENT += _TAGS
# Version 6's table.
_TOOL_SERVERS = [
    """CREATE TABLE tool_servers (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('stdio', 'http')),
        target TEXT NOT NULL,
        created REAL NOT NULL
    )""",
]
CREATE_CURRENT += _TOOL_SERVERS
# Version 7's table.
_ALTERNATIVES = [
    """CREATE TABLE token_alternatives (
        message_id INTEGER PRIMARY KEY REFERENCES messages(id) ON DELETE CASCADE,
        data BLOB NOT NULL
    )""",
]
CREATE_CURRENT += _ALTERNATIVES
# Version 8's table.
_IMAGES = [
    """CREATE TABLE images (
        sha256 TEXT PRIMARY KEY,
        mime TEXT NOT NULL,
        width INTEGER NOT NULL,
        height INTEGER NOT NULL,
        data BLOB NOT NULL
    )""",
]
CREATE_CURRENT += _IMAGES
_MESSAGE_COLUMNS = ("id, conversation_id, parent_id, role, content, created, sampling,"
                    " active_child_id, status, stats, prepared, token_ids")
# Version 5 -> 6: messages copied into the new table, which then takes the old one's place
# (foreign keys are off meanwhile: `migrate`); the full-text triggers go with the old table and
# fts.ensure_index makes them again.
_REBUILD_MESSAGES = [
    MESSAGES_DDL.format(name="messages_v6"),
    f"INSERT INTO messages_v6 ({_MESSAGE_COLUMNS}) SELECT {_MESSAGE_COLUMNS} FROM messages",
    "DROP TABLE messages",
    "ALTER TABLE messages_v6 RENAME TO messages",
    *_MESSAGE_INDEXES,
    *_TOOL_SERVERS,
]

# Tree queries (recursive CTEs, no depth limit): the active path of conversation ?, from its
# active root down the active children; the path from the root down to message ?; the ids of
# message ? and all its descendants.
ACTIVE_PATH_SQL = """
    WITH RECURSIVE p(id, depth) AS (
        SELECT active_root_id, 0 FROM conversations WHERE id = ? AND active_root_id IS NOT NULL
        UNION ALL SELECT m.active_child_id, p.depth + 1 FROM messages m JOIN p ON m.id = p.id
        WHERE m.active_child_id IS NOT NULL)
    SELECT messages.* FROM p JOIN messages ON messages.id = p.id ORDER BY p.depth"""
PATH_TO_SQL = """
    WITH RECURSIVE p(id, depth) AS (
        SELECT ?, 0
        UNION ALL SELECT m.parent_id, p.depth + 1 FROM messages m JOIN p ON m.id = p.id
        WHERE m.parent_id IS NOT NULL)
    SELECT messages.* FROM p JOIN messages ON messages.id = p.id ORDER BY p.depth DESC"""
SUBTREE_SQL = """
    WITH RECURSIVE t(id) AS (
        SELECT ? UNION ALL SELECT m.id FROM messages m JOIN t ON m.parent_id = t.id)
    SELECT id FROM t"""


# MIGRATIONS[v] takes a file from version v to v + 1.
MIGRATIONS: dict[int, list[str]] = {
    1: [
        f"ALTER TABLE messages ADD COLUMN status TEXT NOT NULL DEFAULT 'complete' {_STATUS_CHECK}",
        "ALTER TABLE messages ADD COLUMN stats TEXT NOT NULL DEFAULT '{}'",
        "CREATE INDEX messages_status ON messages(status)",
    ],
    2: [
        f"ALTER TABLE messages ADD COLUMN prepared TEXT {_PREPARED_CHECK}",
        "ALTER TABLE conversations ADD COLUMN options TEXT NOT NULL DEFAULT '{}'",
        "ALTER TABLE messages ADD COLUMN token_ids TEXT",
        "ALTER TABLE conversations ADD COLUMN context_policy TEXT NOT NULL DEFAULT 'drop_oldest'",
    ],
    3: _APP_TABLES,
    4: [
        "ALTER TABLE conversations ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0"
        " CHECK (pinned IN (0, 1))",
        "ALTER TABLE conversations ADD COLUMN archived INTEGER NOT NULL DEFAULT 0"
        " CHECK (archived IN (0, 1))",
        *_TAGS,
    ],   # and the full-text index: fts.ensure_index, run after every migration
    5: _REBUILD_MESSAGES,
    6: _ALTERNATIVES,
    7: _IMAGES,
}
# Migrations that rebuild a table another one references: run with foreign keys off (a DROP
# TABLE would otherwise run the references' ON DELETE actions), checked before commit.
_FOREIGN_KEYS_OFF = {5}


def user_version(db: Database) -> int:
    return db.execute("PRAGMA user_version").fetchone()[0]


def migrate(db: Database, path: Path) -> int:
    """Bring the file to SCHEMA_VERSION, each step in one transaction; returns the old version."""
    old = user_version(db)
    if old > SCHEMA_VERSION:
        raise StoreError(f"{path} has schema version {old}, newer than this localpaged "
                         f"({SCHEMA_VERSION}): upgrade localpaged or choose another data dir")
    if old == 0:
        _create(db, path)
        return old
    for version in range(old, SCHEMA_VERSION):
        if version in _FOREIGN_KEYS_OFF:
            _run_without_foreign_keys(db, MIGRATIONS[version], version + 1)
        else:
            _run(db, MIGRATIONS[version], version + 1)
        log.info("migrated %s from schema version %d to %d", path, version, version + 1)
    return old


def _create(db: Database, path: Path) -> None:
    if db.table_names():
        raise StoreError(f"{path} is a SQLite database but not a localpaged store (it has "
                         "tables but no schema version): choose another data dir")
    _run(db, CREATE_CURRENT, SCHEMA_VERSION)
    log.info("created conversation store %s (schema version %d)", path, SCHEMA_VERSION)


def _run(db: Database, statements: list[str], version: int) -> None:
    with db.atomic():
        for sql in statements:
            db.execute(sql)
        db.execute(f"PRAGMA user_version = {int(version)}")


def _run_without_foreign_keys(db: Database, statements: list[str], version: int) -> None:
    """`_run` with foreign keys off (PRAGMA foreign_keys cannot change inside a transaction),
    the references checked before the commit: a violation rolls the step back."""
    db.execute("PRAGMA foreign_keys = OFF")
    try:
        with db.atomic():
            for sql in statements:
                db.execute(sql)
            bad = db.execute("PRAGMA foreign_key_check").fetchall()
            if bad:
                raise StoreError(f"migrating to schema version {version} broke {len(bad)} "
                                 f"reference(s), e.g. {bad[0]}: nothing was changed")
            db.execute(f"PRAGMA user_version = {int(version)}")
    finally:
        db.execute("PRAGMA foreign_keys = ON")
