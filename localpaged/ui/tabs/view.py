"""What the page shows of its tab set: the session's `slots` (the conversation of each of the
N_SLOTS chat tabs, None: hidden), the current tab, the tabs themselves and the sidebar's list
of conversations (`PageUI`), and the values a page-level handler returns (`PageValues`, the
tabs' `TabValues` nested), mapped to outputs by `values.py`.

The chat tabs are a pool made when the page is built (chat/view.py says why: a Chatbot does not
keep its value across `gr.render` re-renders, and every page-level handler writes into the tabs'
components from outside any render). A conversation takes a free slot when it opens and gives
it back when its tab is closed. Open tabs are not bounded by the pool: past N_SLOTS shown, an
opening tab takes the slot of another open tab, which stays open under "More tabs" (`more`,
tabs/events.py says which one moves) until it is shown again or closed; only ✕ Close tab closes.
Each slot costs the page about 75 components and 120 KB of config, so the pool is as large as
people keep tabs in view, not larger.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from ..chat.view import ChatTabUI, TabValues
from ..values import KEEP, flatten, outputs

N_SLOTS = 12


@dataclass
class PageValues:
    slots: Any = KEEP                 # conversation id per tab (None: hidden)
    current: Any = KEEP               # index of the selected tab
    tabs: Any = KEEP                  # gr.Tabs(selected=...)
    chat: list[TabValues] = field(default_factory=lambda: [TabValues() for _ in range(N_SLOTS)])
    conversations: Any = KEEP         # the sidebar's list (gr.Radio)
    more: Any = KEEP                  # the open tabs not shown (gr.Dropdown)


@dataclass
class PageUI:
    slots: gr.State
    current: gr.State
    tabs: gr.Tabs
    chat: list[ChatTabUI]
    conversations: gr.Radio
    search: gr.Textbox
    more: gr.Dropdown

    def outputs(self) -> list:
        return outputs(self, PageValues)

    def flatten(self, values: PageValues) -> list:
        return flatten(self, values)
