"""The sidebar's components (`SidebarUI`): new chat, search with its filters (show archived, a
tag) and its hits in messages, the list of conversations (filled by `TabSet.listing`: it follows
the current tab), rename, delete, pin, archive, tags with their groups, and import.

`query` (a gr.State holding `ListQuery.as_dict()`, sidebar/logic.py) is what the list is
filtered by: the search box and the filters write it, `TabSet.listing` reads it (it is the
page's `search` input). What the hits show is text: a Radio's labels are never HTML.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from ..store.organise import Hit
from .logic import ListQuery

ALL_TAGS = "All tags"
HIT_LABEL_CHARS = 120


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
    query: gr.State
    archived: gr.Checkbox
    tag: gr.Dropdown
    hits: gr.Radio
    pin: gr.Button
    archive: gr.Button
    tags: gr.Button
    tags_row: gr.Group
    tags_box: gr.Textbox
    tags_ok: gr.Button
    tags_cancel: gr.Button
    upload: gr.UploadButton


def build_sidebar() -> SidebarUI:
    new = gr.Button("+  New chat", variant="primary", elem_id="new-chat")
    search = gr.Textbox(placeholder="Search chats and every branch…", show_label=False,
                        elem_id="search", container=False)
    query = gr.State(ListQuery().as_dict())
    with gr.Row(elem_classes="lp-tight"):
        archived = gr.Checkbox(label="Show archived", value=False, elem_id="show-archived",
                               container=False, scale=1, min_width=120)
        tag = gr.Dropdown(choices=[ALL_TAGS], value=ALL_TAGS, show_label=False, container=False,
                          elem_id="tag-filter", scale=1, min_width=100)
    # interactive: Gradio would draw an output-only Radio disabled (it is not an event's input)
    hits = gr.Radio(choices=[], label="Found in messages", visible=False, elem_id="search-hits",
                    interactive=True)
    conversations = gr.Radio(choices=[], show_label=False, elem_id="conv-list", container=False)
    with gr.Row(elem_classes="lp-tight"):
        rename = gr.Button("Rename", size="sm", elem_id="rename", min_width=60)
        delete = gr.Button("Delete", size="sm", variant="stop", elem_id="delete", min_width=60)
    with gr.Row(elem_classes="lp-tight"):
        pin = gr.Button("★ Pin", size="sm", elem_id="pin", min_width=60)
        archive = gr.Button("Archive", size="sm", elem_id="archive", min_width=60)
        tags = gr.Button("# Tags", size="sm", elem_id="tags", min_width=60)
    with gr.Group(visible=False) as rename_row:
        rename_box = gr.Textbox(label="New title", elem_id="rename-box")
        with gr.Row(elem_classes="lp-tight"):
            rename_ok = gr.Button("Save", size="sm", variant="primary", elem_id="rename-ok")
            rename_cancel = gr.Button("Cancel", size="sm", elem_id="rename-cancel")
    with gr.Group(visible=False) as tags_row:
        tags_box = gr.Textbox(label="Tags, separated by commas", elem_id="tags-box")
        with gr.Row(elem_classes="lp-tight"):
            tags_ok = gr.Button("Save", size="sm", variant="primary", elem_id="tags-ok")
            tags_cancel = gr.Button("Cancel", size="sm", elem_id="tags-cancel")
    with gr.Group(visible=False, elem_classes="lp-confirm") as delete_row:
        delete_md = gr.Markdown(elem_id="delete-question")
        with gr.Row(elem_classes="lp-tight"):
            delete_yes = gr.Button("Delete", size="sm", variant="stop", elem_id="delete-yes")
            delete_no = gr.Button("Keep", size="sm", elem_id="delete-no")
    upload = gr.UploadButton("⇪ Import a chat (JSON export)", file_types=[".json"],
                             file_count="single", size="sm", elem_id="import")
    return SidebarUI(new, search, conversations, rename, delete, rename_row, rename_box,
                     rename_ok, rename_cancel, delete_row, delete_md, delete_yes, delete_no,
                     query, archived, tag, hits, pin, archive, tags, tags_row, tags_box, tags_ok,
                     tags_cancel, upload)


def hit_label(hit: Hit) -> str:
    """One hit as the Radio shows it (text): where it is, then the words around the match with
    the matched words in «»."""
    snippet = "".join(f"«{t}»" if matched else t for t, matched in hit.parts())
    snippet = " ".join(snippet.split())
    if len(snippet) > HIT_LABEL_CHARS:
        snippet = snippet[:HIT_LABEL_CHARS - 1] + "…"
    title = hit.title if len(hit.title) <= 40 else hit.title[:39] + "…"
    return f"{title} · {hit.role}: {snippet}"


def hits_update(hits: list[Hit], text: str) -> gr.Radio:
    """The hits Radio for a search (hidden without a search or without hits)."""
    if not text.strip() or not hits:
        return gr.Radio(choices=[], value=None, visible=bool(text.strip()),
                        label="No message matches" if text.strip() else "Found in messages")
    n = len(hits)
    return gr.Radio(choices=[(hit_label(h), h.message_id) for h in hits], value=None,
                    visible=True, interactive=True, label=f"Found in {n} message{'s' if n != 1 else ''} "
                                        "(click to open that branch)")


def tag_choices(tags: list[str], current: str | None) -> gr.Dropdown:
    value = current if current in tags else ALL_TAGS
    return gr.Dropdown(choices=[ALL_TAGS, *tags], value=value)
