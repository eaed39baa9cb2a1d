"""The chat app's Gradio Blocks: lays out the page and lets each feature module build and wire
its own part. One module per feature, each owning its components, handlers and wiring:

  sidebar.py       new chat, search, the conversation list, rename, delete
  tabset.py        which conversation each chat tab shows; open, close, restore (PageValues)
  chat_tab.py      a chat tab's components and what it shows (TabValues)
  chat_events.py   a chat tab's handlers: send, regenerate, edit, switch, fork, stop, settings
  context_ui.py    the context gauge, the context policy, Continue, the first screen's focus
  export.py        a tab's Markdown + JSON export
  compare.py       the side-by-side compare tab (CompareValues)
  engine_panel.py  the KV-cache panel and its timer (drawing in kvmap.py)
  model_picker.py  the header badge and the model panel
  prepared.py      alternatives prepared in the background (its options: prepared_fields.py)
  edit_preview.py  the cost preview under the Edit box (reused vs prefilled tokens)
Shared by them: `values.py` (the only place handler results become Gradio outputs), `queues.py`
(concurrency groups), `toasts.py` (user messages), `sampling_fields.py` (settings fields), and,
below the UI, `controller.py` (every handler reads and writes through it).

`build_demo(controller, models)` returns the Blocks; `localpaged.cli` mounts it on the FastAPI
app. `THEME` and `CSS` go to `mount_gradio_app`/`launch`.
"""

from __future__ import annotations

import gradio as gr

from .chat_events import ChatEvents, wire_chat_tab
from .chat_tab import build_chat_tab
from .compare import CompareEvents, build_compare, wire_compare
from .context_ui import ContextEvents, wire_context, wire_first_screen
from .controller import ChatController
from .engine_panel import build_engine_panel, wire_engine_panel
from .model_picker import build_header, build_model_panel, wire_model_picker
from .models import ModelManager
from .queues import QUICK
from .sidebar import SidebarEvents, build_sidebar, wire_sidebar
from .style import CSS, THEME
from .tabset import N_SLOTS, Page, PageUI, TabSet

__all__ = ["build_demo", "CSS", "THEME"]


def build_demo(ctl: ChatController, models: ModelManager) -> gr.Blocks:
    tabset = TabSet(ctl)
    with gr.Blocks(title="localpaged", fill_width=True) as demo:
        slots, current = gr.State([None] * N_SLOTS), gr.State(0)
        header = build_header(models)
        with gr.Row(elem_id="lp-body", equal_height=False):
            with gr.Column(scale=1, min_width=230, elem_id="lp-sidebar"):
                side = build_sidebar()
            with gr.Column(scale=4, min_width=520, elem_id="lp-main"):
                sels = [gr.State(None) for _ in range(N_SLOTS)]   # not inside gr.Tabs
                with gr.Tabs(elem_id="lp-tabs", overflow_behavior="wrap") as tabs:
                    chats = [build_chat_tab(i, sels[i]) for i in range(N_SLOTS)]
                    with gr.Tab("⚖ Compare", id="compare", elem_id="tab-compare") as cmp_tab:
                        cmp = build_compare()
            with gr.Column(scale=2, min_width=300, elem_id="lp-right"):
                panel = build_engine_panel()
                picker = build_model_panel(models, header)

        page = Page(PageUI(slots, current, tabs, chats, side.conversations, side.search), tabset)
        chat_events = ChatEvents(ctl, tabset)
        context_events = ContextEvents(ctl, chat_events)
        for ui in chats:                       # first: they add their followers to the page
            wire_chat_tab(ui, page, chat_events)
            wire_context(ui, page, context_events)
        loaded = demo.load(page.handler(tabset.restore), None, page.ui.outputs(), **QUICK)
        loaded.then(**page.listing_event())
        page.follow_all(loaded)
        wire_first_screen(loaded)
        wire_sidebar(side, page, SidebarEvents(ctl, page))
        wire_compare(cmp, cmp_tab, page, CompareEvents(ctl))
        wire_engine_panel(panel, page, ctl)
        wire_model_picker(picker, page, models)
    return demo
