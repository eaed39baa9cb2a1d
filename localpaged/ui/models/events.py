"""The model manager's wiring: Load starts a background load (`ModelManager.load`) and streams its
progress (the header's bar, the panel's status) until it is done, then the header's badge; tab
labels are refreshed after a swap. Choosing a row of the local list puts its name in the model
box with that model's remembered weights format and context length; the context length re-sizes
the list's memory column; a watched folder is added and the list rescanned; Hub search fills the
results, choosing one fills the download box, Download streams its progress and rescans."""

from __future__ import annotations

from collections.abc import Iterator

import gradio as gr

from localpaged.runner.hub_client import HubUnavailable

from ..markdown import literal
from ..event_settings import GEN, QUICK
from ..tabs.events import Page
from ..toasts import warn
from .catalog import download_status
from .logic import ModelManager
from .view import ModelPickerUI, folders_note, header

POLL_S = 0.5


class ModelEvents:
    """The handlers, over one ModelManager and its catalog."""

    def __init__(self, models: ModelManager) -> None:
        self.models = models

    def load(self, name: str, quantization: str | None, context: float | None) -> Iterator[tuple]:
        """(status, header) while the model loads."""
        models = self.models
        try:
            ctx = int(context) if context and models.quantization else None
            job = models.load(name or "", quantization if models.quantization else None, ctx)
        except (TypeError, ValueError) as exc:
            yield literal(str(exc)), gr.skip()           # it may quote the name
            return
        yield models.status(), header(models)
        while not job.done.wait(POLL_S):
            yield models.status(), header(models)
        if job.error:
            warn(f"Could not load {job.name}; the current model stays loaded.")
        yield models.status(), header(models, finished=True)     # the bar at 100%, then:

    def header(self) -> str:
        """The header without the finished load's bar."""
        return header(self.models)

    def choose(self, evt: gr.SelectData) -> tuple:
        """A local row chosen: (name, weights, context) from that model's remembered defaults;
        the context box empty (the model's own context) when none is remembered."""
        row = evt.row_value or []
        if not row:
            return gr.skip(), gr.skip(), gr.skip()
        name = str(row[-1])
        remembered = self.models.catalog.memory.defaults(name)
        return (name, remembered.get("quantization", gr.skip()),
                remembered.get("max_model_len"))

    def rows(self, context: float | None) -> list[list[str]]:
        return self.models.catalog.rows(context)

    def add_folder(self, folder: str, context: float | None) -> tuple:
        """(folder box, note, rows)."""
        catalog = self.models.catalog
        try:
            said = catalog.add_folder(folder)
        except ValueError as exc:
            warn(str(exc))
            return gr.skip(), folders_note(catalog), gr.skip()
        return "", f"{literal(said)}\n\n{folders_note(catalog)}", catalog.rows(context)

    def save_sampling(self) -> str:
        name = self.models.model_name or ""
        try:
            sampling = self.models.catalog.memory.save_sampling(name)
        except ValueError as exc:
            return literal(str(exc))
        shown = ", ".join(f"{k} {v}" for k, v in sampling.items() if v is not None)
        return literal(f"Saved for {name}: {shown}. New chats take them when it loads.")

    def search(self, query: str) -> tuple:
        """(results, status)."""
        try:
            return self.models.catalog.search(query), ""
        except (ValueError, HubUnavailable) as exc:
            return [], literal(f"⚠ {exc}")

    def pick_result(self, evt: gr.SelectData) -> str:
        row = evt.row_value or []
        return str(row[0]) if row else gr.skip()

    def download(self, repo_id: str, context: float | None) -> Iterator[tuple]:
        """(status, local rows) while the download runs; the list rescanned at the end."""
        try:
            job = self.models.catalog.start_download(repo_id)
        except ValueError as exc:
            yield literal(str(exc)), gr.skip()
            return
        while not job.done.wait(POLL_S):
            yield literal(download_status(job)), gr.skip()
        yield literal(download_status(job)), self.models.catalog.rows(context)


def wire_model_picker(ui: ModelPickerUI, page: Page, models: ModelManager, page_loaded) -> None:
    """The model panel's events; `page_loaded` (the page's load event) fills the model list.
    Not a callable value on the Dataframe: Gradio attaches that load event after the page's
    events are built, with its own progress on the table, whose "pending" status then kept
    an animation frame loop running on the idle page."""
    ev = ModelEvents(models)
    page_loaded.then(lambda: ev.rows(models.context_length), None, ui.models, **QUICK)
    loaded = ui.load.click(ev.load, [ui.name, ui.quantization, ui.context],
                           [ui.status, ui.header], **GEN)
    loaded.then(page.handler(page.tabs.titles), page.ui.slots, page.ui.outputs(), **QUICK)
    loaded.then(ev.rows, ui.context, ui.models, **QUICK).then(ev.header, None, ui.header, **QUICK)
    ui.models.select(ev.choose, None, [ui.name, ui.quantization, ui.context], **QUICK)
    ui.refresh.click(ev.rows, ui.context, ui.models, **QUICK)
    ui.context.submit(ev.rows, ui.context, ui.models, **QUICK)
    ui.add_folder.click(ev.add_folder, [ui.folder, ui.context],
                        [ui.folder, ui.folder_note, ui.models], **QUICK)
    ui.folder.submit(ev.add_folder, [ui.folder, ui.context],
                     [ui.folder, ui.folder_note, ui.models], **QUICK)
    ui.save_sampling.click(ev.save_sampling, None, ui.folder_note, **QUICK)
    ui.hub_search.click(ev.search, ui.hub_query, [ui.hub_results, ui.hub_status], **QUICK)
    ui.hub_query.submit(ev.search, ui.hub_query, [ui.hub_results, ui.hub_status], **QUICK)
    ui.hub_results.select(ev.pick_result, None, ui.hub_id, **QUICK)
    ui.hub_download.click(ev.download, [ui.hub_id, ui.context], [ui.hub_status, ui.models],
                          **GEN)
