"""Extended thinking on the Anthropic Messages API (api/anthropic: convert.thinking, events.Reply),
on the tiny model that never closes its reasoning on its own (helpers/reasoning_models.py),
driven by the official `anthropic` client and raw SSE.

Oracle: transformers' greedy tokens under the budget (hf_budgeted), decoded by the tokenizer:
the `thinking` block holds the text of the model's own reasoning tokens, the `text` block the
text after the forced marker and transition; streamed, a thinking block's `thinking_delta`s
come first and add up to the same texts. `disabled` gives the template's no-thinking prompt.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest
from helpers.api_server import MODEL, serve_model
from helpers.engine_helpers import hf_greedy
from helpers.reasoning_models import QUESTION, hf_budgeted

MESSAGES = [{"role": "user", "content": QUESTION}]
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def served(thinker):
    yield from serve_model(thinker)


@pytest.fixture(scope="module")
def client(served):
    url = str(served[1].base_url).removesuffix("/v1/")
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=60)


def _prompt(engine, messages=MESSAGES, **template):
    return list(engine.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False, **template))


def _expected(engine, thinker, budget, total):
    tok = engine.tokenizer
    ids = hf_budgeted(thinker, _prompt(engine), budget, total)
    return (tok.decode(ids[:budget], skip_special_tokens=True).strip(),
            tok.decode(ids[budget + 3:], skip_special_tokens=True).lstrip())


def _create(client, messages=MESSAGES, max_tokens=30, **kw):
    return client.messages.create(model=MODEL, messages=messages, max_tokens=max_tokens,
                                  extra_body=GREEDY, **kw)


def test_a_thinking_block_comes_before_the_text(client, served, thinker):
    r = _create(client, thinking={"type": "enabled", "budget_tokens": 8})
    assert [b.type for b in r.content] == ["thinking", "text"]
    thinking, text = _expected(served[0], thinker, 8, 30)
    assert (r.content[0].thinking, r.content[1].text) == (thinking, text)
    assert r.content[0].signature == "" and thinking and text
    assert r.usage.output_tokens == 30 and r.stop_reason == "max_tokens"
    assert "<think>" not in text and "</think>" not in text + thinking


def _events(served, body) -> list[tuple[str, dict]]:
    client = served[1]
    with client.stream("POST", "/messages", json=body | {"stream": True}) as resp:
        lines = [line for line in resp.iter_lines() if line]
    names = [line[7:] for line in lines if line.startswith("event: ")]
    data = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert names == [d["type"] for d in data]
    return list(zip(names, data))


def test_streamed_thinking_deltas_then_the_text_block(client, served, thinker):
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 30, **GREEDY,
            "thinking": {"type": "enabled", "budget_tokens": 6}}
    events = _events(served, body)
    kinds = [n for n, _ in events]
    assert kinds[:3] == ["message_start", "ping", "content_block_start"]
    assert events[2][1] == {"type": "content_block_start", "index": 0,
                            "content_block": {"type": "thinking", "thinking": "",
                                              "signature": ""}}
    stop0 = kinds.index("content_block_stop")
    assert {d["delta"]["type"] for n, d in events[3:stop0]} == {"thinking_delta"}
    assert all(d["index"] == 0 for _, d in events[3:stop0])
    assert events[stop0 + 1][1]["content_block"] == {"type": "text", "text": ""}
    text_deltas = [d["delta"] for n, d in events[stop0 + 2:] if n == "content_block_delta"]
    assert {d["type"] for d in text_deltas} == {"text_delta"}
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert kinds.count("content_block_start") == 2
    streamed = ("".join(d["delta"]["thinking"] for _, d in events[3:stop0]),
                "".join(d["text"] for d in text_deltas))
    assert streamed == _expected(served[0], thinker, 6, 30)
    with client.messages.stream(model=MODEL, messages=MESSAGES, max_tokens=30, extra_body=GREEDY,
                                thinking={"type": "enabled", "budget_tokens": 6}) as stream:
        final = stream.get_final_message()
    assert (final.content[0].thinking, final.content[1].text) == streamed


def test_disabled_thinking_is_the_templates_no_thinking_prompt(client, served, thinker):
    engine = served[0]
    r = _create(client, max_tokens=12, thinking={"type": "disabled"})
    prompt = _prompt(engine, enable_thinking=False)
    assert r.usage.input_tokens == len(prompt)
    assert [b.type for b in r.content] == ["text"]
    assert r.content[0].text == engine.tokenizer.decode(
        hf_greedy(thinker, prompt, 12), skip_special_tokens=True).lstrip()
    counted = client.messages.count_tokens(model=MODEL, messages=MESSAGES,
                                           thinking={"type": "disabled"})
    assert counted.input_tokens == len(prompt)


def test_without_thinking_the_reasoning_still_comes_apart(client):
    r = _create(client, max_tokens=10)                   # never closed: all of it thinking
    assert [b.type for b in r.content] == ["thinking"] and r.content[0].thinking


def test_earlier_thinking_blocks_are_dropped_from_the_prompt(client, served):
    engine = served[0]
    answer = QUESTION[3:6]
    history = [{"role": "user", "content": QUESTION},
               {"role": "assistant", "content": [
                   {"type": "thinking", "thinking": QUESTION[:4], "signature": "sig"},
                   {"type": "redacted_thinking", "data": "opaque"},
                   {"type": "text", "text": answer}]},
               {"role": "user", "content": QUESTION[::-1]}]
    plain = [history[0], {"role": "assistant", "content": answer}, history[2]]
    r = _create(client, history, max_tokens=4, thinking={"type": "enabled", "budget_tokens": 2})
    assert r.usage.input_tokens == len(_prompt(engine, plain))
    counted = client.messages.count_tokens(model=MODEL, messages=history)
    assert counted.input_tokens == len(_prompt(engine, plain))


def _error(r: httpx.Response) -> str:
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    return r.json()["error"]["message"]


@pytest.mark.parametrize("thinking,named", [({"type": "enabled"}, "budget_tokens"),
                                           ({"type": "enabled", "budget_tokens": -1},
                                            "budget_tokens"),
                                           ({"type": "enabled", "budget_tokens": "8"},
                                            "budget_tokens"),
                                           ({"type": "sometimes"}, "thinking")])
def test_bad_thinking_is_a_400_naming_the_field(served, thinking, named):
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, "thinking": thinking}
    assert named in _error(served[1].post("/messages", json=body))


def test_a_thinking_block_from_the_user_is_refused(served):
    msgs = [{"role": "user", "content": [{"type": "thinking", "thinking": "x", "signature": ""}]}]
    body = {"model": MODEL, "messages": msgs, "max_tokens": 4}
    assert "messages[0].content[0]" in _error(served[1].post("/messages", json=body))


def test_a_model_that_marks_no_reasoning_ignores_thinking(base_url):
    client = anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0, timeout=60)
    r = _create(client, max_tokens=4, thinking={"type": "enabled", "budget_tokens": 2})
    assert [b.type for b in r.content] == ["text"] and r.usage.output_tokens == 4
