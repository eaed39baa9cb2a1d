"""The sidebar's handlers and wiring: new chat, search, opening a conversation from the list (in
a tab), rename, and delete (after a confirmation); the tab set's handlers do the opening.
"""

from __future__ import annotations

import gradio as gr

from ..markdown import literal
from ..controller import ChatController
from ..queues import QUICK
from ..tabs.events import Page
from ..tabs.view import PageValues
from ..toasts import USER_ERRORS, error, warn, why
from .view import SidebarUI


class SidebarEvents:
    def __init__(self, ctl: ChatController, page: Page) -> None:
        self.ctl, self.page = ctl, page

    def open_selected(self, slots: list, current: int, cid) -> PageValues:
        return self.page.tabs.open(slots, current, cid if isinstance(cid, int) else None)

    def rename_open(self, cid: int | None) -> tuple:
        """(rename group, box): the box holds the current title."""
        if cid is None:
            warn("Pick a conversation in the list first.")
            return gr.skip(), gr.skip()
        return gr.Group(visible=True), self.ctl.conversation(cid).title

    def rename(self, cid: int | None, title: str) -> None:
        if cid is None:
            raise error("Pick a conversation in the list first.")
        try:
            self.ctl.rename(cid, title or "")
        except USER_ERRORS as exc:
            raise error(why(exc)) from exc

    def delete_ask(self, cid: int | None) -> tuple:
        """(confirmation group, question)."""
        if cid is None:
            warn("Pick a conversation in the list first.")
            return gr.skip(), gr.skip()
        title = literal(self.ctl.conversation(cid).title)
        return gr.Group(visible=True), (f"Delete **{title}** and all its branches? "
                                         "This cannot be undone.")

    def delete(self, slots: list, current: int, cid: int | None) -> PageValues:
        if cid is None:
            return self.page.tabs.open(slots, current, None)
        self.ctl.delete(cid)
        if cid in slots:
            return self.page.tabs.close(slots, slots.index(cid))
        return self.page.tabs.open(slots, current, None)


def wire_sidebar(side: SidebarUI, page: Page, ev: SidebarEvents) -> None:
    slots, current, out = page.ui.slots, page.ui.current, page.ui.outputs()
    hide = lambda: gr.Group(visible=False)  # noqa: E731

    def open_selected(slot_cids, cur, evt: gr.SelectData) -> list:
        return page.ui.flatten(ev.open_selected(slot_cids, cur, evt.value))

    page.refresh_after(side.new.click(page.handler(page.tabs.new), [slots, current], out, **QUICK))
    page.follow_all(side.conversations.select(open_selected, [slots, current], out, **QUICK))
    side.search.change(**page.listing_event())
    side.rename.click(ev.rename_open, side.conversations, [side.rename_row, side.rename_box],
                      **QUICK)
    renamed = side.rename_ok.click(ev.rename, [side.conversations, side.rename_box], None, **QUICK)
    renamed.success(hide, None, side.rename_row, **QUICK)
    page.refresh_after(renamed)
    side.rename_cancel.click(hide, None, side.rename_row, **QUICK)
    side.delete.click(ev.delete_ask, side.conversations, [side.delete_row, side.delete_md],
                      **QUICK)
    deleted = side.delete_yes.click(page.handler(ev.delete), [slots, current, side.conversations],
                                    out, **QUICK)
    deleted.then(hide, None, side.delete_row, **QUICK)
    page.refresh_after(deleted)
    side.delete_no.click(hide, None, side.delete_row, **QUICK)
