"""The tools' handlers and wiring: the Tools panel (add, list, remove servers), a chat tab's tool
settings (each saved on its own input, a bad value a toast and nothing saved) and its approval
buttons (the answer goes to the turn waiting in the tab's conversation; the tab's streaming
handler shows what follows).
"""

from __future__ import annotations

import gradio as gr

from ..controller import ChatController
from ..event_settings import QUICK
from ..toasts import USER_ERRORS, info, warn, why
from .mcp_client import ToolError
from .view import ApprovalUI, ToolSettingsUI, ToolsPanelUI, server_choices, server_listing


def wire_tools_panel(panel: ToolsPanelUI, ctl: ChatController, loaded) -> None:
    outs = [panel.listing, panel.remove_choice]

    def shown() -> list:
        return [server_listing(ctl), gr.Dropdown(choices=server_choices(ctl), value=None)]

    def add(name: str, target: str) -> list:
        try:
            server = ctl.tools.add_server(name, target)
        except (*USER_ERRORS, ToolError) as exc:
            warn(f"The server was not added: {why(exc)}")
            return shown() + [gr.skip(), gr.skip()]
        info(f"Added {server.name}: enable it in a conversation's settings.")
        return shown() + ["", ""]

    def remove(server_id) -> list:
        if server_id is not None:
            ctl.tools.remove_server(int(server_id))
        return shown()

    panel.add.click(add, [panel.name, panel.target], outs + [panel.name, panel.target], **QUICK)
    panel.remove.click(remove, panel.remove_choice, outs, **QUICK)
    loaded.then(shown, None, outs, **QUICK)


def wire_tool_settings(ui: ToolSettingsUI, ctl: ChatController, slots: gr.State, i: int) -> None:
    def saver(save):
        def handler(slot_cids: list, value) -> None:
            if slot_cids[i] is None:
                return
            try:
                save(slot_cids[i], value)
            except USER_ERRORS as exc:
                warn(why(exc))
        return handler

    ui.servers.input(saver(lambda cid, v: ctl.tools.set_options(
        cid, servers=[int(s) for s in v or []])), [slots, ui.servers], None, **QUICK)
    ui.steps.input(saver(lambda cid, v: ctl.tools.set_options(
        cid, max_steps=int(v) if v is not None else 0)), [slots, ui.steps], None, **QUICK)
    ui.first.input(saver(lambda cid, v: ctl.tools.set_options(cid, first=v)),
                   [slots, ui.first], None, **QUICK)
    ui.schema.blur(saver(lambda cid, v: ctl.tools.set_json_schema(cid, v)),
                   [slots, ui.schema], None, **QUICK)


def wire_approval(ui: ApprovalUI, ctl: ChatController, slots: gr.State, i: int) -> None:
    def answer(choice: str):
        def handler(slot_cids: list):
            cid = slot_cids[i]
            if cid is None or not ctl.tools.decide(cid, choice):
                warn("No tool call is waiting for an answer here.")
            return gr.Group(visible=False)
        return handler

    for button, choice in ((ui.approve, "approve"), (ui.deny, "deny"), (ui.always, "always")):
        button.click(answer(choice), slots, ui.row, **QUICK)
