"""The KV disk tier's component: one button that empties it (the engine panel shows its size)."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr


@dataclass
class KVDiskUI:
    clear: gr.Button


def build_kv_disk() -> KVDiskUI:
    return KVDiskUI(gr.Button("Clear the KV disk cache", size="sm", variant="secondary",
                              elem_id="kv-disk-clear"))
