"""The engine panel: KV-cache numbers and the block map of the open conversations, refreshed
by a one-second timer (numbers and drawing from `kvmap.py`). A tick sends the page only when
the HTML changed; one KvMap (with its per-branch token cache) serves every page."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import gradio as gr

from . import kvmap
from .controller import ChatController
from .queues import QUICK
from .tabset import Page

log = logging.getLogger(__name__)

REFRESH_S = 1.0


@dataclass
class EnginePanelUI:
    html: gr.HTML
    last: gr.State                    # the HTML last sent to this page
    timer: gr.Timer


def build_engine_panel() -> EnginePanelUI:
    with gr.Accordion("Engine", open=True, elem_id="engine-acc"):
        html = gr.HTML("", elem_id="engine-panel", js_on_load=None)
    return EnginePanelUI(html, gr.State(""), gr.Timer(REFRESH_S))


def wire_engine_panel(ui: EnginePanelUI, page: Page, ctl: ChatController) -> None:
    kv = kvmap.KvMap(ctl)

    def tick(slot_cids, last):
        try:
            html = kvmap.render_panel(kv.collect([c for c in slot_cids or [] if c]))
        except Exception:  # noqa: BLE001 - a panel refresh must never break the page
            log.exception("engine panel refresh failed")
            return gr.skip(), gr.skip()
        return (gr.skip(), gr.skip()) if html == last else (html, html)

    ui.timer.tick(tick, [page.ui.slots, ui.last], [ui.html, ui.last], **QUICK)
