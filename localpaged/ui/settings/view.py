"""The settings as Gradio fields: the sampling fields (a chat tab's settings, a compare column's):
one component per key of `logic.SAMPLING_KEYS`, returned in that order; a chat tab's penalty
fields, thinking budget and thinking switch (`logic.EXTRA_KEYS`; the switch shown only for a
model whose template reads it: `extra_values`); its presets row (`PresetsUI`: choose a preset,
save the system prompt as one, make the conversation's settings the defaults of new chats)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from .logic import DEFAULT_SAMPLING, EXTRA_KEYS, SAMPLING_KEYS, TEMPLATE_KEYS


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


def extra_fields(prefix: str) -> list:
    """The penalties against repetition, the thinking budget and the thinking switch, one row,
    in EXTRA_KEYS order (elem_ids `{prefix}{key}`); their ranges are the engine's
    (core/sampling_params.py)."""
    d = DEFAULT_SAMPLING
    with gr.Row():
        fields = [
            gr.Number(value=d["repetition_penalty"], minimum=0.01, maximum=100, step=0.05,
                      label="Repetition penalty (1: off)", elem_id=f"{prefix}repetition_penalty"),
            gr.Slider(-2, 2, value=d["presence_penalty"], step=0.1,
                      label="Presence penalty (0: off)", elem_id=f"{prefix}presence_penalty"),
            gr.Slider(-2, 2, value=d["frequency_penalty"], step=0.1,
                      label="Frequency penalty (0: off)", elem_id=f"{prefix}frequency_penalty"),
            gr.Number(value=d["reasoning_budget"], precision=0, minimum=0,
                      label="Thinking budget (tokens; blank: no limit, 0: answer at once)",
                      elem_id=f"{prefix}reasoning_budget"),
            gr.Checkbox(value=d["enable_thinking"], visible=False,
                        label="Thinking (off: this model's template asks it to answer at once)",
                        elem_id=f"{prefix}enable_thinking"),
        ]
    assert len(fields) == len(EXTRA_KEYS)
    return fields


def extra_values(sampling: dict[str, Any], thinking_switch: bool) -> list:
    """The third row's values for a conversation's settings, in EXTRA_KEYS order; the thinking
    switch is shown only where the model's template reads it (`thinking_switch`)."""
    return [gr.Checkbox(value=sampling[k], visible=thinking_switch) if k in TEMPLATE_KEYS
            else sampling[k] for k in EXTRA_KEYS]


@dataclass
class PresetsUI:
    """A chat tab's presets row: elem_ids `preset{i}`, `presetname{i}`, `presetsave{i}`,
    `defaults{i}`."""
    preset: gr.Dropdown
    name: gr.Textbox
    save: gr.Button
    make_default: gr.Button


def build_presets(i: int) -> PresetsUI:
    with gr.Row(equal_height=True, elem_classes="lp-presets"):
        preset = gr.Dropdown([], value=None, label="Preset (fills the system prompt)",
                             elem_id=f"preset{i}", scale=2, allow_custom_value=False)
        name = gr.Textbox(label="Save the system prompt as a preset named", scale=2,
                          max_lines=1, elem_id=f"presetname{i}")
        save = gr.Button("Save preset", size="sm", scale=0, min_width=100, elem_id=f"presetsave{i}")
    make_default = gr.Button("Use these settings for new chats", size="sm",
                             elem_id=f"defaults{i}")
    return PresetsUI(preset, name, save, make_default)
