"""The model manager's components and what they show: the header's model badge (name and weights
format, e.g. "int4 g32 · 95 MB") with the load's progress bar while a model loads (the header
is at the top of the page, so the bar is in view whatever the window's height), and the model
panel: the model to load (a Hub id or a path, typed or chosen from the list), its weights format
and context length, the load's status; the models on this machine (catalog rows, a folder to
watch); Hub search and download. Read from `logic.ModelManager` and `catalog.Catalog`.

Names, paths and Hub ids are untrusted: the header escapes them, the tables show text only.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import gradio as gr

from localpaged.core.config import QUANTIZATION, default

from ..markdown import literal
from ..render import model_label
from ..style import BRAND
from .catalog import HUB_HEADERS, LOCAL_HEADERS, Catalog
from .logic import ModelManager

QUANT_LABELS = {"auto": "auto (a GGUF keeps its bit width)", "none": "none (float weights)",
                "int8": "int8", "int4": "int4 (group 32)"}
# The load's bar floats at the top of the window, so it stays in view wherever the page is
# scrolled (the Load button sits low in the right column).
BAR_STYLE = ("display:flex;align-items:center;gap:.5rem;font-size:.8rem;min-width:260px;"
             "position:fixed;top:8px;left:50%;transform:translateX(-50%);z-index:1000;"
             "background:var(--background-fill-primary);padding:6px 12px;border-radius:10px;"
             "box-shadow:0 4px 16px rgba(0,0,0,.18)")


@dataclass
class ModelPickerUI:
    header: gr.HTML
    name: gr.Textbox
    quantization: gr.Dropdown     # hidden for a remote backend (no weights of ours)
    context: gr.Number            # the context length to load with (and to size memory at)
    load: gr.Button
    status: gr.Markdown
    models: gr.Dataframe          # on this machine (LOCAL_HEADERS)
    refresh: gr.Button
    folder: gr.Textbox
    add_folder: gr.Button
    folder_note: gr.Markdown
    save_sampling: gr.Button
    hub_query: gr.Textbox
    hub_search: gr.Button
    hub_results: gr.Dataframe     # HUB_HEADERS
    hub_id: gr.Textbox
    hub_download: gr.Button
    hub_status: gr.Markdown


def build_header(models: ModelManager) -> gr.HTML:
    return gr.HTML(header(models), elem_id="lp-header", js_on_load=None)


def build_model_panel(models: ModelManager, header_html: gr.HTML) -> ModelPickerUI:
    catalog = models.catalog
    local = models.quantization is not None
    with gr.Accordion("Model", open=True, elem_id="model-acc"):
        name = gr.Textbox(value=models.model_name or "", label="Hub id or local path",
                          elem_id="model-name")
        with gr.Row():
            quant = gr.Dropdown([(QUANT_LABELS[q], q) for q in QUANTIZATION],
                                value=models.quantization or default("quantization"),
                                label="Weights", elem_id="model-quant", visible=local)
            context = gr.Number(value=models.context_length or None, label="Context (tokens)",
                                precision=0, minimum=1, elem_id="model-context", visible=local)
        load = gr.Button("Load model", elem_id="model-load", size="sm")
        status_md = gr.Markdown(models.status(), elem_id="model-status")
        with gr.Accordion("On this machine", open=True, elem_id="model-local"):
            table = gr.Dataframe(headers=LOCAL_HEADERS, datatype="str", interactive=False,
                                 wrap=True, max_height=260, elem_id="model-list")
            with gr.Row():
                folder = gr.Textbox(placeholder="/path/to/gguf/folder", show_label=False,
                                    container=False, scale=3, elem_id="model-folder")
                add = gr.Button("Watch folder", size="sm", scale=1, elem_id="model-add-folder")
                refresh = gr.Button("↻ Rescan", size="sm", scale=1, elem_id="model-refresh")
            note = gr.Markdown(folders_note(catalog), elem_id="model-folder-note")
            save = gr.Button("Save the new-chat sampling as this model's default", size="sm",
                             elem_id="model-save-sampling", visible=local)
        with gr.Accordion("Hugging Face Hub", open=False, elem_id="model-hub"):
            with gr.Row():
                query = gr.Textbox(placeholder="search, e.g. SmolLM2", show_label=False,
                                   container=False, scale=3, elem_id="hub-query")
                search = gr.Button("Search", size="sm", scale=1, elem_id="hub-search")
            results = gr.Dataframe(headers=HUB_HEADERS, datatype=["str", "number", "number"],
                                   interactive=False, max_height=220, elem_id="hub-results")
            with gr.Row():
                hub_id = gr.Textbox(placeholder="owner/name", show_label=False, container=False,
                                    scale=3, elem_id="hub-id")
                download = gr.Button("Download", size="sm", scale=1, elem_id="hub-download")
            hub_status = gr.Markdown("", elem_id="hub-status")
    return ModelPickerUI(header_html, name, quant, context, load, status_md, table, refresh,
                         folder, add, note, save, query, search, results, hub_id, download,
                         hub_status)


def folders_note(catalog: Catalog) -> str:
    """Markdown: the watched folders (paths shown literally)."""
    folders = catalog.memory.folders()
    if not folders:
        return "Also listed: GGUF files in folders you watch (none yet)."
    return "Watching: " + ", ".join(literal(f) for f in folders)


def header(models: ModelManager, finished: bool = False) -> str:
    """The brand and the model badge: "<name> · int4 g32 · 95 MB" (no format for a remote);
    while a model loads, its progress bar and percentage beside it (`finished`: the bar of a
    load that has just succeeded, at 100%, for the update that ends the load)."""
    name = html.escape(models.model_name or "no model")
    fmt = html.escape(models.weights_format)
    weights = f" · <span class='lp-weights'>{fmt}</span>" if fmt else ""
    return (f"<div class='lp-head'>{BRAND}{load_bar(models, finished)}<div class='lp-model'>"
            f"<span class='lp-badge'>model</span> <code>{name}</code>{weights}</div></div>")


def load_bar(models: ModelManager, finished: bool = False) -> str:
    """The running load as a <progress> bar with its percentage and step ("" when none runs;
    with `finished`, the last load's if it succeeded)."""
    job = models.job
    if job is None or (job.done.is_set() and not (finished and job.error is None)):
        return ""
    pct = job.percent()
    what = html.escape(f"{job.phase}: {job.detail}" if job.detail else job.phase)
    return (f"<div id='lp-load' style='{BAR_STYLE}' role='status'>"
            f"<span>{'Loaded' if job.done.is_set() else 'Loading'} "
            f"<code>{html.escape(model_label(job.name))}</code></span>"
            f"<progress id='lp-load-bar' max='100' value='{pct}'></progress>"
            f"<b id='lp-load-pct'>{pct}%</b><span class='lp-load-what'>{what}</span></div>")
