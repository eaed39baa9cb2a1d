"""A chat tab: its components (`ChatTabUI`), the values a handler returns for it (`TabValues`)
and `tab_values`, which reads one conversation into them.

The page has N_SLOTS chat tabs made up front (Gradio does not keep a Chatbot's value across
dynamic re-renders), shown and hidden as conversations open and close. Every handler of a tab
(`events.py`, and the other features' events) and of the page (`tabs/events.py`) updates a tab
through TabValues: to show something new on every tab, add a component in `build_chat_tab`
(made by the feature's own `view.py` builder when it belongs to one), a field of the same name
in ChatTabUI and in TabValues, and its value in `tab_values` (all here); `values.py` maps it.

Elem ids a browser test touches: `chat{i}`, `msg{i}`, `send{i}`, `stop{i}`, `sel{i}`, `prev{i}`,
`next{i}`, `regen{i}`, `edit{i}`, `fork{i}`, `close{i}`, `editbox{i}`, `editsave{i}`,
`cont{i}`, `compact{i}`, `compactprompt{i}`, `gauge{i}`, `ctxpolicy{i}` (the context features:
context/view.py), `ask{i}`,
`askdrop{i}`, `askedit{i}`, `askcancel{i}` (the "Stop and ask me" dialog), `tokens{i}`,
`tokpanel{i}`, `tokhtml{i}`, `tokalts{i}`, `tokbranch{i}` (the token view: tokens/view.py), `preset{i}`,
`presetname{i}`, `presetsave{i}`, `defaults{i}` (settings/view.py), `sibgo{i}`, `attachbtn{i}`
and `attach{i}` (the files attached to the next message), the tools'
(tools/view.py) ...
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from localpaged.chat.backend import reasoning_of

from .. import markdown, render
from ..context.view import (GAUGE_EMPTY, build_compact, build_compact_prompt, build_continue,
                            build_gauge, build_policy, gauge_value)
from ..controller import ChatController
from ..edit_preview.view import build_edit_cost
from ..delete_branch.view import build_delete_button, build_delete_confirm
from ..export.view import ExportUI, build_export
from ..prepared.view import build_prepare_fields, prepare_values
from ..settings.logic import SAMPLING_KEYS
from ..settings.view import build_presets, extra_fields, extra_values, sampling_fields
from ..tokens.view import build_tokens_button, build_tokens_panel
from ..tools.view import (approval_values, build_approval, build_tool_settings,
                          tool_settings_values)
from ..values import KEEP, flatten, outputs


@dataclass
class TabValues:
    """What a handler sets on one chat tab; KEEP leaves a component as it is."""
    tab: Any = KEEP                   # gr.Tab(label=..., visible=...)
    chatbot: Any = KEEP               # the messages of the shown path
    sel_md: Any = KEEP                # which message the toolbar acts on (Markdown)
    sel: Any = KEEP                   # its index on the path (None: none)
    sel_text: Any = KEEP              # its own text, for the Copy button's clipboard step
    msg: Any = KEEP                   # the message box ("" after a send)
    edit_row: Any = KEEP              # the edit box's group (visibility)
    edit_box: Any = KEEP              # the text being edited
    system: Any = KEEP                # the conversation's system prompt
    sampling: Any = KEEP              # its sampling settings, in SAMPLING_KEYS order
    prepare: Any = KEEP               # its prepared-alternatives options (prepared/view.py)
    gauge: Any = KEEP                 # the context gauge (HTML)
    policy: Any = KEEP                # the conversation's context policy
    compact_prompt: Any = KEEP        # its compaction prompt (context/compact.py)
    extras: Any = KEEP                # its penalties and thinking settings, in EXTRA_KEYS order
    preset: Any = KEEP                # the presets dropdown (choices; no value: a chooser)
    preset_name: Any = KEEP           # the name a preset is saved under
    ask: Any = KEEP                   # the "Stop and ask me" dialog (visibility)
    ask_md: Any = KEEP                # what the dialog says
    ask_for: Any = KEEP               # what it asks about: None (a send) or ASKED_FOR's dict
    ask_drop: Any = KEEP              # its "drop the oldest" button (label)
    ask_edit: Any = KEEP              # its "edit my message" button (visibility)
    approval: Any = KEEP              # a tool call waiting for approval (tools/view.py)
    approval_md: Any = KEEP
    tool_settings: Any = KEEP         # servers, steps, first step, JSON schema
    attach: Any = KEEP                # the files attached to the next message (None after a send)


@dataclass
class ChatTabUI:
    index: int
    tab: gr.Tab
    chatbot: gr.Chatbot
    sel_md: gr.Markdown
    sel: gr.State
    prev: gr.Button
    next: gr.Button
    regen: gr.Button
    edit: gr.Button
    fork: gr.Button
    close: gr.Button
    edit_row: gr.Group
    edit_box: gr.Textbox
    edit_save: gr.Button
    edit_cancel: gr.Button
    msg: gr.Textbox
    send: gr.Button
    stop: gr.Button
    system: gr.Textbox
    sampling: list = field(default_factory=list)       # one field per SAMPLING_KEYS
    export: ExportUI | None = None
    prepare: list = field(default_factory=list)        # prepared.view.build_prepare_fields
    edit_cost: Any = None                              # edit_preview.view.build_edit_cost
    gauge: Any = None                 # context/view.py: gauge, policy, Continue
    policy: Any = None
    cont: Any = None
    copy: Any = None                  # Copy: the selected message's text (Markdown) to the clipboard
    sel_text: Any = None              # a hidden textbox the Copy button fills, then copies
    extras: list = field(default_factory=list)         # settings.view.extra_fields
    presets: Any = None               # settings.view.PresetsUI (its preset, name: below)
    preset: Any = None
    preset_name: Any = None
    ask: Any = None                   # AskUI's column, text and buttons (build_ask)
    ask_md: Any = None
    ask_ui: Any = None
    sibnav: Any = None                # hidden: "index step" from a click on ‹ or › in a message
    sibgo: Any = None                 # hidden: clicked with it (chat/message_events.py: SIBLING_JS)
    delete_branch: Any = None         # delete_branch.view.DeleteBranchUI: Delete… and its question
    approval: Any = None              # tools.view.ApprovalUI's row and text
    approval_md: Any = None
    approval_ui: Any = None
    tool_settings: list = field(default_factory=list)  # tools.view.ToolSettingsUI's fields
    tool_ui: Any = None
    attach: Any = None                # the attached files' list (each name with its remove button)
    attach_button: Any = None         # 📎 Attach: adds files to that list
    tokens: Any = None                # tokens.view.TokensUI: the selected reply token by token
    compact: Any = None               # context/view.py: Compact, and its prompt in the settings
    compact_prompt: Any = None
    ask_for: Any = None               # AskUI's state and buttons, as TabValues sets them
    ask_drop: Any = None
    ask_edit: Any = None

    def outputs(self) -> list:
        return outputs(self, TabValues)

    def flatten(self, values: TabValues) -> list:
        return flatten(self, values)


def tab_update(view) -> gr.Tab:
    """The tab of a shown conversation: its label (● while it generates), visible."""
    return gr.Tab(label=render.tab_label(view.conversation, view.busy), visible=True)


def tab_values(ctl: ChatController, cid: int | None, sel: int | None = None,
               settings: bool = True) -> TabValues:
    """Tab values for conversation cid (a hidden tab for None); `sel` (default: the last
    message) is the selected message; `settings` also fills the system prompt and sampling."""
    if cid is None:
        return TabValues(tab=gr.Tab(visible=False), chatbot=[], sel_md="", sel=None)
    view = ctl.view(cid)
    sel = len(view.path) - 1 if sel is None or sel >= len(view.path) else sel
    sel = None if sel < 0 else sel
    values = TabValues(tab=tab_update(view),
                       chatbot=render.chat_messages(view),
                       sel_md=render.selection_label(view, sel), sel=sel)
    # The gauge follows the chat here, in the handler that changed it, rather than through an
    # event on the Chatbot's change: that costs a round trip per streamed chunk. A streaming
    # reply keeps the gauge it had (an opened tab shows it empty) until the reply ends.
    values.gauge = gauge_value(ctl, cid) if not view.busy else GAUGE_EMPTY if settings else KEEP
    values.approval, values.approval_md = approval_values(ctl, cid)
    if settings:
        values.system, sampling = ctl.settings(cid)
        values.sampling = [sampling[k] for k in SAMPLING_KEYS]
        fmt = reasoning_of(ctl.backend())
        values.extras = extra_values(sampling, bool(fmt and fmt.has_switch))
        values.preset = gr.Dropdown(choices=ctl.preset_names(), value=None)
        values.prepare = prepare_values(ctl, cid)
        values.policy = view.conversation.context_policy
        values.compact_prompt = ctl.compact_prompt(cid)
        values.tool_settings = tool_settings_values(ctl, cid)
    return values


def build_chat_tab(i: int, sel: gr.State) -> ChatTabUI:
    """Chat tab i; `sel` (made outside gr.Tabs, which takes only Tab children) holds the
    index of the selected message."""
    with gr.Tab(f"Chat {i + 1}", id=f"slot{i}", visible=False, elem_id=f"tab{i}") as tab:
        # The messages are HTML (render.chat_messages): Gradio's Markdown pass is off, and so are
        # its inline edit and copy buttons, which would edit or copy that HTML (Edit and Copy in
        # the toolbar take the stored text). KaTeX typesets only what markdown.py marked as math
        # (MATH_DELIMITERS), with Gradio's defaults: trust off, errors shown as text.
        # autoscroll off: tabs/events.py FOLLOW_JS keeps a chat at its end without forcing a
        # layout per streamed chunk
        chatbot = gr.Chatbot(elem_id=f"chat{i}", height="62vh", min_height=360, show_label=False,
                             autoscroll=False,
                             buttons=[], sanitize_html=True, allow_tags=False,
                             render_markdown=False, layout="bubble",
                             latex_delimiters=markdown.MATH_DELIMITERS,
                             feedback_options=None, elem_classes="lp-chat",
                             placeholder="**Start the conversation below.**\n\nReplies stream "
                                         "in; every regenerate and edit is kept as a branch.")
        with gr.Row(elem_classes="lp-toolbar", equal_height=True):
            sel_md = gr.Markdown(elem_id=f"sel{i}", elem_classes="lp-sel")
            prev = gr.Button("‹", size="sm", elem_id=f"prev{i}", min_width=34, scale=0)
            nxt = gr.Button("›", size="sm", elem_id=f"next{i}", min_width=34, scale=0)
            regen = gr.Button("↻ Regenerate", size="sm", elem_id=f"regen{i}", scale=0, min_width=110)
            edit = gr.Button("✎ Edit", size="sm", elem_id=f"edit{i}", scale=0, min_width=70)
            fork = gr.Button("⎇ Fork here", size="sm", elem_id=f"fork{i}", scale=0, min_width=96)
            copy = gr.Button("⧉ Copy", size="sm", elem_id=f"copy{i}", scale=0, min_width=70)
            tokens_button = build_tokens_button(i)
            delete_branch = build_delete_button(i)
            sel_text = gr.Textbox(visible="hidden", elem_id=f"seltext{i}", show_label=False,
                                  container=False)
            cont = build_continue(i)
            compact = build_compact(i)
            close = gr.Button("✕ Close tab", size="sm", elem_id=f"close{i}", scale=0, min_width=96)
        with gr.Group(visible=False, elem_classes="lp-edit") as edit_row:
            edit_box = gr.Textbox(label="Edit your message: the old version stays as a branch",
                                  lines=2, max_lines=12, elem_id=f"editbox{i}")
            edit_cost = build_edit_cost(i)
            with gr.Row(elem_classes="lp-tight"):
                edit_save = gr.Button("Save as a new branch", size="sm", variant="primary",
                                      elem_id=f"editsave{i}")
                edit_cancel = gr.Button("Cancel", size="sm", elem_id=f"editcancel{i}")
        build_delete_confirm(i, delete_branch)
        tokens = build_tokens_panel(i, tokens_button)
        with gr.Row(elem_classes="lp-composer", equal_height=True):
            msg = gr.Textbox(placeholder="Message…  (Enter sends, Shift+Enter for a new line)",
                             show_label=False, lines=1, max_lines=10, scale=8,
                             elem_id=f"msg{i}", container=False)
            send = gr.Button("Send", variant="primary", scale=1, min_width=80, elem_id=f"send{i}")
            stop = gr.Button("Stop", variant="stop", scale=1, min_width=80, elem_id=f"stop{i}")
            attach_button = gr.UploadButton("📎 Attach", file_count="multiple", size="sm",
                                            scale=0, min_width=90, elem_id=f"attachbtn{i}")
        # Shown only while files are attached, so the composer keeps its height otherwise.
        attach = gr.File(file_count="multiple", label="Attached to the next message",
                         visible=False, height=120, elem_id=f"attach{i}")
        ask = build_ask(i)
        approval = build_approval(i)
        gauge = build_gauge(i)
        with gr.Accordion("Conversation settings", open=False, elem_id=f"settings{i}"):
            presets = build_presets(i)
            system = gr.Textbox(label="System prompt", lines=2, max_lines=10, elem_id=f"system{i}")
            policy = build_policy(i)
            compact_prompt = build_compact_prompt(i)
            sampling = sampling_fields(f"s{i}-")
            extras = extra_fields(f"s{i}-")
            prepare = build_prepare_fields(i)
            tool_ui = build_tool_settings(i)
            export = build_export(i)
        sibnav = gr.Textbox(visible="hidden", elem_id=f"sibnav{i}", show_label=False,
                            container=False)
        sibgo = gr.Button(visible="hidden", elem_id=f"sibgo{i}")
    return ChatTabUI(i, tab, chatbot, sel_md, sel, prev, nxt, regen, edit, fork, close,
                     edit_row, edit_box, edit_save, edit_cancel, msg, send, stop, system,
                     sampling, export, prepare, edit_cost, gauge, policy, cont, copy, sel_text,
                     extras, presets, presets.preset, presets.name, ask.column, ask.text, ask,
                     sibnav, sibgo, delete_branch, approval.row, approval.text, approval,
                     [tool_ui.servers, tool_ui.steps, tool_ui.first, tool_ui.schema], tool_ui,
                     attach, attach_button, tokens, compact=compact,
                     compact_prompt=compact_prompt, ask_for=ask.asked_for, ask_drop=ask.drop,
                     ask_edit=ask.edit)


@dataclass
class AskUI:
    """The "Stop and ask me" dialog of tab i (elem_ids `ask{i}`, `askdrop{i}`, `askedit{i}`,
    `askcancel{i}`): shown when a send, regenerate or edit under that policy no longer fits the
    context; `asked_for` says which (None: the message box's send; else `asked_for`'s dict)."""
    column: gr.Column
    text: gr.Markdown
    drop: gr.Button
    edit: gr.Button
    cancel: gr.Button
    asked_for: gr.State


def build_ask(i: int) -> AskUI:
    with gr.Column(visible=False, elem_id=f"ask{i}", elem_classes="lp-ask") as column:
        text = gr.Markdown(elem_id=f"asktext{i}")
        with gr.Row(elem_classes="lp-tight"):
            drop = gr.Button("Drop the oldest messages and send", variant="primary", size="sm",
                             elem_id=f"askdrop{i}")
            edit = gr.Button("Edit my message", size="sm", elem_id=f"askedit{i}")
            cancel = gr.Button("Cancel", size="sm", elem_id=f"askcancel{i}")
        asked_for = gr.State(None)
    return AskUI(column, text, drop, edit, cancel, asked_for)


def asked_for(action: str, message_id: int, text: str = "") -> dict:
    """What the dialog asks about besides a send: {"action": "regenerate" | "edit",
    "message_id", "text" (an edit's)}."""
    return {"action": action, "message_id": message_id, "text": text}


def ask_values(dropped: int, asked: dict | None = None) -> dict[str, Any]:
    """The dialog's TabValues fields for a request that no longer fits: a send (`asked` None),
    a regenerate or an edit (`asked_for`): its text (Markdown from numbers and fixed text),
    buttons and what its "drop the oldest" button does."""
    n = f"{dropped} oldest message{'s' if dropped != 1 else ''}"
    left_out = (f"with the {n} left out of the model's context (they stay saved here; this "
                "conversation keeps “Stop and ask me”)")
    action = asked["action"] if asked else "send"
    head = "**This conversation no longer fits the model's context.** "
    text = {"send": f"{head}Your message was not sent and is still in the box. Send it "
                    f"{left_out}, edit your message, or cancel.",
            "regenerate": f"{head}Nothing was generated. Regenerate {left_out}, or cancel.",
            "edit": f"{head}Your edited message was not sent and is still in the edit box. "
                    f"Send it {left_out}, change it there, or cancel."}[action]
    label = "Drop the oldest messages and regenerate" if action == "regenerate" else \
        "Drop the oldest messages and send"
    return {"ask": gr.Column(visible=True), "ask_md": text, "ask_for": asked,
            "ask_drop": gr.Button(label), "ask_edit": gr.Button(visible=action == "send")}
