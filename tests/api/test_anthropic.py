"""Tests of the Anthropic Messages API (localpaged/api/anthropic) over a real uvicorn server in a
background thread, driven by the official `anthropic` client and raw httpx.

The model is conftest's tiny random Llama with a toy chat template (helpers/api_server.py), so
replies are random-looking text; what is checked is the protocol around them, each against the
engine or the template run directly: the same prompt tokens, the same greedy text, the same
token counts. After every test the engine must hold no KV block.
"""

from __future__ import annotations

import http.client
import json

import anthropic
import httpx
import jsonschema
import pytest
from helpers.api_server import (API_KEY, MODEL, gate, start_server, steps_of, stop_server,
                                wait_idle, words)
from helpers.step_gate import poll

from localpaged import LLM, SamplingParams
from localpaged.api.anthropic.events import Reply
from localpaged.engine.async_engine import AsyncEngine
from localpaged.engine.llm import apply_chat_template
from localpaged.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput

USER = words(1)
SYSTEM = words(2, 4)
GREEDY = {"temperature": 0}     # the newer clients send sampling fields only this way


@pytest.fixture(autouse=True)
def _no_blocks_leak(engine):
    yield
    wait_idle(engine)


@pytest.fixture(scope="module")
def client(base_url):
    return anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0, timeout=60)


def greedy(client, messages, max_tokens=8, **kw):
    return client.messages.create(model=MODEL, messages=messages, max_tokens=max_tokens,
                                  extra_body=GREEDY, **kw)


def engine_reply(engine, messages, max_tokens, **kw):
    """The prompt ids the chat template makes of `messages` and the engine's greedy output."""
    ids = apply_chat_template(engine.tokenizer, messages)
    out = list(engine.submit(ids, SamplingParams(max_tokens=max_tokens, temperature=0, **kw)))
    return ids, out[-1].outputs[0]


def post(base_url, body, headers=None, path="/v1/messages"):
    return httpx.post(base_url + path, json=body, headers=headers or {}, timeout=60)


# ---- whole replies ------------------------------------------------------------------------------
def test_message_matches_the_engine(client, engine):
    r = greedy(client, [{"role": "user", "content": USER}], max_tokens=8)
    ids, direct = engine_reply(engine, [{"role": "user", "content": USER}], 8)
    assert r.type == "message" and r.role == "assistant" and r.model == MODEL
    assert r.id.startswith("msg_")
    assert [b.type for b in r.content] == ["text"]
    assert r.content[0].text == direct.text
    assert r.stop_reason == "max_tokens" and r.stop_sequence is None
    assert r.usage.input_tokens == len(ids)
    assert r.usage.output_tokens == 8 == len(direct.token_ids)


def test_system_prompt_string_and_blocks(client, engine):
    msgs = [{"role": "user", "content": [{"type": "text", "text": USER[:5]},
                                         {"type": "text", "text": USER[5:]}]}]
    r = greedy(client, msgs, system=SYSTEM, max_tokens=6)
    ids, direct = engine_reply(engine, [{"role": "system", "content": SYSTEM},
                                        {"role": "user", "content": USER}], 6)
    assert r.usage.input_tokens == len(ids)
    assert r.content[0].text == direct.text
    blocks = greedy(client, msgs, system=[{"type": "text", "text": SYSTEM}], max_tokens=6)
    assert blocks.content[0].text == direct.text
    without = greedy(client, msgs, max_tokens=6)
    assert without.usage.input_tokens < r.usage.input_tokens


def test_stop_sequence(client, engine):
    msgs = [{"role": "user", "content": USER}]
    _, direct = engine_reply(engine, msgs, 12)
    stop = direct.text[4:6]             # the greedy reply reaches it
    r = greedy(client, msgs, max_tokens=12, stop_sequences=[stop])
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop
    text = r.content[0].text if r.content else ""
    assert text == direct.text[:direct.text.index(stop)]
    assert stop not in text
    assert r.usage.output_tokens < 12


def test_stop_reasons_of_each_end():
    """How the engine's ends map onto stop_reason (Reply alone: the tiny model rarely ends)."""
    def ended(finish_reason, stop_reason=None, stop_sequences=None):
        out = RequestOutput("r", None, [1, 2], [CompletionOutput(
            0, "ab", [5, 6], finish_reason, stop_reason)], True,
            RequestMetrics(0.0, None, None, 0, 2), delta=True)
        reply = Reply("msg_1", MODEL, 2, stop_sequences)
        reply.start()
        reply.feed(out)
        delta = reply.finish()[-2]
        assert delta["type"] == "message_delta" and delta["usage"]["output_tokens"] == 2
        assert (delta["delta"]["stop_reason"], delta["delta"]["stop_sequence"]) == \
            (reply.message()["stop_reason"], reply.message()["stop_sequence"])
        return reply.message()["stop_reason"], reply.message()["stop_sequence"]

    assert ended("stop", 2) == ("end_turn", None)                  # the EOS token
    assert ended("stop", None) == ("end_turn", None)
    assert ended("length") == ("max_tokens", None)
    assert ended("stop", "xy", ["xy"]) == ("stop_sequence", "xy")


def test_assistant_prefill_continues(client, engine):
    prefix = words(3, 3)
    msgs = [{"role": "user", "content": USER}, {"role": "assistant", "content": prefix}]
    r = greedy(client, msgs, max_tokens=5)
    ids = engine.tokenizer.apply_chat_template(msgs, add_generation_prompt=False, tokenize=True,
                                               continue_final_message=True, return_dict=False)
    out = list(engine.submit(ids, SamplingParams(max_tokens=5, temperature=0)))[-1].outputs[0]
    assert r.usage.input_tokens == len(ids)
    assert r.content[0].text == out.text


def test_count_tokens(client, engine):
    msgs = [{"role": "user", "content": USER}]
    n = client.messages.count_tokens(model=MODEL, messages=msgs, system=SYSTEM)
    ids = apply_chat_template(engine.tokenizer, [{"role": "system", "content": SYSTEM}, *msgs])
    assert n.input_tokens == len(ids)


# ---- streaming ----------------------------------------------------------------------------------
def test_stream_matches_the_whole_reply(client):
    msgs = [{"role": "user", "content": USER}]
    whole = greedy(client, msgs, max_tokens=10)
    with client.messages.stream(model=MODEL, messages=msgs, max_tokens=10,
                                extra_body=GREEDY) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == whole.content[0].text == final.content[0].text
    assert len(pieces) > 1
    assert final.stop_reason == "max_tokens"
    assert final.usage.input_tokens == whole.usage.input_tokens
    assert final.usage.output_tokens == 10


def test_stream_events_in_order(base_url):
    body = {"model": MODEL, "max_tokens": 5, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": USER}]}
    with httpx.stream("POST", base_url + "/v1/messages", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = []
    for chunk in raw.strip().split("\n\n"):
        name_line, data_line = chunk.split("\n")
        name, data = name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name
        events.append(data)
    names = [e["type"] for e in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    start = events[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["output_tokens"] == 0 and start["usage"]["input_tokens"] > 0
    assert events[2]["content_block"] == {"type": "text", "text": ""}
    assert all(e["delta"]["type"] == "text_delta" for e in events[3:-3])
    assert events[-2]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert events[-2]["usage"]["output_tokens"] == 5


def test_stream_stop_sequence(client, engine):
    msgs = [{"role": "user", "content": USER}]
    _, direct = engine_reply(engine, msgs, 12)
    stop = direct.text[4:6]
    with client.messages.stream(model=MODEL, messages=msgs, max_tokens=12,
                                stop_sequences=[stop], extra_body=GREEDY) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == stop
    assert final.content[0].text == direct.text[:direct.text.index(stop)]


def _record_aborts(engine, monkeypatch) -> list[str]:
    aborted: list[str] = []
    real = engine.abort
    monkeypatch.setattr(engine, "abort", lambda rid: (aborted.append(rid), real(rid)))
    return aborted


HELD_STEP = 6         # the request's step the engine holds (the first deltas are out by then)


def test_stream_closed_early_aborts(base_url, engine, monkeypatch):
    """The client closes the stream after its first text while the engine holds the request's
    sixth step until the abort has arrived: the request runs no further step."""
    aborted = _record_aborts(engine, monkeypatch)
    body = {"model": MODEL, "max_tokens": 900, "stream": True, "temperature": 0,
            "messages": [{"role": "user", "content": USER}]}
    with gate(engine, HELD_STEP) as held:
        with httpx.stream("POST", base_url + "/v1/messages", json=body, timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and '"message_start"' in line:
                    message_id = json.loads(line[6:])["message"]["id"]
                if "content_block_delta" in line:
                    held.wait_held()
                    break
        poll(lambda: message_id in aborted, "the abort of the closed stream")
    wait_idle(engine, timeout=10)
    assert steps_of(engine, message_id) == HELD_STEP


def test_client_gone_before_the_answer_aborts(base_url, engine, monkeypatch):
    aborted = _record_aborts(engine, monkeypatch)
    host, port = base_url.removeprefix("http://").split(":")
    body = {"model": MODEL, "max_tokens": 900, "messages": [{"role": "user", "content": USER}]}
    with gate(engine) as held:
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request("POST", "/v1/messages", json.dumps(body),
                     {"Content-Type": "application/json"})
        held.wait_held()
        conn.close()
        message_id = poll(lambda: next((a for a in aborted if a.startswith("msg_")), None),
                          "the abort of the request whose client left")
    wait_idle(engine, timeout=10)
    assert steps_of(engine, message_id) == 1


# ---- errors -------------------------------------------------------------------------------------
def _error(r, status: int, kind: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == kind
    return body["error"]["message"]


def test_missing_max_tokens(base_url):
    r = post(base_url, {"model": MODEL, "messages": [{"role": "user", "content": USER}]})
    assert "max_tokens" in _error(r, 400, "invalid_request_error")


def test_bad_role(base_url, client):
    r = post(base_url, {"model": MODEL, "max_tokens": 4,
                        "messages": [{"role": "system", "content": USER}]})
    assert "messages[0].role" in _error(r, 400, "invalid_request_error")
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=MODEL, max_tokens=4,
                               messages=[{"role": "tool", "content": USER}])


def test_image_block_for_a_text_only_model_refused_by_name(base_url):
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgo="}}
    r = post(base_url, {"model": MODEL, "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "text", "text": USER}, image]}]})
    message = _error(r, 400, "invalid_request_error")
    assert "image block" in message and "takes no images" in message
    assert "messages[0].content[1]" in message


def test_malformed_block_named(base_url):
    r = post(base_url, {"model": MODEL, "max_tokens": 4, "messages": [
        {"role": "user", "content": USER},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "f"}]}]})
    assert "'messages[1].content[0].input'" in _error(r, 400, "invalid_request_error")


def test_unknown_model(base_url):
    r = post(base_url, {"model": "claude-x", "max_tokens": 4,
                        "messages": [{"role": "user", "content": USER}]})
    assert MODEL in _error(r, 404, "not_found_error")


def test_values_out_of_range(base_url):
    for field, value in [("temperature", 1.5), ("max_tokens", 0), ("top_p", 0.0),
                         ("stop_sequences", [""])]:
        body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": USER}],
                field: value}
        assert field in _error(post(base_url, body), 400, "invalid_request_error")


def test_too_long_for_the_context(base_url, engine):
    limit = engine.info.max_model_len
    r = post(base_url, {"model": MODEL, "max_tokens": limit,
                        "messages": [{"role": "user", "content": USER}]})
    assert str(limit) in _error(r, 400, "invalid_request_error")


def test_tool_result_without_its_call(base_url):
    r = post(base_url, {"model": MODEL, "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": "42"}]}]})
    assert "toolu_1" in _error(r, 400, "invalid_request_error")


# ---- the API key --------------------------------------------------------------------------------
def test_api_key(engine):
    keyed_url, server = start_server(engine, api_key=API_KEY)
    try:
        _check_keys(keyed_url)
    finally:
        stop_server(server)


def _check_keys(keyed_url):
    msgs = [{"role": "user", "content": USER}]
    ok = anthropic.Anthropic(base_url=keyed_url, api_key=API_KEY, max_retries=0)
    assert ok.messages.create(model=MODEL, messages=msgs, max_tokens=2).usage.output_tokens == 2
    bearer = anthropic.Anthropic(base_url=keyed_url, auth_token=API_KEY, max_retries=0)
    assert bearer.messages.count_tokens(model=MODEL, messages=msgs).input_tokens > 0
    wrong = anthropic.Anthropic(base_url=keyed_url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        wrong.messages.create(model=MODEL, messages=msgs, max_tokens=2)
    body = {"model": MODEL, "max_tokens": 2, "messages": msgs}
    _error(post(keyed_url, body), 401, "authentication_error")
    _error(post(keyed_url, body, {"x-api-key": "nope"}), 401, "authentication_error")
    _error(post(keyed_url, body, {"authorization": "Bearer nope"}), 401, "authentication_error")


# ---- tools --------------------------------------------------------------------------------------
# A random model with SmolLM2's vocabulary and chat template (helpers/grammar_models.py), which
# can write JSON; its template knows no tools, so the tools are described in the system prompt
# and calls are written as <tool_call> blocks (chat/tool_calls.py's generic format).
WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "pattern": "^[A-Za-z ]{1,12}$"},
                          "unit": {"enum": ["c", "f"]},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "pattern": "^[A-Z]{3}$"}},
        "required": ["zone"], "additionalProperties": False}
TOOLS = [{"name": "get_weather", "description": "The weather in a city", "input_schema": WEATHER},
         {"name": "get_time", "description": "The time in a zone", "input_schema": TIME}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def tool_engine(tmp_path_factory):
    from helpers.grammar_models import tiny_smol
    llm = LLM(tiny_smol(str(tmp_path_factory.mktemp("smol"))), num_kv_blocks=256,
              max_num_seqs=8)
    eng = AsyncEngine(llm.engine)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def tools_client(tool_engine):
    url, server = start_server(tool_engine)
    yield anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=120)
    stop_server(server)


@pytest.fixture
def submitted(tool_engine, monkeypatch) -> list[list[int]]:
    """The prompt ids the server gives the engine from now on."""
    prompts: list[list[int]] = []
    real = tool_engine.submit

    def submit(prompt, *args, **kwargs):
        prompts.append(list(prompt))
        return real(prompt, *args, **kwargs)
    monkeypatch.setattr(tool_engine, "submit", submit)
    yield prompts
    wait_idle(tool_engine)


def _tool_uses(message) -> list:
    calls = [b for b in message.content if b.type == "tool_use"]
    for call in calls:
        assert call.id.startswith("toolu_")
        jsonschema.validate(call.input, SCHEMAS[call.name])
    return calls


def test_tool_choice_any_calls_a_tool(tools_client, submitted, tool_engine):
    for _ in range(4):
        r = tools_client.messages.create(
            model=MODEL, max_tokens=120, messages=ASK, tools=TOOLS,
            tool_choice={"type": "any", "disable_parallel_tool_use": True})
        (call,) = _tool_uses(r)
        assert r.stop_reason == "tool_use" and r.content[-1] is call
        assert call.name in SCHEMAS
    # the tools were described to the model
    prompt = tool_engine.tokenizer.decode(submitted[0])
    assert "get_weather" in prompt and "The time in a zone" in prompt


def test_tool_choice_tool_streamed(tools_client, submitted):
    for _ in range(3):
        with tools_client.messages.stream(model=MODEL, max_tokens=120, messages=ASK, tools=TOOLS,
                                          tool_choice={"type": "tool", "name": "get_time"}) \
                as stream:
            events = list(stream)
            final = stream.get_final_message()
        (call,) = _tool_uses(final)
        assert call.name == "get_time" and final.stop_reason == "tool_use"
        partial = "".join(e.delta.partial_json for e in events
                          if e.type == "content_block_delta" and e.delta.type == "input_json_delta")
        assert json.loads(partial) == call.input
        starts = [e.content_block for e in events if e.type == "content_block_start"]
        assert starts[-1].type == "tool_use" and starts[-1].input == {}
        assert starts[-1].id == call.id


def test_tool_result_round_trip(tools_client, submitted, tool_engine):
    """A call and its result go back into the prompt, through the model's template."""
    call = {"type": "tool_use", "id": "toolu_abc", "name": "get_weather",
            "input": {"city": "Paris", "unit": "c"}}
    msgs = ASK + [{"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                                    call]},
                  {"role": "user", "content": [
                      {"type": "tool_result", "tool_use_id": "toolu_abc",
                       "content": [{"type": "text", "text": "Sunny and 21 degrees"}]},
                      {"type": "text", "text": "And tomorrow?"}]}]
    r = tools_client.messages.create(model=MODEL, max_tokens=4, messages=msgs, tools=TOOLS,
                                     extra_body=GREEDY)
    prompt = tool_engine.tokenizer.decode(submitted[-1])
    assert r.usage.input_tokens == len(submitted[-1])
    said, called, result, then = (prompt.index(s) for s in (
        "Let me look.", '"city": "Paris"', "Sunny and 21 degrees", "And tomorrow?"))
    assert said < called < result < then
    # an error result is marked as one
    msgs[2]["content"][0]["is_error"] = True
    tools_client.messages.create(model=MODEL, max_tokens=2, messages=msgs, tools=TOOLS)
    assert "Error: Sunny and 21 degrees" in tool_engine.tokenizer.decode(submitted[-1])


def test_tool_choice_none_offers_no_tools(tools_client, submitted, tool_engine):
    auto = tools_client.messages.count_tokens(model=MODEL, messages=ASK, tools=TOOLS)
    r = tools_client.messages.create(model=MODEL, max_tokens=6, messages=ASK, tools=TOOLS,
                                     tool_choice={"type": "none"})
    assert all(b.type == "text" for b in r.content)
    assert "get_weather" not in tool_engine.tokenizer.decode(submitted[-1])
    assert r.usage.input_tokens < auto.input_tokens


def test_tool_errors(tools_client, base_url):
    def refused(match: str, **kw):
        with pytest.raises(anthropic.BadRequestError) as err:
            tools_client.messages.create(model=MODEL, max_tokens=4, messages=ASK, **kw)
        assert err.value.body["type"] == "error"
        assert err.value.body["error"]["type"] == "invalid_request_error"
        assert match in err.value.body["error"]["message"]

    refused("get_date", tools=TOOLS, tool_choice={"type": "tool", "name": "get_date"})
    refused("needs tools", tool_choice={"type": "any"})
    refused("web_search", tools=[{"type": "web_search_20250305", "name": "web_search"}])
    refused("object", tools=[{"name": "f", "input_schema": {"type": "string"}}])
    refused("tools[0].name", tools=[{"name": "bad name!", "input_schema": WEATHER}])


def test_greedy_tool_call_streamed_as_whole(tools_client):
    """Greedy, the streamed reply (the stream parser's events) carries the same blocks as the
    whole reply (the reply parsed once), tool calls included."""
    kw = dict(model=MODEL, max_tokens=120, messages=ASK, tools=TOOLS, extra_body=GREEDY,
              tool_choice={"type": "any"})
    whole = tools_client.messages.create(**kw)
    with tools_client.messages.stream(**kw) as stream:
        final = stream.get_final_message()

    def shape(m):
        return [(b.type, b.text) if b.type == "text" else (b.type, b.name, b.input)
                for b in m.content], m.stop_reason, m.usage.output_tokens
    assert _tool_uses(whole)
    assert shape(final) == shape(whole)


def test_schema_the_grammar_cannot_compile(tools_client, tool_engine):
    bad = {"name": "f", "input_schema": {"type": "object",
                                         "properties": {"a": {"$ref": "#/nowhere"}}}}
    with pytest.raises(anthropic.BadRequestError) as err:
        tools_client.messages.create(model=MODEL, max_tokens=4, messages=ASK, tools=[bad],
                                     tool_choice={"type": "any"})
    assert err.value.body["error"]["type"] == "invalid_request_error"
    assert "input_schema" in err.value.body["error"]["message"]
    assert "nowhere" in err.value.body["error"]["message"]
    wait_idle(tool_engine)
