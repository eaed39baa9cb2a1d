"""The engine panel's wiring: a tick of its timer collects the snapshot (one KvMap, with its
per-branch token cache, serves every page) and sends the page the HTML only when it changed."""

from __future__ import annotations

import logging

import gradio as gr

from ..controller import ChatController
from ..queues import QUICK
from ..tabs.events import Page
from .logic import KvMap
from .view import EnginePanelUI, render_panel

log = logging.getLogger(__name__)


def wire_engine_panel(ui: EnginePanelUI, page: Page, ctl: ChatController) -> None:
    kv = KvMap(ctl)

    def tick(slot_cids, last):
        try:
            html = render_panel(kv.collect([c for c in slot_cids or [] if c]))
        except Exception:  # noqa: BLE001 - a panel refresh must never break the page
            log.exception("engine panel refresh failed")
            return gr.skip(), gr.skip()
        return (gr.skip(), gr.skip()) if html == last else (html, html)

    ui.timer.tick(tick, [page.ui.slots, ui.last], [ui.html, ui.last], **QUICK)
