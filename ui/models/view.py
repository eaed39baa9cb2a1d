"""The model picker's components and what they show: the header's model badge (name and weights
format, e.g. "int4 g32 · 95 MB") and the model panel (a Hub id or local path to load, with a
weight format for a local engine, and the load's progress), read from `logic.ModelManager`."""

from __future__ import annotations

import html
from dataclasses import dataclass

import gradio as gr

from localpaged.core.config import QUANTIZATION, default

from ..style import BRAND
from .logic import ModelManager

QUANT_LABELS = {"auto": "auto (a GGUF keeps its bit width)", "none": "none (float weights)",
                "int8": "int8", "int4": "int4 (group 32)"}


@dataclass
class ModelPickerUI:
    header: gr.HTML
    name: gr.Textbox
    quantization: gr.Dropdown     # hidden for a remote backend (no weights of ours)
    load: gr.Button
    status: gr.Markdown


def build_header(models: ModelManager) -> gr.HTML:
    return gr.HTML(header(models), elem_id="lp-header", js_on_load=None)


def build_model_panel(models: ModelManager, header_html: gr.HTML) -> ModelPickerUI:
    with gr.Accordion("Model", open=True, elem_id="model-acc"):
        name = gr.Textbox(value=models.model_name or "", label="Hub id or local path",
                          elem_id="model-name")
        quant = gr.Dropdown([(QUANT_LABELS[q], q) for q in QUANTIZATION],
                            value=models.quantization or default("quantization"), label="Weights",
                            elem_id="model-quant", visible=models.quantization is not None)
        load = gr.Button("Load model", elem_id="model-load", size="sm")
        status_md = gr.Markdown(models.status(), elem_id="model-status")
    return ModelPickerUI(header_html, name, quant, load, status_md)


def header(models: ModelManager) -> str:
    """The brand and the model badge: "<name> · int4 g32 · 95 MB" (no format for a remote)."""
    name = html.escape(models.model_name or "no model")
    fmt = html.escape(models.weights_format)
    weights = f" · <span class='lp-weights'>{fmt}</span>" if fmt else ""
    return (f"<div class='lp-head'>{BRAND}<div class='lp-model'><span class='lp-badge'>model"
            f"</span> <code>{name}</code>{weights}</div></div>")
