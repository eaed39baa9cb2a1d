"""The export handler: writes the conversation as Markdown (the shown path) and JSON (the whole
tree, `ChatController.export`) to private files in a folder of its own (`files.py`), and shows
them."""

from __future__ import annotations

import functools
from pathlib import Path

import gradio as gr

from ..controller import ChatController
from ..store.errors import StoreError, cause_of
from ..store.private import write_private
from ..toasts import USER_ERRORS, warn, why
from .files import ExportFolders
from .view import ExportUI


@functools.cache
def export_folders() -> ExportFolders:
    """This app's export folders (made once: old ones are removed then)."""
    return ExportFolders()


def export_files(ctl: ChatController, cid: int | None, slot: object = None,
                 folders: ExportFolders | None = None) -> list[Path]:
    """The two export files (0600) of conversation cid, in a new folder that replaces `slot`'s
    last; StoreError naming the cause when they cannot be written."""
    where = (folders or export_folders())
    try:
        folder = where.new(slot)
        md, js = folder / f"conversation-{cid}.md", folder / f"conversation-{cid}.json"
        write_private(md, ctl.export(cid, "markdown"))
        write_private(js, ctl.export(cid, "json"))
    except OSError as e:
        problem = "the disk is full" if cause_of(e) == "full" else (e.strerror or str(e))
        raise StoreError(f"could not write the export into {where.root}: {problem}",
                         cause_of(e)) from e
    return [md, js]


def wire_export(ui: ExportUI, ctl: ChatController, slots: gr.State, i: int, **quick) -> None:
    export_folders()

    def export(slot_cids: list):
        try:
            files = export_files(ctl, slot_cids[i], slot=i)
        except USER_ERRORS as exc:
            warn(why(exc))
            return gr.skip()
        return gr.File(value=[str(f) for f in files], visible=True)
    ui.button.click(export, slots, ui.files, **quick)
