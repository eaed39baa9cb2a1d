"""Tests of the store's organisation (ui/store/organise.py, fts.py; schema 5): the full-text
index over every branch kept in step with every write, the migration from schema 4 that indexes
what was there and keeps every row, the LIKE fallback where SQLite has no FTS5, pin, archive,
tags, and tags through export and import."""

from __future__ import annotations

import logging
import sqlite3

import pytest
from helpers.store_versions import old_store
from test_store import chat, check_active_invariant, ids, store  # noqa: F401

from localpaged.ui.store import Store
from localpaged.ui.store import db as store_db
from localpaged.ui.store.fts import FTS_TABLE, fts_query
from localpaged.ui.store.organise import MAX_TAG_CHARS, MAX_TAGS
from localpaged.ui.store.schema import SCHEMA_VERSION


def hit_ids(store, text, **kw):
    return [h.message_id for h in store.search_messages(text, **kw)]


def index_ok(store) -> None:
    """FTS5's own check that the index matches the rows of `messages`."""
    store.db.execute(f"INSERT INTO {FTS_TABLE}({FTS_TABLE}, rank) VALUES ('integrity-check', 1)")


def test_search_finds_every_branch_and_follows_every_write(store, chat):
    c, u1, a1, a1b, u1b, a2 = chat
    # "Kyoto" is only in a1b, a sibling off the active path (a1 is active under u1).
    assert store.active_path(c.id)[-1].id == a2.id
    [hit] = store.search_messages("kyoto")
    assert (hit.message_id, hit.conversation_id, hit.role, hit.title) == (
        a1b.id, c.id, "assistant", "Trip plans")
    assert hit.parts() == [("Kyoto", True), (".", False)]
    assert hit_ids(store, "kyo") == [a1b.id]                     # the last word is a prefix
    assert set(hit_ids(store, "go where")) == {u1.id, u1b.id}    # all words, any order
    store.update_message(a1b.id, content="Kyoto, then Nara.")    # a streaming rewrite
    assert hit_ids(store, "nara") == [a1b.id] and hit_ids(store, "kyoto") == [a1b.id]
    store.update_message(a1b.id, content="Osaka.")
    assert hit_ids(store, "kyoto") == [] and hit_ids(store, "osaka") == [a1b.id]
    store.delete_message(u1.id)                                  # a subtree
    assert hit_ids(store, "osaka") == [] and hit_ids(store, "may") == []
    assert hit_ids(store, "june") == [u1b.id]
    fork = store.fork_conversation(a2.id)
    assert set(hit_ids(store, "oslo")) == {a2.id, store.active_path(fork.id)[-1].id}
    store.delete_conversation(c.id)
    assert [h.conversation_id for h in store.search_messages("oslo")] == [fork.id]
    index_ok(store)


def test_search_words_are_never_syntax(store):
    c = store.create_conversation("q")
    m = store.add_message(c.id, None, "user", 'He said "NEAR(a b)" AND OR NOT * ^ col:x - +')
    for text in ['"', '""', "NEAR(a", "AND", "col:x", "*", "^", "-", "'", "a\"b", "%", "\\"]:
        store.search_messages(text)                              # never an FTS5 syntax error
        store.list_conversations(text)
    assert hit_ids(store, 'said "near') == [m.id]
    assert hit_ids(store, "and or not") == [m.id]
    assert fts_query("   ") is None and store.search_messages("  ") == []


def test_list_matches_title_or_any_branch_pinned_first(store, chat):
    c, *_ = chat
    other = store.create_conversation("Kyoto notes")
    plain = store.create_conversation("Dinner")
    assert ids(store.list_conversations("kyoto")) == [other.id, c.id]   # title; a sibling branch
    assert ids(store.list_conversations()) == [plain.id, other.id, c.id]
    before = store.get_conversation(c.id)
    pinned = store.set_pinned(c.id, True)
    assert pinned.pinned and pinned.updated == before.updated     # the order of use is kept
    assert ids(store.list_conversations()) == [c.id, plain.id, other.id]
    store.set_archived(plain.id, True)
    assert ids(store.list_conversations(archived=False)) == [c.id, other.id]
    assert ids(store.list_conversations(archived=True)) == [plain.id]
    assert ids(store.list_conversations()) == [c.id, plain.id, other.id]     # None: all
    store.add_message(plain.id, None, "user", "kyoto again")
    assert plain.id not in [h.conversation_id for h in store.search_messages("kyoto")]
    assert plain.id in [h.conversation_id for h in store.search_messages("kyoto", archived=None)]
    assert not store.set_archived(plain.id, False).archived
    assert not store.set_pinned(c.id, False).pinned
    with pytest.raises(KeyError):
        store.set_pinned(999, True)


def test_tags(store, chat):
    c, *_ = chat
    other = store.create_conversation("Other")
    assert store.set_tags(c.id, " travel ,  work  trips,travel,, ").tags == ["travel", "work trips"]
    store.set_tags(other.id, ["work trips"])
    assert store.all_tags() == ["travel", "work trips"]
    assert ids(store.list_conversations(tag="work trips")) == [other.id, c.id]
    assert ids(store.list_conversations(tag="travel")) == [c.id]
    assert ids(store.list_conversations("lisbon", tag="work trips")) == [c.id]
    for bad in (["x" * (MAX_TAG_CHARS + 1)], [f"t{i}" for i in range(MAX_TAGS + 1)], [1], 5):
        with pytest.raises(ValueError):
            store.set_tags(other.id, bad)
    assert store.get_conversation(other.id).tags == ["work trips"]        # unchanged
    store.set_tags(other.id, [])
    assert store.all_tags() == ["travel", "work trips"]             # c still has both
    assert store.get_conversation(other.id).tags == []
    store.delete_conversation(c.id)
    assert store.all_tags() == []


def test_tags_travel_with_export_and_import(store, chat):
    c, *_ = chat
    store.set_tags(c.id, ["travel"])
    store.set_pinned(c.id, True)
    data = store.export_json(c.id)
    copy = store.import_json(data)
    assert copy.tags == ["travel"] and not copy.pinned and not copy.archived
    assert len(store.messages(copy.id)) == len(store.messages(c.id))
    before = {conv.id: store.export_json(conv.id) for conv in store.list_conversations()}
    data["conversation"]["tags"] = ["x" * (MAX_TAG_CHARS + 1)]
    with pytest.raises(ValueError, match=r"conversation\.tags"):
        store.import_json(data)
    data["conversation"]["tags"] = "travel"
    with pytest.raises(ValueError, match=r"conversation\.tags: expected a list"):
        store.import_json(data)
    assert {conv.id: store.export_json(conv.id) for conv in store.list_conversations()} == before


def v4_store(tmp_path):
    """A store file as schema version 4 left it, with a reply's sibling."""
    path = tmp_path / "v4.db"
    conn = old_store(path, 4, rows=True)
    conn.execute("INSERT INTO messages VALUES (3, 1, 1, 'assistant', 'a sibling about zebras',"
                 " 3.0, NULL, NULL, 'complete', '{}', NULL, NULL)")
    conn.commit()
    conn.close()
    return path


def dump(path, table):
    conn = sqlite3.connect(path)
    try:
        return conn.execute(f"SELECT * FROM {table} ORDER BY id").fetchall()
    finally:
        conn.close()


def test_migration_from_v4_indexes_and_keeps_every_row(tmp_path):
    old = v4_store(tmp_path)
    messages, conversations = dump(old, "messages"), dump(old, "conversations")
    with Store(old) as s:
        assert s.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 5
        assert hit_ids(s, "zebras") == [3] and hit_ids(s, "hello") == [2]
        conv = s.get_conversation(1)
        assert (conv.pinned, conv.archived, conv.tags) == (False, False, [])
        index_ok(s)
    assert [row[:len(messages[0])] for row in dump(old, "messages")] == messages
    assert [row[:len(conversations[0])] for row in dump(old, "conversations")] == conversations
    with Store(tmp_path / "fresh.db") as fresh:
        cols = "SELECT name, type, \"notnull\", dflt_value FROM pragma_table_info('conversations')"
        assert fresh.db.execute(cols).fetchall() == sqlite3.connect(old).execute(cols).fetchall()


def test_without_fts5_search_falls_back_to_like_and_the_index_is_rebuilt_later(
        tmp_path, monkeypatch, caplog):
    path = tmp_path / "chat.db"
    with Store(path) as s:
        c = s.create_conversation("t")
        first = s.add_message(c.id, None, "user", "written with the index")
    monkeypatch.setattr(store_db, "fts5_available", lambda db: False)
    with caplog.at_level(logging.WARNING), Store(path) as s:
        assert "no FTS5" in caplog.text and s.fts is False
        later = s.add_message(c.id, first.id, "assistant", "written without it: quokka")
        s.update_message(first.id, content="rewritten without it")
        [hit] = s.search_messages("quokk")                       # a substring, via LIKE
        assert hit.message_id == later.id and hit.parts()[-2:] == [("quokk", True), ("a", False)]
        assert ids(s.list_conversations("without it")) == [c.id]
    monkeypatch.undo()
    with Store(path) as s:                                       # FTS5 again: rebuilt
        assert s.fts is True
        assert hit_ids(s, "quokka") == [later.id] and hit_ids(s, "rewritten") == [first.id]
        assert hit_ids(s, "index") == []
        index_ok(s)


def test_delete_keeps_the_index_and_the_tree(store, chat):
    c, u1, a1, a1b, u1b, a2 = chat
    store.set_active(a1b.id)
    store.delete_message(a1b.id)
    assert ids(store.active_path(c.id)) == [u1.id, a1.id]
    check_active_invariant(store, c.id)
    assert hit_ids(store, "kyoto") == [] and hit_ids(store, "lisbon") == [a1.id]
    index_ok(store)
