"""A reasoning model in the chat, without a browser: ChatController.send on the tiny model that
never closes its reasoning on its own (helpers/reasoning_models.py).

Oracle: transformers' greedy tokens under the budget (hf_budgeted), decoded by the tokenizer. The
conversation's thinking budget (a setting) reaches the engine; the stored reply's text is the
answer without markers, its reasoning is kept apart (`extra.reasoning`, the token count in its
stats), export and import keep it, and the chat shows it folded ("Thought for N tokens"), with
the text escaped. The conversation's enable_thinking (a setting, shown only for a template that
reads it) gives the template's no-thinking prompt to the request and the gauge alike.
"""

from __future__ import annotations

import html

import gradio as gr
import pytest
from helpers.engine_helpers import hf_greedy
from helpers.reasoning_models import (HARMONY_FORCED, QUESTION, build_harmony_thinker,
                                      build_thinker, hf_budgeted)
from helpers.ui_helpers import TinyBackend, controller, run, tiny_backend

from localpaged import LLM
from localpaged.chat.backend import with_thinking
from localpaged.ui import render
from localpaged.ui.chat.view import tab_values
from localpaged.ui.live_reply import LiveReply

GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": None,
          "max_tokens": 30}


@pytest.fixture(scope="module")
def thinker(tiny_root):
    return build_thinker(tiny_root)


@pytest.fixture(scope="module")
def backend(thinker):
    b = TinyBackend(LLM(thinker, num_kv_blocks=128).engine)      # the model's own template
    yield b
    b.engine.shutdown()


@pytest.fixture
def ctl(backend, tmp_path):
    yield from controller(backend, tmp_path, GREEDY)


def test_the_budget_setting_ends_the_reasoning_and_the_reply_keeps_it_apart(ctl, backend, thinker):
    cid = ctl.new_conversation().id
    ctl.update_setting(cid, "reasoning_budget", "7")
    turn = run(ctl.send(cid, QUESTION))
    reply = ctl.store.get_message(turn.replies[0].message_id)
    tok = backend.engine.tokenizer
    prompt = list(tok.apply_chat_template([{"role": "user", "content": QUESTION}],
                                          add_generation_prompt=True, tokenize=True,
                                          return_dict=False))
    ids = hf_budgeted(thinker, prompt, 7, 30)
    assert reply.token_ids == ids
    assert reply.content == tok.decode(ids[10:], skip_special_tokens=True).lstrip()
    assert reply.extra["reasoning"] == tok.decode(ids[:7], skip_special_tokens=True).strip()
    assert reply.content and "<think>" not in reply.content and "</think>" not in reply.content
    assert reply.stats["reasoning_tokens"] == 7 and reply.sampling["reasoning_budget"] == 7
    shown = render.chat_messages(ctl.view(cid))[-1]["content"]
    assert '<details class="lp-think"><summary>Thought for 7 tokens</summary>' in shown
    assert html.escape(reply.content, quote=False) in shown
    # the next turn's prompt has the answer only
    run(ctl.send(cid, QUESTION))
    path = ctl.store.active_path(cid)
    assert path[1].extra["reasoning"] and path[3].extra["reasoning"]


def test_a_harmony_reply_keeps_its_analysis_apart_and_continues(tiny_root, tmp_path):
    """GPT-OSS's channels on the tiny harmony model: the analysis is the reasoning, the final
    channel the answer, in the stored reply and after Continue (which decodes the stored
    tokens again: the markers' special tokens must survive that too)."""
    path = build_harmony_thinker(tiny_root)
    backend = TinyBackend(LLM(path, num_kv_blocks=128).engine)
    try:
        for c in controller(backend, tmp_path, {**GREEDY, "max_tokens": 12}):
            cid = c.new_conversation().id
            c.update_setting(cid, "reasoning_budget", "5")
            reply = c.store.get_message(run(c.send(cid, QUESTION)).replies[0].message_id)
            tok = backend.engine.tokenizer
            prompt = list(tok.apply_chat_template([{"role": "user", "content": QUESTION}],
                                                  add_generation_prompt=True, tokenize=True,
                                                  return_dict=False))
            ids = hf_budgeted(path, prompt, 5, 24, HARMONY_FORCED)
            assert reply.token_ids == ids[:12] and reply.stats["reasoning_tokens"] == 5
            assert reply.extra["reasoning"] == tok.decode(ids[:5], skip_special_tokens=True)
            assert reply.content == tok.decode(ids[11:12], skip_special_tokens=True).lstrip()
            run(c.continue_reply(reply.id))               # 12 tokens more
            done = c.store.get_message(reply.id)
            assert done.token_ids == ids and done.stats["reasoning_tokens"] == 5
            assert done.extra["reasoning"] == reply.extra["reasoning"]
            assert done.content == tok.decode(ids[11:], skip_special_tokens=True).lstrip()
            assert "<|" not in done.content and "final" not in done.content
    finally:
        backend.engine.shutdown()


def _prompt(tok, **template):
    return list(tok.apply_chat_template([{"role": "user", "content": QUESTION}],
                                        add_generation_prompt=True, tokenize=True,
                                        return_dict=False, **template))


def test_thinking_off_sends_the_templates_no_thinking_prompt(ctl, backend, thinker):
    cid = ctl.new_conversation().id
    assert ctl.settings(cid)[1]["enable_thinking"] is True
    ctl.update_setting(cid, "enable_thinking", False)
    assert ctl.settings(cid)[1]["enable_thinking"] is False          # stored
    tok = backend.engine.tokenizer
    off = _prompt(tok, enable_thinking=False)
    assert off != _prompt(tok)                        # the switch changes the prompt
    assert ctl.context_usage(cid, QUESTION).tokens == len(off)      # the gauge counts it
    reply = ctl.store.get_message(run(ctl.send(cid, QUESTION)).replies[0].message_id)
    assert reply.stats["prompt_tokens"] == len(off)
    assert reply.token_ids == hf_greedy(thinker, off, 30)
    assert reply.content == tok.decode(reply.token_ids, skip_special_tokens=True).lstrip()
    assert not reply.extra.get("reasoning") and "reasoning_tokens" not in reply.stats
    ctl.update_setting(cid, "enable_thinking", True)  # on again: the model reasons
    turn = run(ctl.regenerate(reply.id))
    again = ctl.store.get_message(turn.replies[0].message_id)
    assert again.stats["prompt_tokens"] == len(_prompt(tok)) and again.extra["reasoning"]
    with pytest.raises(ValueError, match="enable_thinking"):
        ctl.update_setting(cid, "enable_thinking", "maybe")
    assert ctl.settings(cid)[1]["enable_thinking"] is True           # nothing saved


def test_the_switch_shows_only_for_a_template_that_reads_it(ctl, tiny_llama, tmp_path):
    cid = ctl.new_conversation().id
    ctl.update_setting(cid, "enable_thinking", False)
    (switch,) = [v for v in tab_values(ctl, cid).extras if isinstance(v, gr.Checkbox)]
    assert switch.visible is True and switch.value is False
    for plain in tiny_backend(tiny_llama, num_kv_blocks=64):     # a template without it
        for other in controller(plain, tmp_path / "plain", GREEDY):
            cid = other.new_conversation().id
            other.update_setting(cid, "enable_thinking", False)
            (switch,) = [v for v in tab_values(other, cid).extras if isinstance(v, gr.Checkbox)]
            assert switch.visible is False
            assert with_thinking(plain, False) is plain                 # and no effect
            reply = run(other.send(cid, QUESTION)).replies[0]
            msgs = [{"role": "user", "content": QUESTION}]
            assert reply.stats["prompt_tokens"] == len(plain.prompt_ids(msgs))


def test_export_and_import_keep_the_reasoning(ctl):
    cid = ctl.new_conversation().id
    ctl.update_setting(cid, "reasoning_budget", 3)
    reply = ctl.store.get_message(run(ctl.send(cid, QUESTION)).replies[0].message_id)
    copy = ctl.store.import_json(ctl.store.export_json(cid))
    (kept,) = [m for m in ctl.store.active_path(copy.id) if m.role == "assistant"]
    assert kept.extra["reasoning"] == reply.extra["reasoning"] and kept.content == reply.content
    assert "*Reasoning:*" in ctl.export(cid, "markdown")


def test_a_streaming_reasoning_is_shown_open_and_escaped():
    class Msg:                                          # what render reads of a message
        role, extra, stats, content, status, prepared = "assistant", {}, {}, "", "streaming", None
    live = LiveReply(1, "", reasoning="<img src=x onerror=alert(1)> **hm**",
                     stats={"reasoning_tokens": 1})
    shown = render.reasoning_html(Msg(), live)
    assert shown.startswith('<details class="lp-think" open=""><summary>Thinking… (1 token)')
    assert "<img" not in shown and "&lt;img" in shown and "<strong>hm</strong>" in shown
    assert render._source(Msg(), live) == ""            # the cursor is in the reasoning
