"""Tests of the conversation store (ui/store/): message trees and branches, fork, export and
import, search, deletion, schema migration, and the failure cases (damaged file, locked file,
writer killed mid-reply)."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers.store_versions import check_active_invariant, v1_store

from localpaged.ui import store as store_module
from localpaged.ui.store import DB_FILENAME, Store, StoreError, default_data_dir
from localpaged.ui.store.schema import SCHEMA_VERSION


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "chat.db")
    yield s
    s.close()


def ids(messages):
    return [m.id for m in messages]


@pytest.fixture
def chat(store):
    """u1 -> a1; the reply regenerated (a1b, a sibling), then u1 edited (u1b, a new root) and
    answered (a2)."""
    c = store.create_conversation("Trip plans", "Be brief.", "smollm2", {"temperature": 0.7})
    u1 = store.add_message(c.id, None, "user", "Where to go in May?")
    a1 = store.add_message(c.id, u1.id, "assistant", "Lisbon.", {"temperature": 0.7})
    a1b = store.add_message(c.id, u1.id, "assistant", "Kyoto.", {"temperature": 1.2})
    u1b = store.add_message(c.id, None, "user", "Where to go in June?")
    a2 = store.add_message(c.id, u1b.id, "assistant", "Oslo.")
    return c, u1, a1, a1b, u1b, a2


def test_tree_regenerate_edit_and_switch(store, chat):
    c, u1, a1, a1b, u1b, a2 = chat
    assert ids(store.active_path(c.id)) == [u1b.id, a2.id]  # the newest branch is shown
    assert ids(store.children(None, c.id)) == [u1.id, u1b.id]
    assert ids(store.children(u1.id)) == [a1.id, a1b.id]
    assert store.siblings(a1b.id) == ([a1.id, a1b.id], 1)
    assert store.siblings(u1.id) == ([u1.id, u1b.id], 0)
    assert store.siblings(a2.id) == ([a2.id], 0)
    # Back to the first edit: its last regenerated reply is still its active child.
    assert ids(store.set_active(u1.id)) == [u1.id, a1b.id]
    assert ids(store.set_active(a1.id)) == [u1.id, a1.id]
    assert ids(store.path_to(a1b.id)) == [u1.id, a1b.id]
    # set_active on a message off the active path activates its ancestors too.
    assert ids(store.set_active(a2.id)) == [u1b.id, a2.id]
    assert store.get_message(a1b.id).sampling == {"temperature": 1.2}
    check_active_invariant(store, c.id)


def test_add_message_validates(store, chat):
    c, u1, *_ = chat
    other = store.create_conversation("other")
    with pytest.raises(ValueError, match=f"message {u1.id} is not in conversation {other.id}"):
        store.add_message(other.id, u1.id, "assistant", "x")
    with pytest.raises(ValueError, match=r"role must be one of \('system', 'user', 'assistant', 'tool'\), "
                                         r"not 'robot'"):
        store.add_message(c.id, u1.id, "robot", "x")
    with pytest.raises(ValueError, match=r"status must be one of \('complete', .*\), not 'done'"):
        store.add_message(c.id, u1.id, "assistant", "x", status="done")
    with pytest.raises(KeyError, match="no message 10000"):
        store.get_message(10_000)
    with pytest.raises(KeyError, match="no conversation 10000"):
        store.add_message(10_000, None, "user", "x")
    with pytest.raises(TypeError, match=r"update_conversation: unknown fields \['colour'\]"):
        store.update_conversation(c.id, colour="red")


def test_streaming_updates_commit_immediately(store, chat, tmp_path):
    c, u1, *_ = chat
    m = store.add_message(c.id, u1.id, "assistant", "", {"temperature": 0}, status="streaming")
    store.update_message(m.id, content="Par", stats={"ttft_s": 0.05, "prompt_tokens": 12})
    reader = sqlite3.connect(tmp_path / "chat.db")  # another connection sees the partial reply
    assert reader.execute("SELECT content, status FROM messages WHERE id = ?",
                          [m.id]).fetchone() == ("Par", "streaming")
    done = store.update_message(m.id, content="Paris.", status="stopped",
                                stats={"generated_tokens": 3, "finish_reason": "stop"})
    assert (done.content, done.status) == ("Paris.", "stopped")
    assert done.stats == {"ttft_s": 0.05, "prompt_tokens": 12, "generated_tokens": 3,
                          "finish_reason": "stop"}  # merged
    assert reader.execute("SELECT status FROM messages WHERE id = ?", [m.id]).fetchone() == (
        "stopped",)
    reader.close()


def test_fork(store, chat):
    c, u1, a1, a1b, u1b, a2 = chat
    store.update_message(a1.id, stats={"tokens_per_s": 30.0})
    f = store.fork_conversation(a1.id)
    assert (f.title, f.system_prompt, f.model, f.sampling) == (
        "Trip plans (fork)", "Be brief.", "smollm2", {"temperature": 0.7})
    path = store.active_path(f.id)
    assert [(m.role, m.content) for m in path] == [("user", "Where to go in May?"),
                                                   ("assistant", "Lisbon.")]
    assert path[1].stats == {"tokens_per_s": 30.0} and path[1].sampling == {"temperature": 0.7}
    assert set(ids(path)).isdisjoint(ids(store.path_to(a1.id)))  # copies, not shared rows
    assert ids(store.active_path(c.id)) == [u1b.id, a2.id]  # the source is untouched


def normalized(export: dict) -> dict:
    """An export with ids replaced by positions, so two copies of a tree compare equal."""
    pos = {m["id"]: i for i, m in enumerate(export["messages"])}
    pos[None] = None
    conv = {k: v for k, v in export["conversation"].items() if k != "id"}
    conv["active_root_id"] = pos[conv["active_root_id"]]
    msgs = [{**m, "id": pos[m["id"]], "parent_id": pos[m["parent_id"]],
             "active_child_id": pos[m["active_child_id"]], "conversation_id": None}
            for m in export["messages"]]
    return {**export, "conversation": conv, "messages": msgs}


def test_export_import_json_round_trip(store, chat):
    c, u1, a1, a1b, u1b, a2 = chat
    store.set_active(a1.id)  # a non-default active branch must survive
    store.update_message(a2.id, status="stopped", stats={"generated_tokens": 1})
    exported = store.export_json(c.id)
    text = json.dumps(exported)  # JSON-serializable
    imported = store.import_json(json.loads(text))
    assert imported.id != c.id
    assert normalized(store.export_json(imported.id)) == normalized(exported)
    assert [m.content for m in store.active_path(imported.id)] == ["Where to go in May?",
                                                                   "Lisbon."]
    check_active_invariant(store, imported.id)
    with pytest.raises(ValueError, match="import_json: not a localpaged.conversation export"):
        store.import_json({"format": "something else"})
    broken = {**exported, "messages": exported["messages"][1:]}  # a1's parent is missing
    with pytest.raises(ValueError, match=rf"import_json: messages\[0\].parent_id: no message "
                                         rf"has id {u1.id}"):
        store.import_json(broken)


def test_import_failing_midway_writes_nothing(store, chat, monkeypatch):
    exported = store.export_json(chat[0].id)
    before = len(store.list_conversations())
    real, calls = store._insert, []

    def insert(cid, parent_id, role, content, *rest, **kwargs):
        calls.append(content)               # the third message breaks a constraint
        return real(cid, parent_id, role, None if len(calls) == 3 else content, *rest, **kwargs)
    monkeypatch.setattr(store, "_insert", insert)
    with pytest.raises(ValueError, match="import_json: NOT NULL constraint failed: "
                                         "messages.content"):
        store.import_json(exported)
    assert len(calls) == 3
    assert len(store.list_conversations()) == before  # rolled back, nothing half imported


def test_export_markdown_is_the_active_path(store, chat):
    c, u1, a1, a1b, u1b, a2 = chat
    store.set_active(a1b.id)
    store.update_message(a1b.id, status="stopped")
    md = store.export_markdown(c.id)
    assert md.startswith("# Trip plans\n")
    assert "Be brief." in md and "smollm2" in md
    assert "Where to go in May?" in md and "Kyoto." in md and "*(reply stopped)*" in md
    assert "Lisbon." not in md and "June" not in md and "Oslo." not in md
    assert md.index("### User") < md.index("### Assistant")


def test_search_and_order(store):
    a = store.create_conversation("Rust lifetimes")
    b = store.create_conversation("Dinner")
    store.add_message(b.id, None, "user", "A recipe with 100% RYE flour?")
    c = store.create_conversation("Empty")
    assert ids(store.list_conversations()) == [c.id, b.id, a.id]  # newest first
    store.add_message(a.id, None, "user", "what is 'a")  # a write bumps a conversation
    assert ids(store.list_conversations())[0] == a.id
    assert ids(store.list_conversations("rust")) == [a.id]  # title, any case
    assert ids(store.list_conversations("rye flour")) == [b.id]  # message content
    assert ids(store.list_conversations("100%")) == [b.id]  # % is literal
    assert ids(store.list_conversations("1_0")) == []  # _ is literal
    assert store.list_conversations("nowhere") == []
    renamed = store.rename_conversation(c.id, "Rust macros")
    assert renamed.title == "Rust macros" and renamed.updated >= renamed.created
    assert set(ids(store.list_conversations("RUST"))) == {a.id, c.id}


def test_update_conversation(store):
    c = store.create_conversation("t")
    u = store.update_conversation(c.id, system_prompt="Pirate.", model="m2",
                                  sampling={"top_p": 0.9})
    assert (u.system_prompt, u.model, u.sampling) == ("Pirate.", "m2", {"top_p": 0.9})
    assert store.get_conversation(c.id) == u


def count(path: Path, sql: str, *args) -> int:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql, args).fetchone()[0]
    finally:
        conn.close()


def test_delete_cascades(store, chat, tmp_path):
    c, *_ = chat
    other = store.create_conversation("keep")
    store.add_message(other.id, None, "user", "hello")
    assert store.delete_conversation(c.id) is True
    assert store.delete_conversation(c.id) is False
    with pytest.raises(KeyError, match=f"no conversation {c.id}"):
        store.get_conversation(c.id)
    db = tmp_path / "chat.db"
    assert count(db, "SELECT count(*) FROM messages WHERE conversation_id = ?", c.id) == 0
    assert count(db, "SELECT count(*) FROM messages") == 1


def test_delete_deep_conversation(store):
    # A chain deeper than SQLite's trigger depth limit (1000) must still delete.
    msgs = [{"id": i, "parent_id": i - 1 if i else None, "role": "user", "content": str(i)}
            for i in range(1100)]
    c = store.import_json({"format": "localpaged.conversation",
                           "conversation": {"title": "long"}, "messages": msgs})
    assert len(store.active_path(c.id)) == 1100
    assert store.delete_conversation(c.id)
    assert store.list_conversations() == []


def test_delete_message_subtree(store, chat):
    c, u1, a1, a1b, u1b, a2 = chat
    store.set_active(a1b.id)
    store.delete_message(a1b.id)
    assert ids(store.active_path(c.id)) == [u1.id, a1.id]  # the remaining sibling is active
    store.delete_message(u1.id)  # a root with its replies
    assert ids(store.active_path(c.id)) == [u1b.id, a2.id]
    assert ids(store.children(None, c.id)) == [u1b.id]
    check_active_invariant(store, c.id)


def test_migration_from_v1(tmp_path):
    old = v1_store(tmp_path)
    with Store(old) as s:
        path = s.active_path(1)
        assert [(m.content, m.status, m.stats) for m in path] == [("hi", "complete", {}),
                                                                 ("hello", "complete", {})]
        assert path[1].sampling == {"temperature": 0}
        s.update_message(2, status="stopped", stats={"generated_tokens": 1})
    with Store(tmp_path / "fresh.db"):
        pass
    info = "SELECT group_concat(name || ' ' || type || ' ' || \"notnull\" || ' ' || " \
           "ifnull(dflt_value, ''), ',') FROM pragma_table_info('messages')"
    assert count(old, info) == count(tmp_path / "fresh.db", info)  # same schema as a new file
    assert count(old, "PRAGMA user_version") == SCHEMA_VERSION  # migrated to the current one
    assert count(old, "SELECT count(*) FROM sqlite_master WHERE name = 'messages_status'") == 1
    with Store(old) as s:  # reopening does not migrate again
        assert s.get_message(2).status == "stopped"


def test_newer_schema_is_refused(tmp_path):
    db = tmp_path / "new.db"
    Store(db).close()
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(StoreError, match="newer"):
        Store(db)


def test_not_a_database(tmp_path):
    bad = tmp_path / "chat.db"
    bad.write_bytes(b"this is not sqlite\n" * 200)
    with pytest.raises(StoreError) as e:
        Store(bad)
    assert str(bad) in str(e.value) and e.value.cause == "damaged"
    assert "aside" not in str(e.value) and "move" not in str(e.value)
    foreign = tmp_path / "other.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE t (x)")
    conn.close()
    with pytest.raises(StoreError, match="not a localpaged store"):
        Store(foreign)


def test_damaged_database(tmp_path):
    db = tmp_path / "chat.db"
    with Store(db) as s:
        c = s.create_conversation("big")
        parent = None
        for i in range(40):
            parent = s.add_message(c.id, parent, "user", f"message {i} " + "x" * 2000).id
    assert not Path(str(db) + "-wal").exists() or Path(str(db) + "-wal").stat().st_size == 0
    data = bytearray(db.read_bytes())
    page = 4096
    assert len(data) > 10 * page
    data[3 * page:8 * page] = b"\xde\xad\xbe\xef" * (5 * page // 4)  # trash pages 4-8
    db.write_bytes(bytes(data))
    with pytest.raises(StoreError) as e:
        Store(db)
    assert str(db) in str(e.value)


def test_locked_database_raises_and_loses_nothing(tmp_path):
    db = tmp_path / "chat.db"
    s = Store(db, busy_timeout_ms=100)
    c = s.create_conversation("t")
    u = s.add_message(c.id, None, "user", "hi")
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    # the lock wait is bounded by busy_timeout_ms (sqlite's own setting), not by the default 5 s
    assert s.db.execute("PRAGMA busy_timeout").fetchone()[0] == 100
    with pytest.raises(StoreError, match="database is locked"):
        s.add_message(c.id, u.id, "assistant", "hello")
    with pytest.raises(StoreError, match="database is locked"):
        s.update_message(u.id, content="changed")
    other.execute("ROLLBACK")
    other.close()
    assert ids(s.active_path(c.id)) == [u.id]  # nothing half-written
    assert s.get_message(u.id).content == "hi"
    a = s.add_message(c.id, u.id, "assistant", "hello")  # the retry succeeds
    assert ids(s.active_path(c.id)) == [u.id, a.id]
    s.close()


def test_threads_share_one_store(store):
    c = store.create_conversation("t")
    errors = []

    def work(n):
        try:
            for i in range(20):
                m = store.add_message(c.id, None, "user", f"{n}-{i}")
                store.update_message(m.id, content=f"{n}-{i}!", status="complete")
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(store.children(None, c.id)) == 80
    check_active_invariant(store, c.id)


# The writer loads ui/ as a bare package: importing localpaged/__init__ (torch) would take
# seconds, and only the store is under test.
WRITER = """
import sys, types
pkg = types.ModuleType("_ui")
pkg.__path__ = [sys.argv[2]]
sys.modules["_ui"] = pkg
from _ui.store import Store
s = Store(sys.argv[1])
c = s.create_conversation("crash test")
u = s.add_message(c.id, None, "user", "Count for me.")
a = s.add_message(c.id, u.id, "assistant", "", status="streaming")
text = ""
for i in range(10**9):
    text += f"{i} "
    s.update_message(a.id, content=text, stats={"generated_tokens": i + 1})
    if i == 0:
        print("committed", c.id, a.id, flush=True)
"""


def _words_of(db: Path, message_id: int) -> int:
    """Words of a message as committed now, read through a connection of our own."""
    conn = sqlite3.connect(db, timeout=10)
    try:
        row = conn.execute("SELECT content FROM messages WHERE id = ?", (message_id,)).fetchone()
    finally:
        conn.close()
    return len(row[0].split()) if row else 0


def test_writer_killed_mid_reply_keeps_partial_reply(tmp_path):
    db = tmp_path / "chat.db"
    ui_dir = str(Path(store_module.__file__).parent)
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(db), ui_dir],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().split()
        assert line and line[0] == "committed", "the writer did not start"
        # let it commit many updates, then cut it off (most likely mid-transaction)
        deadline = time.monotonic() + 60
        while _words_of(db, int(line[2])) < 200:
            assert time.monotonic() < deadline and proc.poll() is None, "the writer stalled"
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    cid, mid = int(line[1]), int(line[2])
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    conn.close()
    with Store(db) as s:
        reply = s.get_message(mid)
        assert reply.status == "streaming" and reply.content.startswith("0 1 ")
        assert reply.stats["generated_tokens"] == len(reply.content.split())
        assert s.mark_interrupted() == 1
        path = s.active_path(cid)
        assert [m.status for m in path] == ["complete", "interrupted"]
        assert path[1].content == reply.content  # the partial reply is kept
        assert s.mark_interrupted() == 0


def test_default_data_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("LOCALPAGED_DATA_DIR", str(tmp_path / "d"))
    assert default_data_dir() == tmp_path / "d"
    monkeypatch.delenv("LOCALPAGED_DATA_DIR")
    if sys.platform.startswith("linux"):
        monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
        assert default_data_dir() == tmp_path / "xdg" / "localpaged"
        monkeypatch.delenv("XDG_DATA_HOME")
        assert default_data_dir() == Path.home() / ".local" / "share" / "localpaged"


def test_directory_path_holds_the_default_file(tmp_path):
    with Store(tmp_path) as s:
        assert s.path == tmp_path / DB_FILENAME
    assert (tmp_path / DB_FILENAME).exists()
