"""Compaction that keeps the original: under the context policy "compact", a send, regenerate
or edit that no longer fits makes a new branch (the system prompt, the model's summary of the
oldest turns, copies of the recent turns) and is answered there; the original path's rows stay
byte for byte in SQLite, one sibling step away. The summary is a turn: it streams into the
chat, the conversation is busy meanwhile, and Stop leaves every row as it was. Copies keep
their originals' text, tokens and token alternatives, and no generation stats. Oracle: the
requests the backend was sent (RecordingBackend), the stored rows read through a connection of
its own, and the tokenizer's chat template; StepGate holds the engine inside the summary."""

from __future__ import annotations

import sqlite3

import pytest

from localpaged.ui import render
from localpaged.ui.context.compact import COMPACT_PROMPT, COPIED_STATS
from localpaged.ui.context.logic import SUMMARY_INTRO
from localpaged.ui.context.view import gauge_html
from localpaged.ui.turns import ChatError

from helpers.step_gate import StepGate, poll
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


def tables(db_path) -> dict[str, list[tuple]]:
    """SELECT * of every message and token alternative, and each conversation's active root."""
    con = sqlite3.connect(db_path)
    try:
        return {"messages": con.execute("SELECT * FROM messages ORDER BY id").fetchall(),
                "alternatives": con.execute(
                    "SELECT * FROM token_alternatives ORDER BY message_id").fetchall(),
                "roots": con.execute(
                    "SELECT id, active_root_id FROM conversations ORDER BY id").fetchall()}
    finally:
        con.close()


def template_len(backend, messages) -> int:
    return len(backend.engine.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False))


def chat(ms) -> list[dict]:
    return [{"role": m.role, "content": m.content} for m in ms]


def overflows(ctl, cid, word: str) -> bool:
    """Whether sending `word` on the shown path would not fit (and compaction could help)."""
    path = ctl.store.active_path(cid)
    return ctl.compaction.needed(cid, path[-1].id if path else None,
                                 {"role": "user", "content": word})


def grow(ctl, cid) -> int:
    """Send words until the next one would not fit; the index of that next word."""
    i = 0
    while not overflows(ctl, cid, WORDS[i]):
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
    assert turn.final is turn.then and turn.final.error is None

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
    assert user.content == WORDS[i] and reply.id == turn.final.replies[0].message_id
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
    last = run(ctl.send(cid, WORDS[i + 1])).final.replies[0].message_id
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
    turn = run(ctl.compact(cid))
    path = ctl.store.active_path(cid)
    assert turn.then is None and turn.branched == path[-1].id
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


def compacting_conversation(ctl) -> tuple[int, int]:
    """A conversation under policy "compact" grown to the limit; (its id, the next word)."""
    cid = ctl.new_conversation().id
    ctl.update_settings(cid, SYSTEM, GREEDY)
    ctl.set_context_policy(cid, "compact")
    ctl.set_compact_prompt(cid, ASK)
    return cid, grow(ctl, cid)


def live_tokens(ctl, cid, message_id: int) -> int:
    live = ctl.view(cid).live.get(message_id)
    return len(live.token_ids or []) if live is not None else 0


def test_the_summary_streams_and_stop_keeps_every_row(ctl, backend, tmp_path):
    cid, i = compacting_conversation(ctl)
    ids = [m.id for m in ctl.store.active_path(cid)]
    before = tables(tmp_path / "conversations.db")
    gate = StepGate(backend.llm_engine, step=2)
    try:
        turn = ctl.send(cid, WORDS[i])
        gate.wait_held()
        # The tab shows the new branch's summary as it is written: a root, streaming.
        view = ctl.view(cid)
        (summary,) = view.path
        assert summary.role == "system" and summary.parent_id is None
        assert summary.status == "streaming" and view.siblings == [(2, 2)] and view.busy
        assert summary.extra["summary_of"] and summary.extra["summary_of"][0] == ids[0]
        first = poll(lambda: live_tokens(ctl, cid, summary.id), "the summary's first token")
        shown = render.chat_messages(view)[0]["content"]
        assert "Writing a summary" in shown and render.CURSOR.strip() in shown
        # Meanwhile the conversation starts nothing else.
        with pytest.raises(ChatError):
            ctl.send(cid, WORDS[i + 1])
        with pytest.raises(ChatError):
            ctl.compact(cid)
        # It grows: two engine steps later it holds more tokens.
        later = StepGate(backend.llm_engine, step=2)
        gate.close()
        gate = later
        gate.wait_held()
        poll(lambda: live_tokens(ctl, cid, summary.id) > first, "the summary to grow")
        assert ctl.stop(cid)
    finally:
        gate.close()
    assert turn.wait(30) and turn.error is None
    assert turn.branched is None and turn.then is None                 # nothing was sent
    assert tables(tmp_path / "conversations.db") == before             # every row as it was
    assert [m.id for m in ctl.store.active_path(cid)] == ids and not ctl.busy(cid)
    # and the conversation goes on: the same send now compacts to the end
    assert run(ctl.send(cid, WORDS[i])).final.replies[0].status == "complete"


def check_branch(ctl, backend, original: list, path: list, copied_user: bool) -> None:
    """The new branch `path` of a regenerate or edit of original[-2]: the summary of the
    oldest messages, copies of the ones after (with their tokens and token alternatives and no
    generation stats of their own), the user message, its reply."""
    summary, copies, (user, reply) = path[0], path[1:-2], path[-2:]
    ids = [m.id for m in original[:-2]]
    k = len(copies)
    assert summary.role == "system" and summary.extra["summary_of"] == ids[:len(ids) - k]
    assert [m.extra["copy_of"] for m in copies] == ids[len(ids) - k:]
    assert k >= 2 and chat(copies) == chat(original[len(ids) - k:-2])
    assert (user.extra.get("copy_of") == original[-2].id) is copied_user
    assert reply.role == "assistant" and reply.status == "complete"
    assert reply.stats["generated_tokens"] >= 1 and reply.stats["tokens_per_s"] is not None
    for copy, orig in zip(copies, original[len(ids) - k:]):
        assert copy.token_ids == orig.token_ids
        assert ctl.store.alternatives(copy.id) == ctl.store.alternatives(orig.id)
        assert set(copy.stats) <= set(COPIED_STATS)
        if copy.role == "assistant":
            alts = ctl.store.alternatives(copy.id)
            assert alts and len(alts) == len(copy.token_ids)
            assert orig.stats["tokens_per_s"] is not None and "ttft_s" in orig.stats
            assert ctl.reply_tokens(copy.id) == ctl.reply_tokens(orig.id)
    view = ctl.view(summary.conversation_id)
    shown = render.chat_messages(view)
    for n, m in enumerate(path):
        if "copy_of" in m.extra and m.role == "assistant":
            assert render.COPY_NOTE in shown[n]["content"]
            assert "tok/s" not in shown[n]["content"] and "TTFT" not in shown[n]["content"]
    assert "tok/s" in shown[-1]["content"]


def test_regenerate_and_edit_under_compact_branch_first(ctl, backend, tmp_path):
    cid, i = compacting_conversation(ctl)
    ctl.set_context_policy(cid, "drop_oldest")
    run(ctl.send(cid, WORDS[i]))                     # sent with the oldest turns left out
    ctl.set_context_policy(cid, "compact")
    original = ctl.store.active_path(cid)
    ids = [m.id for m in original]
    before = rows(tmp_path / "conversations.db", ids)
    user, reply = original[-2:]
    # Regenerate the last reply: its prompt no longer fits, so it is asked on a summary branch
    # holding a copy of its message.
    n = len(backend.sent)
    turn = run(ctl.regenerate(reply.id))
    assert turn.final.error is None and turn.branched is not None
    summary_req, reply_req = backend.sent[n:]
    assert summary_req[0][-1] == {"role": "user", "content": ASK}
    path = ctl.store.active_path(cid)
    check_branch(ctl, backend, original, path, copied_user=True)
    assert path[-2].content == user.content and path[-1].id == turn.final.replies[0].message_id
    assert reply_req[0][-1] == {"role": "user", "content": user.content}
    assert reply_req[0][0]["content"].startswith(f"{SYSTEM}\n\n{SUMMARY_INTRO}")
    assert rows(tmp_path / "conversations.db", ids) == before
    # Edit the last message: the new text goes on a summary branch of its own.
    n = len(backend.sent)
    turn = run(ctl.edit(user.id, WORDS[i + 1]))
    assert turn.final.error is None and len(backend.sent) == n + 2
    path = ctl.store.active_path(cid)
    check_branch(ctl, backend, original, path, copied_user=False)
    assert path[-2].content == WORDS[i + 1]
    assert backend.sent[-1][0][-1] == {"role": "user", "content": WORDS[i + 1]}
    assert rows(tmp_path / "conversations.db", ids) == before
    roots = ctl.store.children(None, cid)
    assert len(roots) == 3 and roots[0].id == ids[0]           # the original and two branches


def test_a_summary_cut_by_a_crash_says_so(ctl):
    """A summary the app stopped writing (a crash: mark_interrupted at the next start) stays
    as a branch of its own, its footer marked interrupted."""
    cid = ctl.new_conversation().id
    ctl.store.add_message(cid, None, "system", WORDS[0], status="streaming",
                          extra={"summary_of": [1, 2]})
    assert ctl.store.mark_interrupted() == 1
    (shown,) = render.chat_messages(ctl.view(cid))
    assert "Summary of 2 earlier messages" in shown["content"]
    assert render.STATUS_NOTES["interrupted"] in shown["content"]
