"""Compaction that keeps the original: under the context policy "compact", a send that no
longer fits makes a new branch (the system prompt, the model's summary of the oldest turns,
copies of the recent turns) and is answered there; the original path's rows stay byte for byte
in SQLite, one sibling step away. Oracle: the requests the backend was sent (RecordingBackend),
the stored rows read through a connection of its own, and the tokenizer's chat template."""

from __future__ import annotations

import sqlite3

import pytest

from localpaged.ui import render
from localpaged.ui.context.compact import COMPACT_PROMPT
from localpaged.ui.context.logic import SUMMARY_INTRO
from localpaged.ui.context.view import gauge_html
from localpaged.ui.turns import ChatError

from helpers.tiny_models import build
from helpers.ui_helpers import controller, recording_backend, run

GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": None,
          "max_tokens": 8}
SYSTEM = "ɐɑɒ"
ASK = "ʃʄʅʆ"                  # a short compaction prompt (the tiny tokenizer: 1 token a char)
# One token per character in U+0100..U+02FC for the tiny tokenizer.
WORDS = ["".join(chr(0x100 + (7 * i + j) % 500) for j in range(22)) for i in range(40)]
LIMIT = 512
RESERVE = 8                   # the reply's room: max_tokens, at most a quarter of the context


@pytest.fixture(scope="module")
def backend(tiny_root):
    yield from recording_backend(build("llama-gqa", tiny_root), num_kv_blocks=64,
                                 max_model_len=LIMIT)


@pytest.fixture
def ctl(backend, tmp_path):
    yield from controller(backend, tmp_path, GREEDY)


def rows(db_path, ids: list[int]) -> list[tuple]:
    """SELECT * of these messages, read by a connection of the test's own."""
    con = sqlite3.connect(db_path)
    try:
        marks = ",".join("?" * len(ids))
        return con.execute(f"SELECT * FROM messages WHERE id IN ({marks}) ORDER BY id",
                           ids).fetchall()
    finally:
        con.close()


def template_len(backend, messages) -> int:
    return len(backend.engine.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False))


def chat(ms) -> list[dict]:
    return [{"role": m.role, "content": m.content} for m in ms]


def grow(ctl, cid) -> int:
    """Send words until the next one would not fit; the index of that next word."""
    i = 0
    while not ctl.compaction.needed(cid, WORDS[i]):
        run(ctl.send(cid, WORDS[i]))
        i += 1
    assert i >= 3
    return i


def test_a_send_under_compact_branches_and_keeps_the_original(ctl, backend, tmp_path):
    cid = ctl.new_conversation().id
    ctl.update_settings(cid, SYSTEM, GREEDY)
    assert ctl.set_context_policy(cid, "compact").context_policy == "compact"
    assert ctl.set_compact_prompt(cid, ASK) == ASK
    i = grow(ctl, cid)
    original = ctl.store.active_path(cid)
    ids = [m.id for m in original]
    before = rows(tmp_path / "conversations.db", ids)
    assert "compact the oldest turns" in gauge_html(ctl.context_usage(cid, WORDS[i]))
    n = len(backend.sent)

    turn = run(ctl.send(cid, WORDS[i]))

    assert rows(tmp_path / "conversations.db", ids) == before      # the original, byte for byte
    summary_req, reply_req = backend.sent[n:]
    path = ctl.store.active_path(cid)
    summary, copies, (user, reply) = path[0], path[1:-2], path[-2:]
    k = len(copies)
    assert k >= 2 and k % 2 == 0 and k < len(original)                # whole turns kept
    # The summary: a new root (a sibling of the original's first message), marking what it holds.
    assert summary.role == "system" and summary.parent_id is None
    assert summary.extra["summary_of"] == ids[:len(ids) - k]
    assert summary.content.strip()
    # The summary request: the system prompt, the turns it summarises, then the prompt.
    assert summary_req[0] == ([{"role": "system", "content": SYSTEM}]
                              + chat(original[:len(ids) - k]) + [{"role": "user", "content": ASK}])
    assert summary_req[1][0].max_tokens == GREEDY["max_tokens"]
    # The copies: the recent turns, as they were, marked with the originals.
    assert chat(copies) == chat(original[len(ids) - k:])
    assert [m.extra["copy_of"] for m in copies] == ids[len(ids) - k:]
    assert [m.token_ids for m in copies] == [m.token_ids for m in original[len(ids) - k:]]
    # The new branch's prompt: the system prompt and the summary, the recent turns, the message;
    # where the summary came out longer than its room (the tiny model's text re-tokenizes
    # longer than it was generated), the oldest copies are left out as "drop oldest" would.
    head = [{"role": "system", "content": f"{SYSTEM}\n\n{SUMMARY_INTRO}{summary.content}"}]
    new = [{"role": "user", "content": WORDS[i]}]
    d = next(d for d in range(0, k + 1, 2)
             if template_len(backend, head + chat(copies[d:]) + new) + RESERVE <= LIMIT)
    assert d < k and reply.stats.get("context_dropped", 0) == d
    assert reply_req[0] == head + chat(copies[d:]) + new
    assert user.content == WORDS[i] and reply.id == turn.replies[0].message_id
    assert reply.status == "complete" and reply.stats["generated_tokens"] >= 1
    assert reply.stats["prompt_tokens"] == template_len(backend, reply_req[0])
    # One click away: ‹ 2/2 › at the summary, and the switch back shows the original whole.
    view = ctl.view(cid)
    assert view.siblings[0] == (2, 2)
    shown = render.chat_messages(view)
    assert "‹ 2/2 ›" in shown[0]["content"] and "Summary of" in shown[0]["content"]
    assert [m.id for m in ctl.switch(summary.id, -1)] == ids
    assert [m.id for m in ctl.switch(ids[0], 1)] == [m.id for m in path]
    # The chat goes on past the context: the next send is answered on the new branch.
    # (full again, it compacts the new branch in turn: the earlier summary is summarised too)
    last = run(ctl.send(cid, WORDS[i + 1])).replies[0].message_id
    now = ctl.store.active_path(cid)
    assert now[-1].id == last and now[-1].status == "complete"
    assert now[0].id == summary.id or now[0].extra["summary_of"][0] == summary.id
    assert rows(tmp_path / "conversations.db", ids) == before


def test_compact_button_makes_the_branch_without_a_message(ctl, backend, tmp_path):
    cid = ctl.new_conversation().id
    ctl.update_settings(cid, "", GREEDY)
    ctl.set_compact_prompt(cid, ASK)
    for w in WORDS[:3]:
        run(ctl.send(cid, w))
    original = ctl.store.active_path(cid)
    before = rows(tmp_path / "conversations.db", [m.id for m in original])
    path = ctl.compact(cid)
    assert rows(tmp_path / "conversations.db", [m.id for m in original]) == before
    assert path[0].extra["summary_of"] and path[-1].role == "assistant"
    assert chat(path[1:]) == chat(original[len(original) - len(path) + 1:])
    assert ctl.prompt_messages(cid, path[-1].id)[0] == {
        "role": "system", "content": SUMMARY_INTRO + path[0].content}
    assert len(ctl.store.messages(cid)) == len(original) + len(path)       # nothing deleted


def test_compact_needs_two_turns_and_the_policy_is_checked(ctl):
    cid = ctl.new_conversation().id
    run(ctl.send(cid, WORDS[0]))
    with pytest.raises(ChatError):
        ctl.compact(cid)
    with pytest.raises(ValueError):
        ctl.set_context_policy(cid, "summarise")
    assert ctl.conversation(cid).context_policy == "drop_oldest"
    assert ctl.set_context_policy(cid, "compact").context_policy == "compact"
    assert ctl.store.get_conversation(cid).context_policy == "compact"
    assert ctl.compact_prompt(cid) == COMPACT_PROMPT
    assert ctl.set_compact_prompt(cid, "  ") == COMPACT_PROMPT
    assert "compact_prompt" not in ctl.conversation(cid).options
