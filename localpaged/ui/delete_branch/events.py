"""The handlers of a chat tab's "Delete…": ask about the selected message (how much would go),
then, on "Delete", remove that message and its branch (`BranchDeletion`) and re-read the tab;
"Keep" closes the question. The sidebar's list and the tab labels follow (`refresh_after`)."""

from __future__ import annotations

import gradio as gr

from ..chat.view import ChatTabUI, TabValues, tab_values
from ..controller import ChatController
from ..event_settings import QUICK
from ..tabs.events import Page
from ..toasts import USER_ERRORS, info, warn, why
from .view import DeleteBranchUI


class DeleteBranchEvents:
    def __init__(self, ctl: ChatController) -> None:
        self.ctl = ctl

    def ask(self, slots: list, i: int, sel: int | None) -> tuple:
        """(group, question, pending message id) for the selected message of tab i."""
        cid = slots[i]
        try:
            if cid is None:
                raise KeyError("no conversation in this tab")
            plan = self.ctl.branch_deletion.plan(self.ctl.message_at(cid, sel).id)
        except USER_ERRORS as exc:
            warn(f"Nothing to delete: {why(exc)}")
            return gr.skip(), gr.skip(), None
        return gr.Group(visible=True), plan.question(), plan.message_id

    def delete(self, slots: list, i: int, message_id: int | None) -> TabValues:
        cid = slots[i]
        if cid is None or message_id is None:
            return TabValues()
        try:
            plan = self.ctl.branch_deletion.delete(message_id)
        except USER_ERRORS as exc:
            warn(f"Not deleted: {why(exc)}")
            return tab_values(self.ctl, cid)
        n = plan.count
        info(f"Deleted {n} message{'s' if n != 1 else ''}; the other branches are kept.")
        return tab_values(self.ctl, cid)


def wire_delete_branch(ui: ChatTabUI, page: Page, events: DeleteBranchEvents) -> None:
    d: DeleteBranchUI = ui.delete_branch
    i, slots = ui.index, page.ui.slots
    d.button.click(lambda c, sel: events.ask(c, i, sel), [slots, ui.sel],
                   [d.group, d.question, d.pending], **QUICK)
    deleted = d.yes.click(lambda c, mid: ui.flatten(events.delete(c, i, mid)), [slots, d.pending],
                          ui.outputs(), **QUICK)
    deleted.then(lambda: (gr.Group(visible=False), None), None, [d.group, d.pending], **QUICK)
    page.refresh_after(deleted)
    d.no.click(lambda: (gr.Group(visible=False), None), None, [d.group, d.pending], **QUICK)
