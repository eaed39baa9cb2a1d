"""The model picker's wiring: Load starts a background load (`ModelManager.load`) and streams its
progress into the panel until it is done, then the header's badge; tab labels are refreshed
after a swap."""

from __future__ import annotations

from collections.abc import Iterator

import gradio as gr

from ..markdown import literal
from ..queues import GEN, QUICK
from ..tabs.events import Page
from ..toasts import warn
from .logic import ModelManager
from .view import ModelPickerUI, header

POLL_S = 0.5


def wire_model_picker(ui: ModelPickerUI, page: Page, models: ModelManager) -> None:
    def load(name: str, quantization: str | None) -> Iterator[tuple]:
        """(status, header) while the model loads."""
        try:
            job = models.load(name or "", quantization if models.quantization else None)
        except ValueError as exc:
            yield literal(str(exc)), gr.skip()           # it may quote the name
            return
        while not job.done.wait(POLL_S):
            yield models.status(), gr.skip()
        if job.error:
            warn(f"Could not load {job.name}; the current model stays loaded.")
        yield models.status(), header(models)

    loaded = ui.load.click(load, [ui.name, ui.quantization], [ui.status, ui.header], **GEN)
    loaded.then(page.handler(page.tabs.titles), page.ui.slots, page.ui.outputs(), **QUICK)
