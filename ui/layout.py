"""The components of the chat app's page, made up front (Gradio does not keep a Chatbot's value
across dynamic re-renders): the sidebar, N_SLOTS chat tabs (shown and hidden as conversations
open and close), the right-hand engine and model panels. `app.py` wires their events.

Every element a browser test touches has an elem_id: chat tab i has `chat{i}`, `msg{i}`,
`send{i}`, `stop{i}`, `prev{i}`, `next{i}`, `regen{i}`, `edit{i}`, `fork{i}`, `close{i}`, ...
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from .generation import DEFAULT_SAMPLING


@dataclass
class SlotUI:
    tab: gr.Tab
    chatbot: gr.Chatbot
    sel_md: gr.Markdown
    sel: gr.State
    prev: gr.Button
    next: gr.Button
    regen: gr.Button
    edit: gr.Button
    fork: gr.Button
    close: gr.Button
    edit_row: gr.Group
    edit_box: gr.Textbox
    edit_save: gr.Button
    edit_cancel: gr.Button
    msg: gr.Textbox
    send: gr.Button
    stop: gr.Button
    system: gr.Textbox
    sampling: list
    export: gr.Button
    export_files: gr.File

    def fields(self) -> list:
        """The per-tab outputs of Events.fill, in order."""
        return [self.tab, self.chatbot, self.sel_md, self.sel, self.system, *self.sampling]

    def chat(self) -> list:
        return [self.tab, self.chatbot, self.sel_md, self.sel]


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


@dataclass
class RightUI:
    engine: gr.HTML
    model_box: gr.Textbox
    load: gr.Button
    model_status: gr.Markdown


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


def sampling_fields(prefix: str) -> list:
    d = DEFAULT_SAMPLING
    with gr.Row():
        temperature = gr.Slider(0, 2, value=d["temperature"], step=0.05, label="Temperature",
                                elem_id=f"{prefix}temperature")
        top_p = gr.Slider(0.05, 1, value=d["top_p"], step=0.05, label="Top-p",
                          elem_id=f"{prefix}top_p")
        min_p = gr.Slider(0, 1, value=d["min_p"], step=0.01, label="Min-p", elem_id=f"{prefix}min_p")
    with gr.Row():
        top_k = gr.Number(value=d["top_k"], precision=0, minimum=0, label="Top-k (0: off)",
                          elem_id=f"{prefix}top_k")
        seed = gr.Number(value=d["seed"], precision=0, label="Seed (blank: random)",
                         elem_id=f"{prefix}seed")
        max_tokens = gr.Number(value=d["max_tokens"], precision=0, minimum=1, label="Max tokens",
                               elem_id=f"{prefix}max_tokens")
    return [temperature, top_p, top_k, min_p, seed, max_tokens]   # SAMPLING_KEYS order


def build_slot(i: int, sel: gr.State) -> SlotUI:
    """Chat tab i; `sel` (made outside gr.Tabs, which takes only Tab children) holds the
    index of the selected message."""
    with gr.Tab(f"Chat {i + 1}", id=f"slot{i}", visible=False, elem_id=f"tab{i}") as tab:
        chatbot = gr.Chatbot(elem_id=f"chat{i}", height="62vh", min_height=360, show_label=False,
                             buttons=["copy", "copy_all"], editable="user", sanitize_html=True,
                             allow_tags=False, render_markdown=True, layout="bubble",
                             feedback_options=None, elem_classes="lp-chat",
                             placeholder="**Start the conversation below.**\n\nReplies stream "
                                         "in; every regenerate and edit is kept as a branch.")
        with gr.Row(elem_classes="lp-toolbar", equal_height=True):
            sel_md = gr.Markdown(elem_id=f"sel{i}", elem_classes="lp-sel")
            prev = gr.Button("‹", size="sm", elem_id=f"prev{i}", min_width=34, scale=0)
            nxt = gr.Button("›", size="sm", elem_id=f"next{i}", min_width=34, scale=0)
            regen = gr.Button("↻ Regenerate", size="sm", elem_id=f"regen{i}", scale=0, min_width=110)
            edit = gr.Button("✎ Edit", size="sm", elem_id=f"edit{i}", scale=0, min_width=70)
            fork = gr.Button("⎇ Fork here", size="sm", elem_id=f"fork{i}", scale=0, min_width=96)
            close = gr.Button("✕ Close tab", size="sm", elem_id=f"close{i}", scale=0, min_width=96)
        with gr.Group(visible=False, elem_classes="lp-edit") as edit_row:
            edit_box = gr.Textbox(label="Edit your message: the old version stays as a branch",
                                  lines=2, max_lines=12, elem_id=f"editbox{i}")
            with gr.Row(elem_classes="lp-tight"):
                edit_save = gr.Button("Save as a new branch", size="sm", variant="primary",
                                      elem_id=f"editsave{i}")
                edit_cancel = gr.Button("Cancel", size="sm", elem_id=f"editcancel{i}")
        with gr.Row(elem_classes="lp-composer", equal_height=True):
            msg = gr.Textbox(placeholder="Message…  (Enter sends, Shift+Enter for a new line)",
                             show_label=False, lines=1, max_lines=10, scale=8,
                             elem_id=f"msg{i}", container=False)
            send = gr.Button("Send", variant="primary", scale=1, min_width=80, elem_id=f"send{i}")
            stop = gr.Button("Stop", variant="stop", scale=1, min_width=80, elem_id=f"stop{i}")
        with gr.Accordion("Conversation settings", open=False, elem_id=f"settings{i}"):
            system = gr.Textbox(label="System prompt", lines=2, max_lines=10, elem_id=f"system{i}")
            sampling = sampling_fields(f"s{i}-")
            with gr.Row(elem_classes="lp-tight"):
                export = gr.Button("↓ Export (Markdown + JSON)", size="sm", elem_id=f"export{i}")
            export_files = gr.File(visible=False, file_count="multiple", show_label=False)
    return SlotUI(tab, chatbot, sel_md, sel, prev, nxt, regen, edit, fork, close,
                  edit_row, edit_box, edit_save, edit_cancel, msg, send, stop, system, sampling,
                  export, export_files)


def build_right(model_name: str | None, status: str) -> RightUI:
    with gr.Accordion("Engine", open=True, elem_id="engine-acc"):
        engine = gr.HTML("", elem_id="engine-panel", js_on_load=None)
    with gr.Accordion("Model", open=True, elem_id="model-acc"):
        model_box = gr.Textbox(value=model_name or "", label="Hub id or local path",
                               elem_id="model-name")
        load = gr.Button("Load model", elem_id="model-load", size="sm")
        model_status = gr.Markdown(status, elem_id="model-status")
    return RightUI(engine, model_box, load, model_status)
