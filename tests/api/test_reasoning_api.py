"""A reasoning model over the OpenAI API (api/reasoning_output.py), on the tiny model that never
closes its reasoning on its own (helpers/reasoning_models.py).

Oracle: transformers' greedy tokens under the budget (hf_budgeted), decoded by the tokenizer:
`reasoning_content` is the text of the model's own reasoning tokens, `content` the text after
the forced marker and transition. Streamed, the reasoning deltas come first, each alone, and
add up to the same texts; no marker text leaks into either, however the tokens fall.
"""

from __future__ import annotations

import json

import httpx
import pytest
from helpers.api_server import MODEL, serve_model
from helpers.reasoning_models import QUESTION, hf_budgeted

from localpaged.api.protocol import ChatCompletionRequest
from localpaged.api.reasoning_output import reasoning_request
from localpaged.chat.reasoning import EFFORT_BUDGETS, reasoning_format
from localpaged.core.sampling_params import SamplingParams

MESSAGES = [{"role": "user", "content": QUESTION}]


@pytest.fixture(scope="module")
def served(thinker):
    yield from serve_model(thinker)


def _body(**kw):
    return {"model": MODEL, "messages": MESSAGES, "temperature": 0, "max_tokens": 30} | kw


def _expected(engine, thinker, budget, total, **template):
    tok = engine.tokenizer
    prompt = list(tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True,
                                          return_dict=False, **template))
    ids = hf_budgeted(thinker, prompt, budget, total)
    return (tok.decode(ids[:budget], skip_special_tokens=True).strip(),
            tok.decode(ids[budget + 3:], skip_special_tokens=True).lstrip())


def test_the_budget_ends_the_reasoning_and_the_answer_is_apart(served, thinker):
    engine, client = served
    r = client.post("/chat/completions", json=_body(max_reasoning_tokens=8)).json()
    msg = r["choices"][0]["message"]
    reasoning, content = _expected(engine, thinker, 8, 30)
    assert (msg["reasoning_content"], msg["content"]) == (reasoning, content)
    assert content and reasoning
    assert r["usage"]["completion_tokens_details"] == {"reasoning_tokens": 8}
    for text in (msg["reasoning_content"], msg["content"]):
        assert "<think>" not in text and "</think>" not in text


def _stream(client, body):
    with client.stream("POST", "/chat/completions", json=body | {"stream": True,
                       "stream_options": {"include_usage": True}}) as resp:
        return [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]


def test_streamed_reasoning_comes_first_in_its_own_deltas(served, thinker):
    engine, client = served
    chunks = _stream(client, _body(max_reasoning_tokens=8))
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    kinds = [("reasoning_content" in d, bool(d.get("content"))) for d in deltas]
    assert (True, True) not in kinds                        # never both in one delta
    first_content = next(i for i, (_, c) in enumerate(kinds) if c)
    assert all(not r for r, _ in kinds[first_content:])     # no reasoning after the answer began
    streamed = ("".join(d.get("reasoning_content", "") for d in deltas),
                "".join(d.get("content") or "" for d in deltas))
    assert streamed == _expected(engine, thinker, 8, 30)
    assert chunks[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": 8}


def test_reasoning_that_is_never_closed_is_all_reasoning(served):
    _, client = served
    msg = client.post("/chat/completions", json=_body(max_tokens=12)).json()["choices"][0]["message"]
    assert msg["content"] == "" and msg["reasoning_content"]


def test_two_samples_each_answer_after_their_budget(served):
    _, client = served
    r = client.post("/chat/completions", json=_body(n=2, temperature=1.0, seed=5,
                                                      max_reasoning_tokens=4)).json()
    assert r["usage"]["completion_tokens_details"] == {"reasoning_tokens": 8}
    for choice in r["choices"]:
        assert choice["message"]["reasoning_content"] and choice["message"]["content"]


@pytest.mark.parametrize("switch", [{"enable_thinking": False},
                                    {"chat_template_kwargs": {"enable_thinking": False}}])
def test_enable_thinking_false_reaches_the_template(served, thinker, switch):
    engine, client = served
    r = client.post("/chat/completions", json=_body(**switch)).json()
    msg = r["choices"][0]["message"]
    tok = engine.tokenizer
    prompt = list(tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True,
                                          return_dict=False, enable_thinking=False))
    assert r["usage"]["prompt_tokens"] == len(prompt)
    assert msg["reasoning_content"] is None and msg["content"]
    assert r["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}


@pytest.mark.parametrize("field,value", [("max_reasoning_tokens", -1),
                                         ("max_reasoning_tokens", "8"),
                                         ("reasoning_effort", "extreme"),
                                         ("enable_thinking", "no"),
                                         ("chat_template_kwargs", {"enable_thinking": "no"}),
                                         ("chat_template_kwargs", {"messages": []})])
def test_bad_values_are_a_400_naming_the_field(served, field, value):
    _, client = served
    r = client.post("/chat/completions", json=_body(**{field: value}))
    assert r.status_code == 400 and field in r.json()["error"]["param"]


def test_effort_maps_to_budgets_and_the_budget_field_wins(served):
    engine, _ = served
    fmt = reasoning_format(engine.tokenizer)
    for effort, budget in EFFORT_BUDGETS.items():
        body = ChatCompletionRequest(**_body(reasoning_effort=effort))
        assert reasoning_request(body, SamplingParams(), fmt)[0].reasoning_budget == budget
    body = ChatCompletionRequest(**_body(reasoning_effort="high", max_reasoning_tokens=3))
    assert reasoning_request(body, SamplingParams(), fmt)[0].reasoning_budget == 3


def test_a_model_that_marks_no_reasoning(base_url):
    client = httpx.Client(base_url=base_url + "/v1", timeout=60)
    r = client.post("/chat/completions", json=_body(max_reasoning_tokens=8))
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_reasoning_tokens"
    r = client.post("/chat/completions", json=_body(reasoning_effort="low", max_tokens=4)).json()
    msg = r["choices"][0]["message"]
    assert "reasoning_content" not in msg and "completion_tokens_details" not in r["usage"]
