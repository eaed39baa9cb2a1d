"""A chat tab's "Delete…" button (in the toolbar, acting on the selected message) and the
confirmation it opens (elem_ids `delbranch{i}`, `delask{i}`, `delyes{i}`, `delno{i}`): nothing
is deleted until "Delete" there is clicked. `pending` holds the id of the message asked about,
so a selection changed meanwhile cannot redirect the deletion."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr


@dataclass
class DeleteBranchUI:
    button: gr.Button
    group: gr.Group | None = None
    question: gr.Markdown | None = None
    yes: gr.Button | None = None
    no: gr.Button | None = None
    pending: gr.State | None = None


def build_delete_button(i: int) -> DeleteBranchUI:
    """The toolbar's button; `build_delete_confirm` adds the rest below the toolbar."""
    return DeleteBranchUI(gr.Button("Delete…", size="sm", elem_id=f"delbranch{i}", scale=0,
                                    min_width=84))


def build_delete_confirm(i: int, ui: DeleteBranchUI) -> DeleteBranchUI:
    with gr.Group(visible=False, elem_classes="lp-confirm", elem_id=f"delgroup{i}") as group:
        ui.question = gr.Markdown(elem_id=f"delask{i}")
        with gr.Row(elem_classes="lp-tight"):
            ui.yes = gr.Button("Delete", size="sm", variant="stop", elem_id=f"delyes{i}")
            ui.no = gr.Button("Keep", size="sm", elem_id=f"delno{i}")
    ui.group, ui.pending = group, gr.State(None)
    return ui
