"""The page's tab set without a browser (ui/tabs/events.py, ui/tabs/logic.py, Regenerate in
ui/chat/events.py): tabs past the old four open in tabs of their own, tabs past the page's
N_SLOTS stay open under More tabs (only Close closes), the selected tab is remembered across
reloads and restarts, and Regenerate on an empty chat says why it does nothing."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from helpers.tiny_models import build
from helpers.ui_helpers import controller, run, tiny_backend

from localpaged.ui.chat import events as chat_events
from localpaged.ui.chat import message_events
from localpaged.ui.chat.events import NOTHING_TO_REGENERATE, ChatEvents
from localpaged.ui.controller import ChatController
from localpaged.ui.settings.logic import SAMPLING_KEYS
from localpaged.ui.tabs import events as tab_events
from localpaged.ui.values import KEEP
from localpaged.ui.tabs.events import TabSet, moved
from localpaged.ui.tabs.logic import OpenTabsFile
from localpaged.ui.tabs.view import N_SLOTS
from localpaged.ui.values import KEEP

GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": None,
          "max_tokens": 8}
FIELDS = [GREEDY[k] for k in SAMPLING_KEYS]


@pytest.fixture(scope="module")
def backend(tiny_root):
    yield from tiny_backend(build("llama-gqa", tiny_root), num_kv_blocks=128)


@pytest.fixture
def ctl(backend, tmp_path):
    yield from controller(backend, tmp_path, GREEDY)


@pytest.fixture
def toasts(monkeypatch):
    said: list[str] = []
    monkeypatch.setattr(tab_events, "info", said.append)
    monkeypatch.setattr(chat_events, "warn", said.append)
    monkeypatch.setattr(message_events, "warn", said.append)
    monkeypatch.setattr(message_events, "info", said.append)
    return said


def open_n(tabs: TabSet, n: int):
    """Restore, then "+ New chat" until n tabs are open: (slots, current)."""
    out = tabs.restore()
    slots, current = out.slots, out.current
    while sum(c is not None for c in slots) < n:
        out = tabs.new(slots, current)
        slots, current = out.slots, out.current
    return slots, current


def test_a_fifth_and_a_tenth_tab_open_beside_the_others(ctl, toasts):
    assert N_SLOTS >= 10
    tabs = TabSet(ctl)
    slots, current = open_n(tabs, 4)
    before = list(slots)
    for n in range(5, 11):
        out = tabs.new(slots, current)
        opened = [c for c in out.slots if c not in slots]
        assert len(opened) == 1 and out.slots.index(opened[0]) == n - 1 == out.current
        assert [c for c in out.slots if c is not None][:n - 1] == [c for c in slots if c]
        assert out.chat[n - 1].chatbot is not KEEP                # the new tab was read
        assert all(t.chatbot is KEEP for j, t in enumerate(out.chat) if j != n - 1)
        slots, current = out.slots, out.current
    assert slots[:4] == before[:4] and not toasts
    assert ctl.open_tabs() == [c for c in slots if c is not None]


def more_tabs(out) -> list[int]:
    """The conversations listed under More tabs in a PageValues."""
    return [cid for _, cid in out.more.constructor_args["choices"]]


def test_tabs_past_the_shown_ones_stay_open_under_more_tabs(ctl, toasts, monkeypatch):
    tabs = TabSet(ctl)
    slots, current = open_n(tabs, N_SLOTS)
    shown = list(slots)
    with monkeypatch.context() as m:                 # a reply running in the leftmost tab
        m.setattr(ctl, "busy", lambda cid: cid == shown[0])
        out = tabs.new(slots, 3)
    [new] = [c for c in out.slots if c not in shown]
    # The leftmost other tab without a running reply gives its slot; it is still open.
    assert out.slots[1] == new and out.current == 1 and out.chat[1].chatbot is not KEEP
    assert out.slots[0] == shown[0] and more_tabs(out) == [shown[1]]
    assert toasts == [moved(ctl.conversation(shown[1]).title)]
    assert set(ctl.open_tabs()) == set(shown) | {new} and ctl.open_tabs()[-1] == shown[1]
    for n in range(3):                               # as many as the user opens
        out = tabs.new(out.slots, out.current)
    assert len(ctl.open_tabs()) == N_SLOTS + 4 and len(more_tabs(out)) == 4
    # A pick in More tabs (the same handler as the sidebar's) shows it again, another moves.
    slots, current = out.slots, out.current
    out = tabs.open(slots, current, shown[1])
    assert shown[1] in out.slots and shown[1] not in more_tabs(out)
    assert len(more_tabs(out)) == 4 and out.slots[out.current] == shown[1]
    # A fork opens in a tab too, and says so.
    run(ctl.send(shown[1], "hello"))
    forked = ChatEvents(ctl, tabs).fork(out.slots, out.current, out.current, None)
    assert forked.slots[forked.current] not in out.slots and len(more_tabs(forked)) == 5
    # Only Close closes: the tab is gone from the open tabs, the ones under More stay.
    listed = more_tabs(forked)
    closed = tabs.close(forked.slots, 7)
    assert closed.slots[7] is None and forked.slots[7] not in ctl.open_tabs()
    assert more_tabs(closed) == listed and len(ctl.open_tabs()) == N_SLOTS + 4   # 11 shown
    # A restart shows the open tabs in order, the selected one again.
    back = TabSet(ctl).restore()                     # the freed slot shows the first of More
    assert [c for c in back.slots if c] == [c for c in closed.slots if c] + listed[:1]
    assert more_tabs(back) == listed[1:] and back.slots[back.current] == closed.slots[closed.current]


def test_the_selected_tab_comes_back_after_a_reload_and_a_restart(ctl, backend, tmp_path):
    tabs = TabSet(ctl)
    slots, _ = open_n(tabs, 6)
    tabs.select_tab(slots, 4)
    out = tabs.restore()                                       # a reload
    assert out.slots == slots and out.current == 4
    assert out.tabs.selected == "slot4"
    restarted = ChatController(ctl.store, lambda: backend, GREEDY, tmp_path / "ui_state.json")
    out = TabSet(restarted).restore()
    assert out.slots == slots and out.current == 4
    closed = tabs.close(slots, 4)                              # the current tab closed
    assert closed.current == 5                                 # the tab to its right
    again = TabSet(ctl).restore()                              # the tabs close ranks on reload
    assert again.slots[again.current] == slots[5]


def test_the_current_tab_is_an_open_tab_of_a_conversation_that_exists(ctl):
    a, b = (ctl.store.create_conversation(title=t).id for t in ("a", "b"))
    ctl.save_open_tabs([a, b], current=b)
    assert ctl.current_tab() == b
    ctl.store.delete_conversation(b)                 # deleted elsewhere (the sidebar)
    assert ctl.current_tab() is None
    ctl.save_open_tabs([a], current=a)
    assert ctl.current_tab() == a
    ctl.save_open_tabs([b], current=b)               # not a conversation any more
    assert ctl.current_tab() is None


def test_the_open_tabs_file_reads_old_and_broken_files(tmp_path):
    path = tmp_path / "ui_state.json"
    tabs = OpenTabsFile(path)
    assert tabs.read() == [] and tabs.read_current() is None   # no file yet
    path.write_text(json.dumps({"open": [3, 5]}))              # written before "current"
    assert tabs.read() == [3, 5] and tabs.read_current() is None
    tabs.write([3, 5, None], current=5)
    assert tabs.read() == [3, 5] and tabs.read_current() == 5
    tabs.write([3], current=5)                                 # not open: not current
    assert tabs.read_current() is None
    path.write_text(json.dumps({"open": [1, True, "2"], "current": True}))
    assert tabs.read() == [1] and tabs.read_current() is None
    path.write_text("[1, 2")
    assert tabs.read() == [] and tabs.read_current() is None


def test_regenerate_on_an_empty_chat_says_why(ctl, toasts):
    cid = ctl.new_conversation().id
    ev = ChatEvents(ctl, TabSet(ctl))
    steps = list(ev.regenerate([cid], 0, None, "Be brief.", *FIELDS))
    assert toasts == [NOTHING_TO_REGENERATE]
    assert len(steps) == 1 and steps[0].chatbot == []
    assert ctl.turn(cid) is None                               # nothing was started
    assert ctl.settings(cid)[0] == "Be brief."                 # the settings were still saved
    # With a message, Regenerate makes a second reply beside the first.
    run(ctl.send(cid, "hello"))
    steps = list(ev.regenerate([cid], 0, None, "Be brief.", *FIELDS))
    assert toasts == [NOTHING_TO_REGENERATE]
    # a stream's updates carry only what changed: the last label it sent is the one shown
    assert "Reply 2 of 2" in [s.sel_md for s in steps if s.sel_md is not KEEP][-1]


def test_a_reply_in_a_tab_not_shown_sends_its_label_only(ctl, monkeypatch):
    """While its tab is not the selected one, a streaming reply's follower sends the tab's ●
    label (again every LABEL_AGAIN_S during the turn's first LABEL_AGAIN_FOR_S: a label sent
    once was at times lost) and not the chat, which is redrawn once the tab is shown or the
    reply ends."""
    shown, hidden = ctl.new_conversation().id, ctl.new_conversation().id
    run(ctl.send(hidden, "hello"))
    ctl.save_open_tabs([shown, hidden], shown)
    monkeypatch.setattr(chat_events, "LABEL_AGAIN_S", 0.0)
    ticks = [SimpleNamespace(done=False, error=None) for _ in range(3)]

    def updates(interval):           # as Turn.updates: the interval asked between two ticks
        for tick in ticks:
            yield tick
            interval()
        yield SimpleNamespace(done=True, error=None)
    turn = SimpleNamespace(updates=updates)

    def follow():
        return list(ChatEvents(ctl, TabSet(ctl)).follow_turn(hidden, turn))
    steps = follow()
    assert steps[0].chatbot is not KEEP                        # the first update: all of it
    for step in steps[1:3]:
        assert step.tab is not KEEP and step.chatbot is KEEP and step.sel_md is KEEP
    assert len(steps) == 4                                     # the end: what changed since
    monkeypatch.setattr(chat_events, "LABEL_AGAIN_FOR_S", 0.0)
    assert len(follow()) == 2                                  # past the first seconds: none
    ctl.save_open_tabs([shown, hidden], hidden)                # shown: the chat again
    monkeypatch.setattr(chat_events, "LABEL_AGAIN_FOR_S", 5.0)
    steps = follow()
    assert len(steps) == 4 and all(step.tab is not KEEP for step in steps)
    assert steps[1].chatbot is KEEP                            # unchanged since the first
