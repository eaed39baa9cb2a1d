"""The export handler: writes the conversation as Markdown (the shown path) and JSON (the whole
tree, `ChatController.export`) to files in a new temporary folder, and shows them."""

from __future__ import annotations

import tempfile
from pathlib import Path

import gradio as gr

from ..controller import ChatController
from ..toasts import USER_ERRORS, warn, why
from .view import ExportUI


def export_files(ctl: ChatController, cid: int | None) -> list[Path]:
    """The two export files of conversation cid, in a new temporary folder."""
    folder = Path(tempfile.mkdtemp(prefix="localpaged-export-"))
    md, js = folder / f"conversation-{cid}.md", folder / f"conversation-{cid}.json"
    md.write_text(ctl.export(cid, "markdown"), encoding="utf-8")
    js.write_text(ctl.export(cid, "json"), encoding="utf-8")
    return [md, js]


def wire_export(ui: ExportUI, ctl: ChatController, slots: gr.State, i: int, **quick) -> None:
    def export(slot_cids: list):
        try:
            files = export_files(ctl, slot_cids[i])
        except USER_ERRORS as exc:
            warn(why(exc))
            return gr.skip()
        return gr.File(value=[str(f) for f in files], visible=True)
    ui.button.click(export, slots, ui.files, **quick)
