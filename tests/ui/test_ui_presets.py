"""Presets, the defaults of new chats, Fork copying settings, and the penalties, without a
browser: ui/settings/presets.py through ChatController, and the store's schema version 4
(`app_settings`, `presets`) migrated from a version 3 file with every conversation kept.
The penalties are checked where they leave the app: the SamplingParams the controller hands
the backend (a recording backend over the tiny model)."""

from __future__ import annotations

import sqlite3
import threading

import pytest
from helpers.tiny_models import build
from helpers.store_versions import old_store
from helpers.ui_helpers import controller, recording_backend, run

from localpaged.ui.settings.logic import PENALTY_KEYS, SAMPLING_KEYS
from localpaged.ui.settings.presets import BUILT_IN
from localpaged.ui.store import Store
from localpaged.ui.store.schema import SCHEMA_VERSION

GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": None,
          "max_tokens": 6}
P1 = "ĀāĂăĄąĆćĈĉĊċČčĎď" * 2


@pytest.fixture(scope="module")
def backend(tiny_root):
    yield from recording_backend(build("llama-gqa", tiny_root), num_kv_blocks=128)


@pytest.fixture
def ctl(backend, tmp_path):
    yield from controller(backend, tmp_path, GREEDY)


def test_a_preset_fills_the_system_prompt_and_the_request(ctl, backend):
    cid = ctl.new_conversation().id
    name = "Concise"
    assert name in ctl.preset_names()
    assert ctl.apply_preset(cid, name) == BUILT_IN[name]
    assert ctl.settings(cid)[0] == BUILT_IN[name]
    assert ctl.prompt_messages(cid, None)[0] == {"role": "system", "content": BUILT_IN[name]}
    ctl.save_preset("  my   pirate ", "Talk like a pirate.")
    assert "my pirate" in ctl.preset_names()                      # name tidied
    ctl.save_preset("my pirate", "Talk like a parrot.")           # overwritten, not doubled
    assert ctl.preset_names().count("my pirate") == 1
    other = ctl.new_conversation().id
    ctl.apply_preset(other, "my pirate")
    assert ctl.settings(other)[0] == "Talk like a parrot."
    with pytest.raises(KeyError):
        ctl.apply_preset(other, "no such preset")
    with pytest.raises(ValueError):
        ctl.save_preset("", "x")
    with pytest.raises(ValueError):
        ctl.save_preset("empty", "   ")
    assert ctl.settings(other)[0] == "Talk like a parrot."        # a refusal changes nothing


def test_new_chats_take_the_saved_defaults(ctl):
    first = ctl.new_conversation().id
    assert ctl.settings(first) == ("", {**ctl.conversation_settings.default})
    mine = {**GREEDY, "temperature": 0.3, "top_k": 7, "max_tokens": 9,
            "repetition_penalty": 1.3, "presence_penalty": 0.5}
    ctl.update_settings(first, "Be kind.", mine)
    ctl.set_context_policy(first, "error")
    ctl.save_defaults(first)
    new = ctl.new_conversation()
    prompt, sampling = ctl.settings(new.id)
    assert prompt == "Be kind." and new.context_policy == "error"
    assert {k: sampling[k] for k in mine} == mine and sampling["frequency_penalty"] == 0.0
    with pytest.raises(ValueError, match="temperature"):          # checked when saved
        ctl.presets.save_defaults("", {"temperature": -1}, "drop_oldest")
    ctl.store.set_app_setting("defaults", {"sampling": {"top_k": "many"}, "context_policy": 3})
    fallback = ctl.new_conversation()                             # a damaged value: the app's
    assert ctl.settings(fallback.id)[1] == ctl.conversation_settings.default
    assert fallback.context_policy == "drop_oldest"


def test_fork_copies_the_settings(ctl):
    cid = ctl.new_conversation().id
    mine = {**GREEDY, "temperature": 0.9, "seed": 5, "frequency_penalty": 0.4}
    ctl.update_settings(cid, "System here.", mine)
    ctl.set_context_policy(cid, "error")
    ctl.store.update_conversation(cid, options={"alternatives": 2})
    reply = run(ctl.send(cid, P1)).replies[0].message_id
    fork = ctl.fork(reply)
    assert ctl.settings(fork.id) == ctl.settings(cid)
    assert fork.context_policy == "error" and fork.options == {"alternatives": 2}
    assert [m.content for m in ctl.store.active_path(fork.id)] == \
        [m.content for m in ctl.store.active_path(cid)]


def test_the_penalties_reach_the_engine(ctl, backend):
    cid = ctl.new_conversation().id
    ctl.update_setting(cid, "repetition_penalty", 1.25)            # a tab field, saved alone
    ctl.update_setting(cid, "presence_penalty", "0.5")
    ctl.update_setting(cid, "frequency_penalty", -0.25)
    # A tab's send passes the six sampling fields: the saved penalties stay.
    checked = ctl.update_settings(cid, "", {k: GREEDY[k] for k in SAMPLING_KEYS})
    backend.sent.clear()
    turn = run(ctl.send(cid, P1, checked))
    (params,) = backend.sent[-1][1]
    assert (params.repetition_penalty, params.presence_penalty, params.frequency_penalty) == \
        (1.25, 0.5, -0.25)
    assert params.temperature == 0.0 and params.max_tokens == 6
    reply = ctl.store.get_message(turn.replies[0].message_id)
    assert {k: reply.sampling[k] for k in PENALTY_KEYS} == {
        "repetition_penalty": 1.25, "presence_penalty": 0.5, "frequency_penalty": -0.25}
    # Regenerate and compare use them too.
    run(ctl.regenerate(turn.replies[0].message_id))
    assert backend.sent[-1][1][0].repetition_penalty == 1.25
    with pytest.raises(ValueError, match="repetition_penalty"):
        ctl.update_setting(cid, "repetition_penalty", 0)            # the engine's range
    assert ctl.settings(cid)[1]["repetition_penalty"] == 1.25


def test_a_send_saving_the_fields_does_not_undo_a_penalty_saved_meanwhile(ctl):
    """A tab's send saves its six sampling fields while a penalty field saves itself on
    another thread (the browser fires both): the send's read-merge-write must not write back
    the penalty it read before the other save."""
    cid = ctl.new_conversation().id
    settings = ctl.conversation_settings
    read, send_read, penalty_saved = settings.read, threading.Event(), threading.Event()

    def read_then_linger(c):
        got = read(c)
        if threading.current_thread().name == "send" and not send_read.is_set():
            send_read.set()
            penalty_saved.wait(0.5)      # the other save runs now, unless it must wait for us
        return got

    settings.read = read_then_linger
    fields = {**{k: GREEDY[k] for k in SAMPLING_KEYS}, "max_tokens": 7}     # one field changed
    send = threading.Thread(name="send", target=ctl.update_settings, args=(cid, "", fields))
    send.start()
    assert send_read.wait(5)
    ctl.update_setting(cid, "presence_penalty", 0.5)
    penalty_saved.set()
    send.join(5)
    assert ctl.settings(cid)[1]["presence_penalty"] == 0.5
    assert ctl.settings(cid)[1]["max_tokens"] == 7


def test_a_version_3_store_is_migrated_and_keeps_its_conversations(tmp_path):
    old = tmp_path / "v3.db"
    conn = old_store(old, 3)
    conn.execute("INSERT INTO conversations (id, title, created, updated, system_prompt, "
                 "sampling) VALUES (1, 'kept', 1.0, 2.0, 'sys', '{\"temperature\": 0.2}')")
    conn.execute("INSERT INTO messages (id, conversation_id, parent_id, role, content, created)"
                 " VALUES (1, 1, NULL, 'user', 'hello', 1.0)")
    conn.execute("UPDATE conversations SET active_root_id = 1")
    conn.commit()
    conn.close()
    with Store(old) as s:
        conv = s.get_conversation(1)
        assert (conv.title, conv.system_prompt, conv.sampling) == ("kept", "sys",
                                                                   {"temperature": 0.2})
        assert [m.content for m in s.active_path(1)] == ["hello"]
        assert s.presets() == [] and s.app_setting("defaults") is None
        s.save_preset("p", "q")
        s.set_app_setting("defaults", {"system_prompt": "d"})
    conn = sqlite3.connect(old)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()
    with Store(old) as s:                                         # reopened: as saved
        assert s.presets() == [("p", "q")] and s.app_setting("defaults") == {"system_prompt": "d"}


def test_the_presets_row_handlers(ctl):
    """settings/events.py: "Use these settings for new chats" takes the fields as shown (a
    field's own save may not have landed); "Save preset" keeps the shown system prompt."""
    from localpaged.ui.settings.events import PresetEvents
    ev = PresetEvents(ctl)
    cid = ctl.new_conversation().id
    slots = [cid, None, None, None]
    shown = {**GREEDY, "top_p": 0.5, "repetition_penalty": 1.1, "presence_penalty": 0.0,
             "frequency_penalty": 0.3}
    ev.make_default(slots, 0, "Shown prompt", *[shown[k] for k in SAMPLING_KEYS + PENALTY_KEYS])
    prompt, sampling = ctl.settings(ctl.new_conversation().id)
    assert prompt == "Shown prompt" and {k: sampling[k] for k in shown} == shown
    saved = ev.save_preset(slots, 0, "mine", "Be brief, pirate.")
    assert saved.preset_name == "" and ctl.presets.prompt("mine") == "Be brief, pirate."
    assert ev.choose_preset(slots, 0, "mine").system == "Be brief, pirate."
    assert ctl.settings(cid)[0] == "Be brief, pirate."
