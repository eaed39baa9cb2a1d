"""The sidebar: new chat, search, the list of conversations (opening one shows it in a tab),
rename and delete (with a confirmation). Its components, handlers and wiring; the list itself is
filled by `TabSet.listing` (it follows the current tab).
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from . import render
from .controller import ChatController
from .queues import QUICK
from .tabset import Page, PageValues
from .toasts import USER_ERRORS, error, warn, why


@dataclass
class SidebarUI:
    new: gr.Button
    search: gr.Textbox
    conversations: gr.Radio
    rename: gr.Button
    delete: gr.Button
    rename_row: gr.Group
    rename_box: gr.Textbox
    rename_ok: gr.Button
    rename_cancel: gr.Button
    delete_row: gr.Group
    delete_md: gr.Markdown
    delete_yes: gr.Button
    delete_no: gr.Button


def build_sidebar() -> SidebarUI:
    new = gr.Button("+  New chat", variant="primary", elem_id="new-chat")
    search = gr.Textbox(placeholder="Search chats…", show_label=False,
                        elem_id="search", container=False)
    conversations = gr.Radio(choices=[], show_label=False, elem_id="conv-list", container=False)
    with gr.Row(elem_classes="lp-tight"):
        rename = gr.Button("Rename", size="sm", elem_id="rename")
        delete = gr.Button("Delete", size="sm", variant="stop", elem_id="delete")
    with gr.Group(visible=False) as rename_row:
        rename_box = gr.Textbox(label="New title", elem_id="rename-box")
        with gr.Row(elem_classes="lp-tight"):
            rename_ok = gr.Button("Save", size="sm", variant="primary", elem_id="rename-ok")
            rename_cancel = gr.Button("Cancel", size="sm", elem_id="rename-cancel")
    with gr.Group(visible=False, elem_classes="lp-confirm") as delete_row:
        delete_md = gr.Markdown(elem_id="delete-question")
        with gr.Row(elem_classes="lp-tight"):
            delete_yes = gr.Button("Delete", size="sm", variant="stop", elem_id="delete-yes")
            delete_no = gr.Button("Keep", size="sm", elem_id="delete-no")
    return SidebarUI(new, search, conversations, rename, delete, rename_row, rename_box,
                     rename_ok, rename_cancel, delete_row, delete_md, delete_yes, delete_no)


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
        title = render.escape_markdown(self.ctl.conversation(cid).title)
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
