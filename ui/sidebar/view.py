"""The sidebar's components (`SidebarUI`): new chat, search, the list of conversations (filled
by `TabSet.listing`: it follows the current tab), rename and delete with their confirmation
groups."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr


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
