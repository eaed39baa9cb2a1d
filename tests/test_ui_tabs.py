"""The page's tab set without a browser (ui/tabs/events.py, ui/tabs/logic.py, Regenerate in
ui/chat/events.py): tabs past the old four open in tabs of their own, a full set says so and
replaces nothing, the selected tab is remembered across reloads and restarts, and Regenerate on
an empty chat says why it does nothing."""

from __future__ import annotations

import json

import pytest
from tiny_models import build
from ui_helpers import controller, run, tiny_backend

from localpaged.ui.chat import events as chat_events
from localpaged.ui.chat.events import NOTHING_TO_REGENERATE, ChatEvents
from localpaged.ui.controller import ChatController
from localpaged.ui.settings.logic import SAMPLING_KEYS
from localpaged.ui.tabs import events as tab_events
from localpaged.ui.values import KEEP
from localpaged.ui.tabs.events import FULL, TabSet
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
    monkeypatch.setattr(tab_events, "warn", said.append)
    monkeypatch.setattr(chat_events, "warn", said.append)
    monkeypatch.setattr(chat_events, "info", said.append)
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


def test_a_full_tab_set_says_so_and_replaces_nothing(ctl, toasts):
    tabs = TabSet(ctl)
    slots, current = open_n(tabs, N_SLOTS)
    conversations = len(ctl.search())
    out = tabs.new(slots, 3)
    assert toasts == [FULL] and out.slots == slots and out.current == 3
    assert len(ctl.search()) == conversations                  # no chat made that no tab shows
    other = ctl.new_conversation().id                          # e.g. picked in the sidebar
    out = tabs.open(slots, 3, other)
    assert toasts == [FULL, FULL] and out.slots == slots and other not in out.slots
    # A fork lands in the sidebar, and says so, instead of taking someone's tab.
    turn = ctl.send(slots[3], "hello")
    run(turn)
    forked = ChatEvents(ctl, tabs).fork(slots, 3, 3, None)
    assert forked.slots == slots and "close one to open it" in toasts[-1]
    # Closing one makes room, and the next one opens there.
    freed = tabs.close(slots, 7)
    assert freed.slots[7] is None and freed.current == 8       # the tab to its right
    again = tabs.open(freed.slots, freed.current, other)
    assert again.slots[7] == other and again.current == 7


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
