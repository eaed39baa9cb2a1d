"""ui/values.py maps a feature's values dataclass onto its components by field name: every
output of a chat tab, of the page and of the compare tab gets exactly its own value, KEEP
becomes gr.skip(), and a wrong number of list values is refused. Built without a model."""

from __future__ import annotations

import dataclasses

import gradio as gr
import pytest

from localpaged.ui.chat.view import ChatTabUI, TabValues, build_chat_tab
from localpaged.ui.compare.view import CompareValues, build_compare
from localpaged.ui.settings.logic import SAMPLING_KEYS
from localpaged.ui.tabs.view import N_SLOTS, PageUI, PageValues
from localpaged.ui.values import KEEP, changes, flatten, outputs


@pytest.fixture(scope="module")
def page():
    with gr.Blocks():
        slots, current = gr.State(), gr.State()
        sels = [gr.State(None) for _ in range(N_SLOTS)]
        with gr.Tabs() as tabs:
            chats = [build_chat_tab(i, sels[i]) for i in range(N_SLOTS)]
            with gr.Tab("compare"):
                cmp = build_compare()
        radio, search, more = gr.Radio(), gr.Textbox(), gr.Dropdown()
    return PageUI(slots, current, tabs, chats, radio, search, more), cmp


def _is_skip(v) -> bool:
    return v == gr.skip()


def test_a_tab_value_lands_on_its_component(page):
    ui: ChatTabUI = page[0].chat[2]
    comps = ui.outputs()
    values = TabValues(chatbot=[{"role": "user", "content": "x"}], msg="",
                       sampling=[f"v-{k}" for k in SAMPLING_KEYS])
    flat = ui.flatten(values)
    assert len(flat) == len(comps) == len(set(map(id, comps)))
    by_comp = dict(zip(map(id, comps), flat))
    assert by_comp[id(ui.chatbot)] == values.chatbot and by_comp[id(ui.msg)] == ""
    for comp, k in zip(ui.sampling, SAMPLING_KEYS):
        assert by_comp[id(comp)] == f"v-{k}"
    assert _is_skip(by_comp[id(ui.system)]) and _is_skip(by_comp[id(ui.tab)])
    every = {f.name for f in dataclasses.fields(TabValues)}
    assert all(hasattr(ui, name) for name in every)


def test_page_values_nest_each_tab(page):
    ui, _ = page
    comps = ui.outputs()
    assert len(comps) == 3 + sum(len(c.outputs()) for c in ui.chat) + 2   # the list, More tabs
    chat = [TabValues() for _ in range(N_SLOTS)]
    chat[3].sel_md = "third"
    flat = ui.flatten(PageValues(slots=[1, None, None, 2], chat=chat))
    by_comp = dict(zip(map(id, comps), flat))
    assert by_comp[id(ui.slots)] == [1, None, None, 2] and _is_skip(by_comp[id(ui.current)])
    assert by_comp[id(ui.chat[3].sel_md)] == "third"
    assert _is_skip(by_comp[id(ui.chat[2].sel_md)]) and _is_skip(by_comp[id(ui.conversations)])


def test_compare_values_and_a_wrong_count(page):
    _, cmp = page
    comps = outputs(cmp, CompareValues)
    texts = [f"t{j}" for j in range(len(cmp.outs))]
    flat = flatten(cmp, CompareValues(state={"cid": 1}, outs=texts))
    by_comp = dict(zip(map(id, comps), flat))
    assert [by_comp[id(c)] for c in cmp.outs] == texts
    assert all(_is_skip(by_comp[id(c)]) for c in cmp.stats + [cmp.prompt])
    with pytest.raises(ValueError, match="outs"):
        flatten(cmp, CompareValues(outs=texts[:-1]))


def test_sampling_fields_in_key_order():
    from localpaged.ui.settings.logic import from_fields
    assert from_fields((0.5, 0.9, 3, 0.1, 7, 9)) == {
        "temperature": 0.5, "top_p": 0.9, "top_k": 3, "min_p": 0.1, "seed": 7, "max_tokens": 9}
    with pytest.raises(ValueError, match="temperature, top_p"):
        from_fields((0.5, 0.9))


def test_nested_values_cannot_be_kept_wholesale(page):
    ui, _ = page
    with pytest.raises(TypeError, match="PageValues.chat"):
        ui.flatten(PageValues(chat=KEEP))


def test_changes_keeps_only_what_differs():
    before = TabValues(tab=gr.Tab(label="● Chat", visible=True), chatbot=[{"role": "user",
                       "content": "hi"}], sel_md="Reply 1 of 1", sel=1)
    same_tab = TabValues(tab=gr.Tab(label="● Chat", visible=True), chatbot=[{"role": "user",
                         "content": "hi!"}], sel_md="Reply 1 of 1", sel=1)
    step = changes(before, same_tab)
    assert step.tab is KEEP and step.sel_md is KEEP and step.sel is KEEP    # unchanged: kept
    assert step.chatbot == same_tab.chatbot and step.msg is KEEP            # changed: sent
    ended = changes(same_tab, TabValues(tab=gr.Tab(label="Chat", visible=True), sel=1))
    assert ended.tab.constructor_args["label"] == "Chat" and ended.sel is KEEP
    assert changes(None, before) is before                                  # the first: all
    assert changes(before, TabValues(sel=1.0)).sel == 1.0      # 1 and 1.0 are not the same value
