"""The tools' components: the Tools panel (add an MCP server by command or URL, the servers and
their tools, remove one), a chat tab's tool settings (which servers it uses, the step limit,
whether the first step must call a tool, "reply as JSON matching this schema") and its approval
row (Approve / Deny / Always allow, shown while a call waits). Elem ids a browser test touches:
`tool-name`, `tool-target`, `tool-add`, `tool-list`, `tools{i}`, `toolsteps{i}`,
`toolfirst{i}`, `schema{i}`, `approval{i}`, `approve{i}`, `deny{i}`, `always{i}`.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import gradio as gr

from ..controller import ChatController
from ..tools.logic import FIRST_CHOICES, MAX_STEPS
from ..tools.mcp_client import ToolError

FIRST_LABELS = [("when the model decides", "auto"), ("always call a tool", "required")]


@dataclass
class ToolsPanelUI:
    name: gr.Textbox
    target: gr.Textbox
    add: gr.Button
    listing: gr.HTML
    remove_choice: gr.Dropdown
    remove: gr.Button


def build_tools_panel() -> ToolsPanelUI:
    with gr.Accordion("Tools (MCP servers)", open=False, elem_id="tools-panel"):
        gr.Markdown("Nothing runs until you add a server here and enable it in a "
                    "conversation's settings; every call asks first unless you allow it.")
        name = gr.Textbox(label="Name", elem_id="tool-name", max_lines=1)
        target = gr.Textbox(label="Command (stdio) or http(s) URL", elem_id="tool-target",
                            max_lines=1, placeholder="python my_server.py  |  http://127.0.0.1:8000/mcp")
        add = gr.Button("Add server", size="sm", elem_id="tool-add")
        listing = gr.HTML(elem_id="tool-list")
        with gr.Row(elem_classes="lp-tight"):
            remove_choice = gr.Dropdown(label="Remove", choices=[], value=None,
                                        elem_id="tool-remove-choice", scale=3)
            remove = gr.Button("Remove", size="sm", elem_id="tool-remove", scale=1)
    return ToolsPanelUI(name, target, add, listing, remove_choice, remove)


def server_listing(ctl: ChatController) -> str:
    """The servers and their tools (HTML of escaped text)."""
    rows = []
    for server in ctl.tools.servers():
        try:
            tools = ", ".join(t.name for t in ctl.tools.tools(server.id)) or "no tools"
        except ToolError as exc:
            tools = f"does not answer: {exc}"
        rows.append(f"<li><b>{html.escape(server.label)}</b>: {html.escape(tools)}</li>")
    return f"<ul>{''.join(rows)}</ul>" if rows else "<p><sub>No tool servers yet.</sub></p>"


def server_choices(ctl: ChatController) -> list[tuple[str, int]]:
    return [(s.name, s.id) for s in ctl.tools.servers()]


@dataclass
class ToolSettingsUI:
    servers: gr.CheckboxGroup
    steps: gr.Number
    first: gr.Radio
    schema: gr.Textbox


def build_tool_settings(i: int) -> ToolSettingsUI:
    servers = gr.CheckboxGroup(label="Tools for this conversation", choices=[],
                               elem_id=f"tools{i}")
    with gr.Row(elem_classes="lp-tight"):
        steps = gr.Number(label="Tool steps per turn", value=3, minimum=1, maximum=MAX_STEPS,
                          precision=0, elem_id=f"toolsteps{i}")
        first = gr.Radio(FIRST_LABELS, value=FIRST_CHOICES[0], label="First step",
                         elem_id=f"toolfirst{i}")
    schema = gr.Textbox(label="Reply as JSON matching this schema (empty: free text)", lines=2,
                        max_lines=12, elem_id=f"schema{i}")
    return ToolSettingsUI(servers, steps, first, schema)


def tool_settings_values(ctl: ChatController, cid: int) -> list:
    opts = ctl.tools.options(cid)
    return [gr.CheckboxGroup(choices=server_choices(ctl), value=opts.servers), opts.max_steps,
            opts.first, ctl.tools.json_schema(cid)]


@dataclass
class ApprovalUI:
    row: gr.Group
    text: gr.Markdown
    approve: gr.Button
    deny: gr.Button
    always: gr.Button


def build_approval(i: int) -> ApprovalUI:
    with gr.Group(visible=False, elem_id=f"approval{i}", elem_classes="lp-ask") as row:
        text = gr.Markdown(elem_id=f"approvaltext{i}")
        with gr.Row(elem_classes="lp-tight"):
            approve = gr.Button("Approve", variant="primary", size="sm", elem_id=f"approve{i}")
            deny = gr.Button("Deny", size="sm", elem_id=f"deny{i}")
            always = gr.Button("Always allow this tool in this conversation", size="sm",
                               elem_id=f"always{i}")
    return ApprovalUI(row, text, approve, deny, always)


def approval_values(ctl: ChatController, cid: int) -> tuple:
    """(the row's visibility, its text) for the call waiting in conversation cid."""
    pending = getattr(ctl.turn(cid), "pending", None)
    if not pending:
        return gr.Group(visible=False), ""
    args = " ".join(str(pending["arguments"])[:2000].replace("`", "'").split())
    return gr.Group(visible=True), (f"**Run the tool `{pending['name'][:64]}`?** "
                                    f"Arguments: `{args}`")
