"""The chat app's Gradio Blocks: the page from `layout.py`, wired to `events.py` and
`compare.py`, plus the engine panel (refreshed by a timer) and the model picker.

Generation events of every tab share one concurrency group with room for many at once, so
conversations stream side by side (in one engine batch); stop, switch and the rest are quick
events of their own. `build_demo(controller, models)` returns the Blocks; `localpaged.cli`
mounts it on the FastAPI app. `THEME` and `CSS` go to `mount_gradio_app`/`launch`.
"""

from __future__ import annotations

import html
import logging
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import gradio as gr

from . import kvmap, render
from .compare import CompareEvents, build_compare
from .controller import ChatController
from .events import N_SLOTS, Events, warn
from .layout import SlotUI, build_right, build_sidebar, build_slot
from .models import ModelManager
from .style import BRAND, CSS, THEME

log = logging.getLogger(__name__)

# The streaming text (with its ▌ cursor and the tab's ● mark) is the progress indicator.
GEN = {"concurrency_id": "generate", "concurrency_limit": 16, "show_progress": "hidden"}
QUICK = {"concurrency_id": "quick", "concurrency_limit": 8, "show_progress": "hidden"}

__all__ = ["build_demo", "CSS", "THEME"]


def build_demo(ctl: ChatController, models: ModelManager) -> gr.Blocks:
    ev, cev = Events(ctl), CompareEvents(ctl)
    with gr.Blocks(title="localpaged", fill_width=True) as demo:
        slots, current = gr.State([None] * N_SLOTS), gr.State(0)
        last_panel = gr.State("")
        model_badge = gr.HTML(_header(models), elem_id="lp-header", js_on_load=None)
        with gr.Row(elem_id="lp-body", equal_height=False):
            with gr.Column(scale=1, min_width=230, elem_id="lp-sidebar"):
                side = build_sidebar()
            with gr.Column(scale=4, min_width=520, elem_id="lp-main"):
                sels = [gr.State(None) for _ in range(N_SLOTS)]
                with gr.Tabs(elem_id="lp-tabs", overflow_behavior="wrap") as tabs:
                    ui = [build_slot(i, sels[i]) for i in range(N_SLOTS)]
                    with gr.Tab("⚖ Compare", id="compare", elem_id="tab-compare") as cmp_tab:
                        cmp = build_compare()
            with gr.Column(scale=2, min_width=300, elem_id="lp-right"):
                right = build_right(models.model_name, _status(models))
        timer = gr.Timer(1.0)

        all_fields = [f for s in ui for f in s.fields()]
        layout_out = [slots, current, tabs, *all_fields, side.conversations]
        sidebar_args = dict(fn=ev.sidebar, inputs=[side.search, slots, current],
                            outputs=side.conversations, **QUICK)

        def refresh_after(event) -> None:
            """After an event that may change titles: sidebar and tab labels."""
            event.then(**sidebar_args).then(ev.titles, slots, [s.tab for s in ui], **QUICK)

        def follow_all(event) -> None:
            for i, s in enumerate(ui):
                event.then(_bind_follow(ev, i), slots, s.chat()[:4], **GEN)

        # ---- page load: the tabs open before, their running replies ----------------------
        load = demo.load(ev.restore, None, layout_out, **QUICK)
        load.then(**sidebar_args)
        follow_all(load)

        # ---- sidebar -----------------------------------------------------------------------
        opened = side.new.click(ev.new, [slots, current], layout_out, **QUICK)
        refresh_after(opened)
        opened = side.conversations.select(_open_selected(ev), [slots, current], layout_out, **QUICK)
        follow_all(opened)
        side.search.change(**sidebar_args)
        side.rename.click(_rename_open(ctl), side.conversations,
                          [side.rename_row, side.rename_box], **QUICK)
        renamed = side.rename_ok.click(ev.rename, [side.conversations, side.rename_box], None, **QUICK)
        renamed.success(lambda: gr.Group(visible=False), None, side.rename_row, **QUICK)
        refresh_after(renamed)
        side.rename_cancel.click(lambda: gr.Group(visible=False), None, side.rename_row, **QUICK)
        side.delete.click(_delete_ask(ctl), side.conversations,
                          [side.delete_row, side.delete_md], **QUICK)
        deleted = side.delete_yes.click(ev.delete, [slots, current, side.conversations],
                                        layout_out, **QUICK)
        deleted.then(lambda: gr.Group(visible=False), None, side.delete_row, **QUICK)
        refresh_after(deleted)
        side.delete_no.click(lambda: gr.Group(visible=False), None, side.delete_row, **QUICK)

        # ---- chat tabs -------------------------------------------------------------------------
        for i, s in enumerate(ui):
            _wire_slot(ev, i, s, slots, current, layout_out, refresh_after, follow_all)

        # ---- compare -----------------------------------------------------------------------
        cmp_tab.select(cev.targets, [slots, current], cmp.target, **QUICK)
        for trigger in (cmp.k.change, cmp.own.change):
            trigger(cev.layout, [cmp.k, cmp.own],
                    [c.box for c in cmp.columns] + [c.settings for c in cmp.columns])
        cmp_outputs = [cmp.state, *cmp.output_boxes(), *[c.pick for c in cmp.columns], cmp.prompt]
        ran = cmp.run.click(cev.run, [cmp.target, cmp.prompt, cmp.k, cmp.own, *cmp.settings_inputs()],
                            cmp_outputs, **GEN)
        refresh_after(ran)
        ran.then(ev.refresh_tabs, slots, [f for s in ui for f in s.chat()], **QUICK)
        cmp.stop.click(cev.stop, cmp.state, None, **QUICK)
        for j, col in enumerate(cmp.columns):
            picked = col.pick.click(_pick(ev, cev, j), [cmp.state, slots, current], layout_out, **QUICK)
            refresh_after(picked)

        # ---- engine panel and model picker ----------------------------------------------
        timer.tick(_engine_panel(ctl), [slots, last_panel], [right.engine, last_panel], **QUICK)
        loaded = right.load.click(_load_model(models), right.model_box,
                                  [right.model_status, model_badge], **GEN)
        loaded.then(ev.titles, slots, [s.tab for s in ui], **QUICK)
    return demo


def _wire_slot(ev: Events, i: int, s: SlotUI, slots, current, layout_out, refresh_after,
               follow_all) -> None:
    settings = [s.system, *s.sampling]

    def send(slot_cids, text, system, *sampling) -> Iterator[list]:
        yield from ev.send(slot_cids, i, text, system, *sampling)

    def regenerate(slot_cids, sel, system, *sampling) -> Iterator[list]:
        yield from ev.regenerate(slot_cids, i, sel, system, *sampling)

    # Gradio injects event data by annotation, so these two spell out their parameters.
    def retry(slot_cids, system, temperature, top_p, top_k, min_p, seed, max_tokens,
              evt: gr.RetryData) -> Iterator[list]:
        yield from ev.regenerate(slot_cids, i, evt.index, system, temperature, top_p, top_k,
                                 min_p, seed, max_tokens)

    def edit(slot_cids, sel, text, system, *sampling) -> Iterator[list]:
        yield from ev.edit(slot_cids, i, sel, text, system, *sampling)

    def edit_inline(slot_cids, system, temperature, top_p, top_k, min_p, seed, max_tokens,
                    evt: gr.EditData) -> Iterator[list]:
        yield from ev.edit(slot_cids, i, evt.index, evt.value, system, temperature, top_p,
                           top_k, min_p, seed, max_tokens)

    def select(slot_cids, evt: gr.SelectData) -> list:
        return ev.select(slot_cids, i, evt)

    chat_out = s.chat()
    for trigger in (s.send.click, s.msg.submit):
        refresh_after(trigger(send, [slots, s.msg, *settings], chat_out + [s.msg], **GEN))
    refresh_after(s.regen.click(regenerate, [slots, s.sel, *settings], chat_out, **GEN))
    s.chatbot.retry(retry, [slots, *settings], chat_out, **GEN)
    s.chatbot.edit(edit_inline, [slots, *settings], chat_out, **GEN)
    s.chatbot.select(select, slots, [s.sel_md, s.sel], **QUICK)
    s.stop.click(lambda c: ev.stop(c, i), slots, None, **QUICK)
    s.prev.click(lambda c, sel: ev.switch(c, i, sel, -1), [slots, s.sel], chat_out, **QUICK)
    s.next.click(lambda c, sel: ev.switch(c, i, sel, 1), [slots, s.sel], chat_out, **QUICK)
    s.edit.click(lambda c, sel: ev.edit_open(c, i, sel), [slots, s.sel], [s.edit_row, s.edit_box],
                 **QUICK)
    s.edit_save.click(lambda: gr.Group(visible=False), None, s.edit_row, **QUICK)
    s.edit_save.click(edit, [slots, s.sel, s.edit_box, *settings], chat_out, **GEN)
    s.edit_cancel.click(lambda: gr.Group(visible=False), None, s.edit_row, **QUICK)
    forked = s.fork.click(lambda c, cur, sel: ev.fork(c, cur, i, sel), [slots, current, s.sel],
                          layout_out, **QUICK)
    refresh_after(forked)
    s.close.click(lambda c: ev.close(c, i), slots, layout_out, **QUICK)
    s.tab.select(lambda c: ev.select_tab(c, i), slots, [current, layout_out[-1]], **QUICK)
    s.export.click(lambda c: _export(ev, c, i), slots, s.export_files, **QUICK)
    for field in s.sampling:
        field.input(lambda c, *v: ev.save_settings(c, i, *v), [slots, *settings], None, **QUICK)
    s.system.blur(lambda c, *v: ev.save_settings(c, i, *v), [slots, *settings], None, **QUICK)


def _bind_follow(ev: Events, i: int):
    def follow(slot_cids) -> Iterator[list]:
        yield from ev.follow(slot_cids, i)
    return follow


def _open_selected(ev: Events):
    def open_selected(slot_cids, cur, evt: gr.SelectData) -> list:
        return ev.open(slot_cids, cur, evt.value if isinstance(evt.value, int) else None)
    return open_selected


def _rename_open(ctl: ChatController):
    def rename_open(cid):
        if cid is None:
            warn("Pick a conversation in the list first.")
            return gr.skip(), gr.skip()
        return gr.Group(visible=True), ctl.store.get_conversation(cid).title
    return rename_open


def _delete_ask(ctl: ChatController):
    def delete_ask(cid):
        if cid is None:
            warn("Pick a conversation in the list first.")
            return gr.skip(), gr.skip()
        title = render.escape_markdown(ctl.store.get_conversation(cid).title)
        return gr.Group(visible=True), (f"Delete **{title}** and all its branches? "
                                         "This cannot be undone.")
    return delete_ask


def _pick(ev: Events, cev: CompareEvents, j: int):
    def pick(state, slot_cids, cur) -> list:
        cid = cev.pick(state, j)
        return ev.open(slot_cids, cur, cid, refresh=True)
    return pick


def _export(ev: Events, slot_cids: list, i: int):
    cid = slot_cids[i]
    folder = Path(tempfile.mkdtemp(prefix="localpaged-export-"))
    md, js = folder / f"conversation-{cid}.md", folder / f"conversation-{cid}.json"
    md.write_text(ev.ctl.export(cid, "markdown"), encoding="utf-8")
    js.write_text(ev.ctl.export(cid, "json"), encoding="utf-8")
    return gr.File(value=[str(md), str(js)], visible=True)


def _engine_panel(ctl: ChatController):
    def tick(slot_cids, last):
        try:
            page = kvmap.render_panel(kvmap.collect(ctl, [c for c in slot_cids or [] if c]))
        except Exception:  # noqa: BLE001 - a panel refresh must never break the page
            log.exception("engine panel refresh failed")
            return gr.skip(), gr.skip()
        return (gr.skip(), gr.skip()) if page == last else (page, page)
    return tick


def _load_model(models: ModelManager):
    def load(name: str) -> Iterator[tuple]:
        try:
            job = models.load(name or "")
        except ValueError as exc:
            yield str(exc), gr.skip()
            return
        while not job.done.wait(0.5):
            yield _status(models), gr.skip()
        if job.error:
            warn(f"Could not load {job.name}; the current model stays loaded.")
        yield _status(models), _header(models)
    return load


def _status(models: ModelManager) -> str:
    """The model panel's Markdown; model names and errors are user text, so escaped."""
    return render.escape_markdown(models.status())


def _header(models: ModelManager) -> str:
    name = html.escape(models.model_name or "no model")
    return (f"<div class='lp-head'>{BRAND}<div class='lp-model'><span class='lp-badge'>model"
            f"</span> <code>{name}</code></div></div>")
