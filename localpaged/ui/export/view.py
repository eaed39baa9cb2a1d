"""The export button in a chat tab's settings and the files it offers to download."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr


@dataclass
class ExportUI:
    button: gr.Button
    files: gr.File


def build_export(i: int) -> ExportUI:
    with gr.Row(elem_classes="lp-tight"):
        button = gr.Button("↓ Export (Markdown + JSON)", size="sm", elem_id=f"export{i}")
    files = gr.File(visible=False, file_count="multiple", show_label=False)
    return ExportUI(button, files)
