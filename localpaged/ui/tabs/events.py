"""The handlers that change the page's tab set, each returning `PageValues` (view.py): restore on
page load, open (from the sidebar, a fork, a compare pick, the "More tabs" list), new, close,
select, and the sidebar's list of conversations, which follows the current tab. `Page` wires
them: the tab set bound to the page's components, which every feature's wiring is given.

Open tabs are as many as the user opens; only ✕ Close tab closes one. The page shows N_SLOTS of
them: past that, an opening tab takes the slot of the leftmost other tab without a running
reply (else the leftmost other), which moves to "More tabs" and stays open there (its reply
runs on; a pick shows it again, the same way). The open tabs are saved in order, the shown
first, so a restart shows the same tabs and lists the same more.

A reload comes back where the user was: the selected tab from the server (`layout` and
`select_tab` save it with the open tabs), the scroll of the page and of the shown chat from the
browser's localStorage (SCROLL_JS, wired by `wire_scroll` after the page's load).
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from .. import render
from ..chat.view import TabValues, tab_update, tab_values
from ..controller import ChatController
from ..event_settings import GEN, QUICK, TABS
from ..toasts import info
from .view import N_SLOTS, PageUI, PageValues


def moved(title: str) -> str:
    return (f"{N_SLOTS} tabs are shown, so “{title}” moved to More tabs (above the tabs): it is "
            "still open there.")


class TabSet:
    """Handlers of the tab set; each returns PageValues."""

    def __init__(self, ctl: ChatController) -> None:
        self.ctl = ctl

    def restore(self) -> PageValues:
        """On page load: the tabs open before (across reloads and restarts), the first N_SLOTS
        shown (with the one selected last), the one selected last selected again."""
        cids = self.ctl.open_tabs()
        if not cids:
            convs = self.ctl.search()
            cids = [convs[0].id if convs else self.ctl.new_conversation().id]
        shown, last = cids[:N_SLOTS], self.ctl.current_tab()
        if last is not None and last not in shown:
            shown[-1] = last
        slots = shown + [None] * (N_SLOTS - len(shown))
        return self.layout(slots, slots.index(last) if last in slots else 0,
                           changed=range(N_SLOTS))

    def open(self, slots: list, current: int, cid: int | None,
             refresh: bool = False) -> PageValues:
        """Show conversation cid: its tab if shown (re-read if `refresh`), else a free slot, else
        the slot of another open tab, which moves to More tabs (`_make_room`)."""
        slots = list(slots or [None] * N_SLOTS)
        if cid is None:
            return self.layout(slots, current, changed=())
        if cid in slots:
            i = slots.index(cid)
            return self.layout(slots, i, changed=[i] if refresh else ())
        i = slots.index(None) if None in slots else self._make_room(slots, current)
        slots[i] = cid
        return self.layout(slots, i, changed=[i])

    def _make_room(self, slots: list, current: int) -> int:
        """The slot an opening tab takes when all are shown: the leftmost tab other than the
        current one without a running reply, else the leftmost other one. Its conversation stays
        open (layout lists it under More tabs) and a toast says where it went."""
        others = [j for j in range(len(slots)) if j != current]
        idle = [j for j in others if not self.ctl.busy(slots[j])]
        j = (idle or others)[0]
        info(moved(self.ctl.conversation(slots[j]).title))
        return j

    def new(self, slots: list, current: int) -> PageValues:
        return self.open(slots, current, self.ctl.new_conversation().id)

    def close(self, slots: list, i: int) -> PageValues:
        slots = list(slots)
        closed = slots[i]
        if closed is not None:
            self.ctl.stop(closed)
            self.ctl.prepared.cancel(closed)        # alternatives still being prepared go
        slots[i] = None
        if not any(slots):
            slots[i] = self.ctl.new_conversation().id        # never an empty page
        visible = [j for j, c in enumerate(slots) if c is not None]
        after = [j for j in visible if j > i]                # the tab right of it, else left
        return self.layout(slots, after[0] if after else visible[-1], changed=[i], closed=closed)

    def layout(self, slots: list, current: int, changed, closed: int | None = None) -> PageValues:
        """After a change of tabs: the tabs in `changed` re-read, the others kept; the open
        tabs saved (`closed` no longer among them) and the ones not shown listed."""
        more = self._save(slots, current, closed)
        chat = [tab_values(self.ctl, slots[i]) if i in changed else TabValues()
                for i in range(N_SLOTS)]
        return PageValues(slots=slots, current=current, tabs=gr.Tabs(selected=f"slot{current}"),
                          chat=chat, conversations=gr.Radio(value=slots[current]),
                          more=self._more(more))

    def _save(self, slots: list, current: int, closed: int | None = None) -> list[int]:
        """Saves the open tabs, the shown ones first, and returns the others (More tabs)."""
        shown = [c for c in slots if c is not None]
        more = [c for c in self.ctl.open_tabs() if c not in shown and c != closed]
        self.ctl.save_open_tabs(shown + more, slots[current])
        return more

    def _more(self, cids: list[int]) -> gr.Dropdown:
        choices = [(render.tab_label(self.ctl.conversation(c), self.ctl.busy(c)), c) for c in cids]
        return gr.Dropdown(choices=choices, value=None, visible=bool(cids),
                           label=f"More tabs ({len(cids)})")

    def select_tab(self, slots: list, i: int) -> PageValues:
        """The user picked tab i: remembered, so a reload comes back to it."""
        self._save(slots, i)
        return PageValues(current=i, conversations=gr.Radio(value=slots[i]))

    def refresh_chats(self, slots: list) -> PageValues:
        """Every open tab's chat re-read (after a compare added replies to one of them)."""
        return PageValues(chat=[tab_values(self.ctl, c, settings=False) if c is not None
                                else TabValues() for c in slots])

    def titles(self, slots: list) -> PageValues:
        """Every open tab's label (after a rename or a first message)."""
        return PageValues(chat=[TabValues(tab=tab_update(self.ctl.view(c)))
                                if c is not None else TabValues() for c in slots])

    def listing(self, query: str, slots: list, current: int) -> Any:
        """The sidebar's conversations matching `query`, the current tab's selected."""
        convs = self.ctl.search(query or "")
        cid = (slots or [None])[current or 0]
        return gr.Radio(choices=render.conversation_choices(convs),
                        value=cid if cid in {c.id for c in convs} else None)


class Page:
    """The tab set wired to the page: `handler` adapts a PageValues handler to Gradio,
    `refresh_after` chains the sidebar list and tab labels after an event that may change
    titles, `follow_all` re-attaches every tab to its running turn (after a load or an open;
    chat tabs add their follower when wired)."""

    def __init__(self, ui: PageUI, tabset: TabSet) -> None:
        self.ui, self.tabs = ui, tabset
        self.followers: list[tuple] = []            # (generator fn of slots, its outputs)

    def handler(self, fn):
        """A Gradio fn for `fn` (returning PageValues): same parameters, flattened result."""
        def run(*args):
            return self.ui.flatten(fn(*args))
        return run

    def listing_event(self) -> dict:
        return dict(fn=self.tabs.listing, inputs=[self.ui.search, self.ui.slots, self.ui.current],
                    outputs=self.ui.conversations, **QUICK)

    def refresh_after(self, event) -> None:
        event.then(**self.listing_event()).then(
            self.handler(self.tabs.titles), self.ui.slots, self.ui.outputs(), **QUICK)

    def follow_all(self, event) -> None:
        for fn, out in self.followers:
            event.then(fn, self.ui.slots, out, **GEN)

    def wire_more(self) -> None:
        """A pick in More tabs shows that tab (another moves there if every slot is in use)."""
        ui = self.ui
        self.follow_all(ui.more.input(self.handler(self.tabs.open), [ui.slots, ui.current, ui.more],
                                      ui.outputs(), **TABS))


# Runs once after the page's load put the tabs back (and selected the saved one). Restores the
# window's scroll and the shown chat's (`#chat{i} .bubble-wrap`, Gradio's scroller; a chat that
# was scrolled to its end goes to its end again, however long it has grown). The chat's value
# lands late on a loaded machine and the Chatbot scrolls itself to the end when it does, so the
# place is re-applied until it held for a while with the chat's content in (or the user scrolls,
# clicks or types: then the user wins), at most 30 s; then every scroll is recorded, by slot
# with the tab's label (a tab closed on the left moves the others up a slot at the next load, so
# a chat is found again by its label first), debounced.
SCROLL_JS = """() => { if (window.__lpScroll) return; window.__lpScroll = true;
  const KEY = 'localpaged.scroll', TICK = 150, HELD = 8, MAX = 200;
  let saved = {};
  try { saved = JSON.parse(localStorage.getItem(KEY) || '{}') || {}; } catch (e) { saved = {}; }
  const slotOf = (el) => { for (let c = el; c; c = c.parentElement) {
      if (/^chat\\d+$/.test(c.id || '')) return c.id; } return null; };
  const shown = () => [...document.querySelectorAll('.lp-chat .bubble-wrap')]
      .find((w) => w.offsetParent !== null && slotOf(w));
  const label = (slot) => { const b = document.getElementById('tab' + slot.slice(4) + '-button');
      return b ? b.innerText.replace('●', '').trim() : ''; };
  const target = (w) => {                   // the saved place of the shown chat, or null
    const slot = slotOf(w), name = label(slot), chats = saved.chats || {};
    return Object.values(chats).find((c) => name && c.label === name) || chats[slot] || null;
  };
  const place = () => {                     // true when the chat is where it was left
    if (typeof saved.y === 'number') window.scrollTo(0, saved.y);
    const w = shown();
    if (!w) return false;
    const at = target(w);
    if (!at) return true;
    const room = w.scrollHeight - w.clientHeight;
    if (!at.end && room < at.top) return false;          // its content has not landed yet
    w.scrollTop = at.end ? w.scrollHeight : at.top;
    return at.end ? room - w.scrollTop < 4 : Math.abs(w.scrollTop - at.top) < 2;
  };
  const record = () => {
    const chats = saved.chats || {};
    document.querySelectorAll('.lp-chat .bubble-wrap').forEach((w) => {
      const slot = slotOf(w);
      if (slot && w.offsetParent !== null) chats[slot] = {top: w.scrollTop, label: label(slot),
          end: w.scrollHeight - w.clientHeight - w.scrollTop < 4};
    });
    saved = {y: window.scrollY, chats};
    try { localStorage.setItem(KEY, JSON.stringify(saved)); } catch (e) { /* full, or off */ }
  };
  let tries = 0, held = 0, settle = null;
  const done = () => { if (settle === null) return; clearInterval(settle); settle = null; listen(); };
  const USER = ['wheel', 'keydown', 'pointerdown', 'touchstart'];
  USER.forEach((t) => document.addEventListener(t, done, {capture: true, once: true}));
  settle = setInterval(() => { held = place() ? held + 1 : 0;
                               if (held >= HELD || ++tries >= MAX) done(); }, TICK);
  function listen() {
    let pending = null;
    const later = () => { clearTimeout(pending); pending = setTimeout(record, 150); };
    document.addEventListener('scroll', later, true);     // capture: element scrolls too
    document.addEventListener('click', later, true);      // a tab switch shows another chat
    window.addEventListener('pagehide', record);
  }
}"""


# Keeps a chat at its end while a reply grows, if the user was there (within NEAR pixels), as
# the Chatbot's own autoscroll did (it is off: chat/view.py). That one read the chat's layout
# on every update of its value, which forced a layout per streamed chunk; here a ResizeObserver
# on the chat's messages says when they grew, after the frame's own layout, and a passive scroll
# listener notes whether the user is at the end. A chat's scroller (`.lp-chat [role=log]`) is
# looked for at load and after each click (a tab switch mounts another chat).
FOLLOW_JS = """() => { if (window.__lpFollow) return; window.__lpFollow = true;
  const NEAR = 100, seen = new WeakSet();
  const follow = (log) => {
    seen.add(log);
    let atEnd = true;
    log.addEventListener('scroll', () => {
      atEnd = log.scrollHeight - log.scrollTop - log.clientHeight < NEAR; }, {passive: true});
    const grew = new ResizeObserver(() => { if (atEnd) log.scrollTop = log.scrollHeight; });
    const watch = () => [...log.children].forEach((c) => grew.observe(c));
    watch();
    new MutationObserver(watch).observe(log, {childList: true});
  };
  const scan = () => document.querySelectorAll('.lp-chat [role=log]').forEach((log) => {
    if (!seen.has(log)) follow(log); });
  scan();
  document.addEventListener('click', () => { setTimeout(scan, 300); setTimeout(scan, 1500); },
                            true);
}"""


def wire_scroll(loaded) -> None:
    """After the page's load (the tabs restored): its scroll back, and kept from then on; a
    chat follows its growing reply (FOLLOW_JS)."""
    loaded.then(None, None, None, js=SCROLL_JS).then(None, None, None, js=FOLLOW_JS)
