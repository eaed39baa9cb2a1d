"""The chat app's Gradio Blocks: lays out the page and lets each feature build and wire its part.

The layout rule: one folder per feature, each with the same three modules, by what they own:
  view.py    its components (a `...UI` dataclass and `build_...`), the values its handlers
             return (a `...Values` dataclass) and what it shows (text, HTML, values read from
             the controller); no events
  events.py  its handlers (a `...Events` class or functions) and their wiring (`wire_...`)
  logic.py   its part of the controller, plain Python (no Gradio), given what it needs: the
             turn registry, the store, a backend provider, the settings reader
(a feature without one of them has no such file). The features:

  chat/          a chat tab: send, regenerate, edit, select, switch, fork, close, stop (TabValues)
  tabs/          which conversation each tab shows; open, close, restore (the tab and
                 the scroll the user was on) (PageValues)
  sidebar/       new chat, search, the conversation list, rename, delete
  settings/      a conversation's system prompt and sampling fields, checked when saved
  context/       the context gauge, the context policy, Continue, Compact (a summary and the
                 recent turns in a new branch), the first screen's focus
  prepared/      alternatives prepared in the background, and their options
  edit_preview/  the cost preview under the Edit box (reused vs prefilled tokens)
  export/        a tab's Markdown + JSON export
  tokens/        a reply token by token (probabilities, alternatives) and a branch at a token
  compare/       the side-by-side compare tab (CompareValues)
  engine_panel/  the KV-cache panel, pushed by the server (its own long-poll route)
  kv_disk/       the KV disk tier: the shown conversation read back ahead of a send, Clear
  tools/         MCP servers, a conversation's tools and JSON schema, tool calls in a turn
                 (approval, cards), attachments
  images/        a user message's images: their chat message parts, thumbnails, the route
                 serving them; "image from cache" in a reply's footer
  models/        the header's model badge, the model panel, loading and swapping the model
  store/         the conversation store (SQLite) and the one-app-per-data-directory lock

Shared, at the top: `controller.py` (ChatController, every handler reads and writes through it;
it composes the features' logic), `turns.py` (Turn), `turn_registry.py` (the TurnRegistry of
running turns), `redraw.py` (how often a streaming reply redraws), `values.py` (the only place
handler results become Gradio outputs), `render.py` (messages and labels as the components show
them), `markdown.py` and `math_rule.py` (untrusted text as safe HTML),
`keyboard.py` (shortcuts, their help, a message queued behind a streaming reply), `event_settings.py` (concurrency groups), `toasts.py` (user
messages), `style.py` (theme and CSS). Views and events import the controller and the shared
modules; the controller imports the logic it composes; no logic module imports Gradio.

A new per-tab output goes into `chat/view.py` alone: its component in `build_chat_tab`, a
field of the same name in `ChatTabUI` and in `TabValues`, its value in `tab_values`; a handler
sets it by returning `TabValues(name=...)`, and `values.py` maps it (no output lists to edit).

`build_demo(controller, models)` returns the Blocks; `localpaged.cli` mounts it on the FastAPI
app, after `ui_routes(controller)`. `THEME` and `CSS` go to `mount_gradio_app`/`launch`.
"""

from __future__ import annotations

import gradio as gr

from .chat.events import ChatEvents, wire_chat_tab
from .chat.message_events import wire_sibling_clicks
from .chat.view import build_chat_tab
from .compare.events import CompareEvents, wire_compare
from .compare.view import build_compare
from .context.events import ContextEvents, wire_context, wire_first_screen
from .controller import ChatController
from .engine_panel.events import panel_router, wire_engine_panel
from .keyboard import build_help, wire_keyboard
from .kv_disk.events import wire_kv_disk
from .kv_disk.logic import KVDiskActions
from .kv_disk.view import build_kv_disk
from .engine_panel.view import build_engine_panel
from .images.events import image_router, wire_paste
from .models.events import wire_model_picker
from .models.logic import ModelManager
from .models.view import build_header, build_model_panel
from .event_settings import QUICK, quiet_progress
from .sidebar.events import SidebarEvents, wire_sidebar
from .sidebar.view import build_sidebar
from .style import CSS, THEME
from .tabs.events import Page, TabSet, wire_scroll
from .tabs.view import N_SLOTS, PageUI
from .tokens.events import TokenEvents, wire_token_clicks, wire_tokens
from .tools.events import wire_tools_panel
from .tools.view import build_tools_panel

__all__ = ["build_demo", "ui_routes", "CSS", "THEME"]


def ui_routes(ctl: ChatController):
    """The page's own HTTP routes beside Gradio's (the engine panel's push, the stored images);
    the app includes them before mounting Gradio at "/"."""
    router = panel_router(ctl)
    router.include_router(image_router(ctl))
    return router


def build_demo(ctl: ChatController, models: ModelManager) -> gr.Blocks:
    tabset = TabSet(ctl)
    with gr.Blocks(title="localpaged", fill_width=True) as demo:
        # First in the page's tree: the page looks every event's progress target up by a
        # depth-first search from the root on each streamed chunk (event_settings.py)
        marker = gr.HTML(visible=False, elem_id="lp-progress")
        slots, current = gr.State([None] * N_SLOTS), gr.State(0)
        header = build_header(models)
        with gr.Row(elem_id="lp-body", equal_height=False):
            with gr.Column(scale=1, min_width=230, elem_id="lp-sidebar"):
                side = build_sidebar()
                build_help()
            with gr.Column(scale=4, min_width=520, elem_id="lp-main"):
                sels = [gr.State(None) for _ in range(N_SLOTS)]   # not inside gr.Tabs
                more = gr.Dropdown(label="More tabs", choices=[], value=None, visible=False,
                                   elem_id="lp-more", interactive=True)
                with gr.Tabs(elem_id="lp-tabs", overflow_behavior="wrap") as tabs:
                    chats = [build_chat_tab(i, sels[i]) for i in range(N_SLOTS)]
                    with gr.Tab("⚖ Compare", id="compare", elem_id="tab-compare") as cmp_tab:
                        cmp = build_compare()
            with gr.Column(scale=2, min_width=300, elem_id="lp-right"):
                panel = build_engine_panel()
                kv_disk = build_kv_disk()
                picker = build_model_panel(models, header)
                tools_panel = build_tools_panel()      # last: the model panel stays in place

        page = Page(PageUI(slots, current, tabs, chats, side.conversations, side.query, more),
                    tabset)
        chat_events = ChatEvents(ctl, tabset)
        context_events = ContextEvents(ctl, chat_events)
        token_events = TokenEvents(ctl, chat_events)
        for ui in chats:                       # first: they add their followers to the page
            wire_chat_tab(ui, page, chat_events)
            wire_context(ui, page, context_events)
            wire_tokens(ui, page, token_events)
        loaded = demo.load(page.handler(tabset.restore), None, page.ui.outputs(), **QUICK)
        loaded.then(**page.listing_event())
        page.follow_all(loaded)
        page.wire_more()
        wire_first_screen(loaded)
        wire_sibling_clicks(loaded)
        wire_token_clicks(loaded)
        wire_keyboard(loaded)
        wire_paste(loaded)
        wire_scroll(loaded)
        wire_sidebar(side, page, SidebarEvents(ctl, page))
        wire_compare(cmp, cmp_tab, page, CompareEvents(ctl))
        wire_engine_panel(loaded)
        wire_model_picker(picker, page, models, loaded)
        wire_kv_disk(kv_disk, page, KVDiskActions(ctl.store, ctl.backend))
        wire_tools_panel(tools_panel, ctl, loaded)
        quiet_progress(demo, marker)
    return demo
