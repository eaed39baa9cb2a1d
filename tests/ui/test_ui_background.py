"""Alternatives prepared in the background (ui/prepared/logic.py), through the
controller over a tiny model in the real engine: a prepared reply is revealed by Regenerate with
no new request (counted at the backend and in the engine's prefix-cache queries) and says so in
its footer; it shares the prompt's blocks; a new message cancels an unfinished one and its
blocks are freed; the keep/drop option; the store migration to schema 3."""

from __future__ import annotations


import pytest

from localpaged.ui import render
from localpaged.ui.prepared.logic import clean_options
from localpaged.ui.store import Store

from helpers.step_gate import StepGate
from helpers.store_versions import v1_store
from helpers.tiny_chat import GREEDY, P1, P2, controller, engine_backend, poll, run


@pytest.fixture(scope="module")
def backend(tiny_root):
    with engine_backend(tiny_root) as b:
        yield b


@pytest.fixture
def ctl(backend, tmp_path):
    with controller(backend, tmp_path) as c:
        yield c


def prepared_chat(ctl, text=P1, k=1, keep=True):
    """A conversation with one reply and its k prepared alternatives, all finished."""
    cid = ctl.new_conversation().id
    ctl.prepared.set_options(cid, k, keep)
    reply = run(ctl.send(cid, text)).replies[0].message_id
    bg = ctl.prepared.turn(cid)
    assert bg is not None and len(bg.replies) == k
    run(bg)
    return cid, reply, [r.message_id for r in bg.replies]


def test_regenerate_reveals_the_prepared_reply_without_a_request(ctl, backend):
    cid, reply, (alt,) = prepared_chat(ctl)
    assert backend.requests[-2:] == ["interactive", "background"]
    path = ctl.store.active_path(cid)
    assert path[-1].id == reply                     # preparing never changes the shown path
    m = ctl.store.get_message(alt)
    assert (m.prepared, m.status, m.parent_id) == ("unseen", "complete", path[-2].id)
    # The same prompt: the prefix cache gave it every prompt token but the last, the ones
    # after the full blocks from the block the shown reply filled (a private copy).
    prompt = m.stats["prompt_tokens"]
    assert m.stats["prefix_tokens_reused"] == prompt - 1
    assert m.content == ctl.store.get_message(reply).content      # greedy: same reply

    requests, queries = len(backend.requests), backend.stats().prefix_cache_queries
    turn = ctl.regenerate(reply)
    assert turn.done and turn.replies[0].message_id == alt           # instant: nothing to wait
    assert len(backend.requests) == requests                          # no request sent
    assert backend.stats().prefix_cache_queries == queries            # the engine admitted none
    view = ctl.view(cid)
    assert view.path[-1].id == alt and view.siblings[-1] == (2, 2)
    assert ctl.store.get_message(alt).prepared == "seen"
    assert render.PREPARED_NOTE in render.chat_messages(view)[-1]["content"]
    assert render.PREPARED_NOTE not in render.chat_messages(ctl.view(cid))[-2]["content"]

    third = run(ctl.regenerate(alt))                 # nothing prepared left: a real request
    assert backend.requests[requests] == "interactive"
    assert ctl.store.get_message(third.replies[0].message_id).prepared is None


def test_switch_reveals_and_streaming_alternatives_are_not_counted(ctl):
    cid, reply, alts = prepared_chat(ctl, k=2)
    assert ctl.view(cid).siblings[-1] == (1, 3)
    ctl.switch(reply, 1)
    assert ctl.store.active_path(cid)[-1].id == alts[0]
    assert [ctl.store.get_message(a).prepared for a in alts] == ["seen", "unseen"]


def test_new_message_cancels_unfinished_alternatives_and_frees_their_blocks(ctl, backend):
    cid = ctl.new_conversation().id
    user = run(ctl.send(cid, P1)).replies[0].message_id
    ctl.update_settings(cid, "", {**GREEDY, "max_tokens": 900})   # a long background run
    with StepGate(backend.llm_engine, 3) as gate:     # it runs until the new message is sent
        bg = ctl.prepared.start(cid, ctl.store.get_message(user).parent_id, 2)
        gate.wait_held()
        held = poll(lambda: backend.stats().block_tables.get(bg.request_id), what="its blocks")
        assert len(held) == 2 and set(held[0]) & set(held[1])     # both share the prompt
        assert ctl.view(cid).siblings[-1] == (1, 1)               # streaming: not counted yet
        poll(lambda: all(r.text for r in bg.replies), what="text")
        ctl.update_settings(cid, "", GREEDY)
        nxt = ctl.send(cid, P2)                                   # cancels it
    assert bg.wait(30) and all(r.status == "deleted" for r in bg.replies)
    assert not [m for m in ctl.store.messages(cid) if m.prepared]  # unseen partial: dropped
    run(nxt)
    stats = poll(lambda: (s := backend.stats()).num_running == 0 and s, what="idle engine")
    assert bg.request_id not in stats.block_tables
    assert stats.blocks_in_use == 0                               # nothing leaked


def test_regenerate_while_the_alternative_streams_follows_it(ctl, backend):
    cid = ctl.new_conversation().id
    reply = run(ctl.send(cid, P1)).replies[0].message_id
    ctl.update_settings(cid, "", {**GREEDY, "max_tokens": 200})
    with StepGate(backend.llm_engine, 2) as held:     # the alternative streams meanwhile
        bg = ctl.prepared.start(cid, ctl.store.get_message(reply).parent_id, 1)
        held.wait_held()
        requests = len(backend.requests)
        turn = ctl.regenerate(reply)
        assert turn is bg and len(backend.requests) == requests   # the same request, followed
        assert ctl.busy(cid) and ctl.turn(cid) is bg
    run(turn)
    m = ctl.store.get_message(bg.replies[0].message_id)
    assert (m.prepared, m.status, m.stats["generated_tokens"]) == ("seen", "complete", 200)
    assert ctl.store.active_path(cid)[-1].id == m.id


@pytest.mark.parametrize("keep", [True, False])
def test_unopened_prepared_replies_are_kept_or_dropped(ctl, keep):
    cid, reply, (alt,) = prepared_chat(ctl, keep=keep)
    run(ctl.send(cid, P2))                              # the user moves on
    kept = [m.id for m in ctl.store.messages(cid) if m.prepared == "unseen"]
    assert alt in kept if keep else alt not in kept


def test_options_are_checked(ctl):
    cid = ctl.new_conversation().id
    assert ctl.prepared.alternatives(cid) == 0          # CPU default: off
    with pytest.raises(ValueError, match="alternatives"):
        ctl.prepared.set_options(cid, 5, True)
    with pytest.raises(ValueError, match="keep_unopened"):
        clean_options(1, "yes")
    assert ctl.prepared.set_options(cid, "2", False).options == {"alternatives": 2,
                                                                 "keep_unopened": False}


def test_migration_to_schema_3(tmp_path):
    with Store(v1_store(tmp_path)) as s:
        assert s.get_conversation(1).options == {}
        assert [m.prepared for m in s.active_path(1)] == [None, None]
        s.update_message(2, prepared="seen")
        assert s.get_message(2).prepared == "seen"
        with pytest.raises(ValueError, match="prepared"):
            s.update_message(2, prepared="maybe")
        cut = s.add_message(1, 1, "assistant", "half", status="streaming", prepared="unseen",
                            activate=False)
        assert s.mark_interrupted() == 0                 # a crash left it being prepared: gone
        assert [m.id for m in s.children(1)] == [2] and cut.id != 2
        assert s.active_path(1)[-1].id == 2
