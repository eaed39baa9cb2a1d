"""The handlers that change the page's tab set, each returning `PageValues` (view.py): restore on
page load, open (from the sidebar, a fork, a compare pick), new, close, select, and the sidebar's
list of conversations, which follows the current tab. `Page` wires them: the tab set bound to
the page's components, which every feature's wiring is given.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from .. import render
from ..chat.view import TabValues, tab_values
from ..controller import ChatController
from ..queues import GEN, QUICK
from ..toasts import warn
from .view import N_SLOTS, PageUI, PageValues


class TabSet:
    """Handlers of the tab set; each returns PageValues."""

    def __init__(self, ctl: ChatController) -> None:
        self.ctl = ctl

    def restore(self) -> PageValues:
        """On page load: the tabs open before (across reloads and restarts)."""
        cids = self.ctl.open_tabs()[:N_SLOTS]
        if not cids:
            convs = self.ctl.search()
            cids = [convs[0].id if convs else self.ctl.new_conversation().id]
        slots = cids + [None] * (N_SLOTS - len(cids))
        return self.layout(slots, 0, changed=range(N_SLOTS))

    def open(self, slots: list, current: int, cid: int | None,
             refresh: bool = False) -> PageValues:
        """Show conversation cid: its tab if open (re-read if `refresh`), else a free tab,
        else the current one (or any tab not generating)."""
        slots = list(slots or [None] * N_SLOTS)
        if cid is None:
            return self.layout(slots, current, changed=())
        if cid in slots:
            i = slots.index(cid)
            return self.layout(slots, i, changed=[i] if refresh else ())
        free = [i for i, c in enumerate(slots) if c is None]
        idle = [i for i, c in enumerate(slots) if not self.ctl.busy(c)]
        if not free and not idle:
            warn("Every tab is generating: stop or close one first.")
            return self.layout(slots, current, changed=())
        i = free[0] if free else (current if current in idle else idle[0])
        slots[i] = cid
        return self.layout(slots, i, changed=[i])

    def new(self, slots: list, current: int) -> PageValues:
        return self.open(slots, current, self.ctl.new_conversation().id)

    def close(self, slots: list, i: int) -> PageValues:
        slots = list(slots)
        if slots[i] is not None:
            self.ctl.stop(slots[i])
            self.ctl.prepared.cancel(slots[i])      # alternatives still being prepared go
        slots[i] = None
        if not any(slots):
            slots[i] = self.ctl.new_conversation().id        # never an empty page
        visible = [j for j, c in enumerate(slots) if c is not None]
        return self.layout(slots, visible[0], changed=[i])

    def layout(self, slots: list, current: int, changed) -> PageValues:
        """After a change of tabs: the tabs in `changed` re-read, the others kept."""
        self.ctl.save_open_tabs([c for c in slots if c is not None])
        chat = [tab_values(self.ctl, slots[i]) if i in changed else TabValues()
                for i in range(N_SLOTS)]
        return PageValues(slots=slots, current=current, tabs=gr.Tabs(selected=f"slot{current}"),
                          chat=chat, conversations=gr.Radio(value=slots[current]))

    def select_tab(self, slots: list, i: int) -> PageValues:
        return PageValues(current=i, conversations=gr.Radio(value=slots[i]))

    def refresh_chats(self, slots: list) -> PageValues:
        """Every open tab's chat re-read (after a compare added replies to one of them)."""
        return PageValues(chat=[tab_values(self.ctl, c, settings=False) if c is not None
                                else TabValues() for c in slots])

    def titles(self, slots: list) -> PageValues:
        """Every open tab's label (after a rename or a first message)."""
        return PageValues(chat=[TabValues(tab=tab_values(self.ctl, c, settings=False).tab)
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
