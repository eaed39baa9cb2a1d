"""The sampling settings as Gradio fields (a chat tab's settings, a compare column's): one
component per key of `logic.SAMPLING_KEYS`, returned in that order."""

from __future__ import annotations

from typing import Any

import gradio as gr

from .logic import DEFAULT_SAMPLING, SAMPLING_KEYS


def sampling_fields(prefix: str, values: dict[str, Any] | None = None,
                    rows: bool = True) -> list:
    """Fields with elem_ids `{prefix}{key}`; `rows` lays them out in two rows of three (a chat
    tab), else one under the other (a narrow compare column)."""
    d = {**DEFAULT_SAMPLING, **(values or {})}
    make = {
        "temperature": lambda: gr.Slider(0, 2, value=d["temperature"], step=0.05,
                                         label="Temperature", elem_id=f"{prefix}temperature"),
        "top_p": lambda: gr.Slider(0.05, 1, value=d["top_p"], step=0.05, label="Top-p",
                                   elem_id=f"{prefix}top_p"),
        "min_p": lambda: gr.Slider(0, 1, value=d["min_p"], step=0.01, label="Min-p",
                                   elem_id=f"{prefix}min_p"),
        "top_k": lambda: gr.Number(value=d["top_k"], precision=0, minimum=0,
                                   label="Top-k (0: off)", elem_id=f"{prefix}top_k"),
        "seed": lambda: gr.Number(value=d["seed"], precision=0, label="Seed (blank: random)",
                                  elem_id=f"{prefix}seed"),
        "max_tokens": lambda: gr.Number(value=d["max_tokens"], precision=0, minimum=1,
                                        label="Max tokens", elem_id=f"{prefix}max_tokens"),
    }
    if not rows:
        built = {k: make[k]() for k in SAMPLING_KEYS}
    else:
        built = {}
        for line in (("temperature", "top_p", "min_p"), ("top_k", "seed", "max_tokens")):
            with gr.Row():
                built.update({k: make[k]() for k in line})
    return [built[k] for k in SAMPLING_KEYS]
