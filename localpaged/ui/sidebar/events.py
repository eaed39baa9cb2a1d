"""The sidebar's handlers and wiring: new chat, search (the list and the hits in messages), its
filters, opening a conversation from the list or a hit on its branch (in a tab), rename, delete
(after a confirmation), pin, archive, tags and import; the tab set's handlers do the opening.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from ..markdown import literal
from ..controller import ChatController
from ..event_settings import QUICK, TABS
from ..tabs.events import Page
from ..tabs.view import PageValues
from ..toasts import USER_ERRORS, error, info, warn, why
from .logic import ListQuery
from .view import ALL_TAGS, SidebarUI, hits_update, tag_choices

PICK_FIRST = "Pick a conversation in the list first."


class SidebarEvents:
    def __init__(self, ctl: ChatController, page: Page) -> None:
        self.ctl, self.page = ctl, page

    def open_selected(self, slots: list, current: int, cid) -> PageValues:
        return self.page.tabs.open(slots, current, cid if isinstance(cid, int) else None)

    def rename_open(self, cid: int | None) -> tuple:
        """(rename group, box): the box holds the current title."""
        if cid is None:
            warn(PICK_FIRST)
            return gr.skip(), gr.skip()
        return gr.Group(visible=True), self.ctl.conversation(cid).title

    def rename(self, cid: int | None, title: str) -> None:
        if cid is None:
            raise error(PICK_FIRST)
        try:
            self.ctl.rename(cid, title or "")
        except USER_ERRORS as exc:
            raise error(why(exc)) from exc

    def delete_ask(self, cid: int | None) -> tuple:
        """(confirmation group, question)."""
        if cid is None:
            warn(PICK_FIRST)
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

    # ---- search and its filters -------------------------------------------------------------
    def query(self, text: str, archived: bool, tag: str | None) -> tuple:
        """(the page's query, the hits) for what the search box and filters hold."""
        q = ListQuery(text or "", bool(archived), None if tag in (None, ALL_TAGS) else tag)
        return q.as_dict(), hits_update(self.ctl.organise.hits(q), q.text)

    def open_hit(self, slots: list, current: int, message_id: Any) -> PageValues:
        """The hit's conversation in a tab, showing the hit's branch."""
        try:
            cid = self.ctl.organise.open_hit(int(message_id))
        except (TypeError, ValueError):
            return self.page.tabs.open(slots, current, None)
        except KeyError:
            warn("That message is gone (deleted meanwhile): search again.")
            return self.page.tabs.open(slots, current, None)
        return self.page.tabs.open(slots, current, cid, refresh=True)

    # ---- pin, archive, tags -----------------------------------------------------------------
    def pin(self, cid: int | None) -> None:
        conv = self._pick(cid, self.ctl.organise.toggle_pinned)
        info(f"Pinned “{conv.title}”: listed first." if conv.pinned else
             f"Unpinned “{conv.title}”.")

    def archive(self, cid: int | None) -> None:
        conv = self._pick(cid, self.ctl.organise.toggle_archived)
        info(f"Archived “{conv.title}”: hidden from the list unless “Show archived” is ticked."
             if conv.archived else f"“{conv.title}” is back in the list.")

    def _pick(self, cid: int | None, change):
        if cid is None:
            raise error(PICK_FIRST)
        try:
            return change(cid)
        except USER_ERRORS as exc:
            raise error(why(exc)) from exc

    def tags_open(self, cid: int | None) -> tuple:
        """(tags group, box): the box holds the conversation's tags."""
        if cid is None:
            warn(PICK_FIRST)
            return gr.skip(), gr.skip()
        return gr.Group(visible=True), ", ".join(self.ctl.conversation(cid).tags)

    def tags_save(self, cid: int | None, tags: str, current_tag: str | None) -> gr.Dropdown:
        self._pick(cid, lambda c: self.ctl.organise.set_tags(c, tags or ""))
        return tag_choices(self.ctl.organise.tags(), current_tag)

    def tag_filter(self, current_tag: str | None) -> gr.Dropdown:
        return tag_choices(self.ctl.organise.tags(), current_tag)

    # ---- import -----------------------------------------------------------------------------
    def import_file(self, slots: list, current: int, file: Any) -> PageValues:
        """The uploaded export as a new conversation, opened in a tab; a bad file is refused
        whole with a toast saying why (nothing is written)."""
        path = getattr(file, "name", file)
        if not path:
            return self.page.tabs.open(slots, current, None)
        try:
            conv = self.ctl.organise.import_file(path)
        except USER_ERRORS as exc:
            warn(f"Not imported: {why(exc)}")
            return self.page.tabs.open(slots, current, None)
        info(f"Imported “{conv.title}” as a new conversation.")
        return self.page.tabs.open(slots, current, conv.id)


def wire_sidebar(side: SidebarUI, page: Page, ev: SidebarEvents) -> None:
    slots, current, out = page.ui.slots, page.ui.current, page.ui.outputs()
    hide = lambda: gr.Group(visible=False)  # noqa: E731

    def open_selected(slot_cids, cur, evt: gr.SelectData) -> list:
        return page.ui.flatten(ev.open_selected(slot_cids, cur, evt.value))

    def open_hit(slot_cids, cur, evt: gr.SelectData) -> list:
        return page.ui.flatten(ev.open_hit(slot_cids, cur, evt.value))

    page.refresh_after(side.new.click(page.handler(page.tabs.new), [slots, current], out, **TABS))
    page.follow_all(side.conversations.select(open_selected, [slots, current], out, **TABS))
    filters = [side.search, side.archived, side.tag]
    for box in (side.search, side.archived, side.tag):
        box.change(ev.query, filters, [side.query, side.hits], **QUICK).then(
            **page.listing_event())
    hit = side.hits.select(open_hit, [slots, current], out, **QUICK)
    hit.then(lambda: gr.Radio(value=None), None, side.hits, **QUICK)   # the same hit clicks again
    page.follow_all(hit)
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
    page.refresh_after(side.pin.click(ev.pin, side.conversations, None, **QUICK))
    page.refresh_after(side.archive.click(ev.archive, side.conversations, None, **QUICK))
    side.tags.click(ev.tags_open, side.conversations, [side.tags_row, side.tags_box], **QUICK)
    tagged = side.tags_ok.click(ev.tags_save, [side.conversations, side.tags_box, side.tag],
                                side.tag, **QUICK)
    tagged.success(hide, None, side.tags_row, **QUICK)
    page.refresh_after(tagged)
    side.tags_cancel.click(hide, None, side.tags_row, **QUICK)
    side.tag.focus(ev.tag_filter, side.tag, side.tag, **QUICK)
    imported = side.upload.upload(page.handler(ev.import_file), [slots, current, side.upload],
                                  out, **QUICK)
    page.refresh_after(imported)
