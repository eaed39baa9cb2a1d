"""Import against its schema (ui/store/validate.py) and reading rows that a past import or
another program left with wrong types (ui/store/rows.py): a bad export is refused whole, naming
the field and the record; a bad row already stored is read with safe values."""

from __future__ import annotations

import copy
import logging
import sqlite3
import time

import pytest

from localpaged.ui.render import conversation_choices
from localpaged.ui.store import Store
from localpaged.ui.store import rows as rows_module
from localpaged.ui.store.validate import MAX_CONTENT_CHARS, MAX_JSON_DEPTH, check_export


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "chat.db")
    yield s
    s.close()


def export(*msgs, **conversation):
    return {"format": "localpaged.conversation",
            "conversation": {"title": "t", **conversation}, "messages": list(msgs)}


def msg(mid, parent=None, role="user", **fields):
    return {"id": mid, "parent_id": parent, "role": role, "content": f"text {mid}", **fields}


def chain(n):
    """A chain of n messages, leaf first (every parent comes after its child)."""
    return [msg(i, i - 1 if i else None, "user" if i % 2 == 0 else "assistant",
                stats={"generated_tokens": i, "ttft_s": 0.1, "finish_reason": "stop"},
                sampling={"temperature": 0.7, "stop": ["\n\n"]}, created=1.0 + i)
            for i in range(n)][::-1]


def nested(depth):
    """{"a": {"a": ... 1}} with `depth` objects."""
    value = 1
    for _ in range(depth):
        value = {"a": value}
    return value

BAD = [  # (the export, the error it must raise)
    (export(msg(1), {**msg(2, 1), "content": {"text": "hi"}}),
     r"messages\[1\].content: expected a string, got dict"),
    (export({**msg(1), "content": None}), r"messages\[0\].content: missing \(expected a string\)"),
    (export({k: v for k, v in msg(1).items() if k != "role"}), r"messages\[0\].role: missing"),
    (export(msg(1, role="robot")), r"messages\[0\].role: expected one of \['system', 'user', "),
    (export(msg(1, status="done")), r"messages\[0\].status: expected one of"),
    (export(msg(1, stats=[1, 2])), r"messages\[0\].stats: expected an object, got list"),
    (export(msg(1, sampling="hot")), r"messages\[0\].sampling: expected an object, got str"),
    (export(msg(1, created="2024-01-01")), r"messages\[0\].created: expected Unix seconds"),
    (export(msg(1), created="yesterday"), r"conversation.created: expected Unix seconds"),
    (export(msg(1), updated=float("nan")), r"conversation.updated: expected Unix seconds"),
    (export(msg(1), title=["a"]), r"conversation.title: expected a string, got list"),
    (export(msg(1), title="x" * 1001), r"conversation.title: 1001 characters, more than 1000"),
    (export(msg(1), sampling=[]), r"conversation.sampling: expected an object, got list"),
    (export({**msg(1), "content": "x" * (MAX_CONTENT_CHARS + 1)}),
     r"messages\[0\].content: 1000001 characters, more than"),
    (export(msg(1, stats=nested(MAX_JSON_DEPTH + 1))),
     r"messages\[0\].stats(\.a){8}: nested deeper than 8"),
    (export(msg(1, stats={"t": [0, float("inf")]})),
     r"messages\[0\].stats.t\[1\]: expected a finite number, got inf"),
    (export(msg(1, sampling={"stop": {"a", "b"}})),
     r"messages\[0\].sampling.stop: expected a JSON value, got set"),
    (export(msg([1])), r"messages\[0\].id: expected an integer or string id, got list"),
    (export(msg({"a": 1})), r"messages\[0\].id: expected an integer or string id, got dict"),
    (export(msg(True)), r"messages\[0\].id: expected an integer or string id, got bool"),
    (export({k: v for k, v in msg(1).items() if k != "id"}), r"messages\[0\].id: expected an"),
    (export(msg(1), msg(1, 1)), r"messages\[1\].id: id 1 is also messages\[0\]'s"),
    (export(msg(1), msg(2, 7)), r"messages\[1\].parent_id: no message has id 7"),
    (export(msg(1, 2), msg(2, 1)), r"messages\[\d\].parent_id: the messages' parents form a cycle"),
    (export(msg(1, 1)), r"messages\[0\].parent_id: the messages' parents form a cycle"),
    (export(msg(1, active_child_id=9), msg(2, 1)),
     r"messages\[0\].active_child_id: 9 is not one of its children"),
    (export(msg(1), msg(2, 1), active_root_id=2),
     r"conversation.active_root_id: 2 is not one of its roots"),
    (export(msg(1), "hello"), r"messages\[1\]: expected an object, got str"),
    ({"format": "localpaged.conversation", "messages": []}, r"conversation: missing"),
    ({"format": "localpaged.conversation", "conversation": {}, "messages": {"0": {}}},
     r"messages: expected a list, got dict"),
    ([1, 2], r"not a localpaged.conversation export"),
]


@pytest.mark.parametrize("data, error", BAD, ids=[e for _, e in BAD])
def test_a_bad_export_is_refused_whole(store, data, error):
    before = copy.deepcopy(data)
    with pytest.raises(ValueError, match="^import_json: " + error):
        store.import_json(data)
    assert store.list_conversations() == []          # nothing written
    assert data == before                            # the caller's dict is left alone


def test_ids_may_be_strings_and_the_order_is_mended(store):
    c = store.import_json(export(msg("b", "a", "assistant", stats={"generated_tokens": 2}),
                                 msg("a", created=5.0), msg("c", "a", "assistant"),
                                 active_root_id="a"))
    path = store.active_path(c.id)
    assert [m.content for m in path] == ["text a", "text c"]    # the last child is active
    assert path[0].created == 5.0
    siblings = store.children(path[0].id)
    assert [m.content for m in siblings] == ["text b", "text c"]
    assert siblings[0].stats == {"generated_tokens": 2}


def test_an_imported_streaming_reply_is_kept_as_interrupted(store):
    c = store.import_json(export(msg(1), msg(2, 1, "assistant", status="streaming")))
    assert [m.status for m in store.active_path(c.id)] == ["complete", "interrupted"]


def test_the_exports_own_order_and_active_branches_are_kept(store):
    data = export(msg(1, active_child_id=2), msg(2, 1, "assistant"), msg(3, 1, "assistant"))
    c = store.import_json(data)
    assert [m.content for m in store.active_path(c.id)] == ["text 1", "text 2"]
    assert [m.content for m in store.messages(c.id)] == ["text 1", "text 2", "text 3"]


def test_validation_is_linear(store):
    def seconds(n):
        data = export(*chain(n))
        start = time.perf_counter()
        plan = check_export(data)
        took = time.perf_counter() - start
        assert [m["id"] for m in plan.messages] == list(range(n))   # parents first
        return took
    seconds(500)                                     # warm up
    small, large = min(seconds(1000) for _ in range(3)), min(seconds(8000) for _ in range(3))
    assert large / small < 24, (small, large)        # 8x the messages; quadratic would be 64x
    assert min(seconds(4000) for _ in range(3)) < 0.5    # generous, for a busy machine
    c = store.import_json(export(*chain(4000)))
    assert len(store.active_path(c.id)) == 4000


# -- rows a past import left in the database ---------------------------------------------

def write_bad_rows(path):
    """Conversations and messages with values of the wrong type, written as another program
    (or an import before checks existed) could have."""
    conn = sqlite3.connect(path)
    conn.executescript("""
        INSERT INTO conversations (id, title, created, updated, system_prompt, model, sampling,
                                   active_root_id, options, context_policy)
        VALUES (101, 'string times', '2024-05-01T10:00:00', 'yesterday', '', NULL, '"hot"',
                1001, '[1]', 'sometimes');
        INSERT INTO conversations (id, title, created, updated, sampling, active_root_id)
        VALUES (102, X'4869', '2023-11-14T22:13:20.5+00:00', 1700000001, 'not json', 'x');
        INSERT INTO messages (id, conversation_id, parent_id, role, content, created, sampling,
                              active_child_id, status, stats, token_ids)
        VALUES (1001, 101, NULL, 'user', '{"text": "a dict"}', 'noon', '"warm"', 1002,
                'complete', '[1, 2]', '{"a": 1}');
        INSERT INTO messages (id, conversation_id, parent_id, role, content, created, sampling,
                              active_child_id, status, stats, token_ids)
        VALUES (1002, 101, 1001, 'assistant', X'68690a', 12.5, '[1]', NULL, 'complete',
                'null', '[1, "2"]');
    """)
    conn.commit()
    conn.close()


def test_bad_rows_load_with_safe_values(store, caplog):
    store.create_conversation("fine")
    write_bad_rows(store.path)
    rows_module._logged.clear()
    with caplog.at_level(logging.WARNING, logger=rows_module.__name__):
        convs = {c.id: c for c in store.list_conversations()}
        store.list_conversations()                   # read again: nothing new is logged
    bad = convs[101]
    assert bad.created == pytest.approx(time.mktime((2024, 5, 1, 10, 0, 0, 0, 0, -1)))
    assert (bad.updated, bad.sampling, bad.options, bad.context_policy) == (
        0.0, {}, {}, "drop_oldest")
    other = convs[102]
    assert (other.title, other.created, other.sampling, other.active_root_id) == (
        "Hi", 1700000000.5, {}, None)
    logged = [r.getMessage().split()[0] for r in caplog.records]
    assert sorted(logged) == sorted(set(logged))     # each column reported once
    assert "conversations.updated" in logged and "conversations.sampling" in logged
    labels = [label for label, _ in conversation_choices(list(convs.values()))]
    assert len(labels) == 3 and any(label.startswith("string times") for label in labels)

    path = store.active_path(101)
    assert [m.id for m in path] == [1001, 1002]
    user, reply = path
    assert (user.content, user.created, user.sampling, user.stats, user.token_ids) == (
        '{"text": "a dict"}', 0.0, None, {}, None)
    assert (reply.content, reply.sampling, reply.stats, reply.token_ids) == (
        "hi\n", None, {}, None)
    assert [m.id for m in store.messages(101)] == [1001, 1002]
    assert store.export_json(101)["messages"][1]["content"] == "hi\n"


def test_a_good_row_is_read_without_a_warning(store, caplog):
    c = store.create_conversation("t", sampling={"temperature": 0.5})
    store.add_message(c.id, None, "user", "hi", stats={"generated_tokens": 1})
    rows_module._logged.clear()
    with caplog.at_level(logging.WARNING, logger=rows_module.__name__):
        assert store.list_conversations()[0].sampling == {"temperature": 0.5}
        assert store.active_path(c.id)[0].stats == {"generated_tokens": 1}
    assert caplog.records == []
