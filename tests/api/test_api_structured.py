"""Structured output and tool calls through the OpenAI API, end to end with the openai client: a
random Llama with SmolLM2's real vocabulary (helpers/grammar_models.py), sampled at temperature
1.0, so only the grammar makes its replies valid. Every reply of a json_schema response_format
validates; calls under tool_choice required or named validate against the tool's schema,
streamed and not; a role "tool" result reaches the prompt through the chat template; bad
requests are 400s naming the parameter, and leave nothing of the engine held."""

from __future__ import annotations

import json
import os

import jsonschema
import openai
import pytest

from helpers.api_server import start_server, stop_server, wait_idle
from helpers.grammar_models import tiny_smol
from localpaged import LLM
from localpaged.engine.async_engine import AsyncEngine

MODEL = "tiny-llama"
QWEN = open(os.path.join(os.path.dirname(__file__), "..", "data", "chat_templates",
                         "qwen2.5.jinja")).read()
# Strings are bounded by a pattern, not maxLength: xgrammar's maxLength strings let raw control
# characters through (test_max_length_strings_refuse_control_characters).
SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "pattern": "^[A-Za-z ]{1,8}$"},
                         "age": {"type": "integer", "minimum": 0, "maximum": 99},
                         "color": {"enum": ["red", "green", "blue"]}},
          "required": ["name", "age", "color"], "additionalProperties": False}
WEATHER_PARAMS = {"type": "object",
                  "properties": {"city": {"type": "string", "pattern": "^[A-Za-z]{1,8}$"},
                                 "unit": {"enum": ["c", "f"]}},
                  "required": ["city", "unit"], "additionalProperties": False}
TIME_PARAMS = {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}},
               "required": ["tz"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                           "parameters": WEATHER_PARAMS}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME_PARAMS}}]
PARAMS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    llm = LLM(tiny_smol(str(tmp_path_factory.mktemp("structured"))), num_kv_blocks=512,
              max_num_seqs=16)
    engine = AsyncEngine(llm.engine)
    url, server = start_server(engine)
    yield engine, url, llm.engine.tokenizer
    stop_server(server)
    engine.shutdown()


@pytest.fixture(params=["generic", "hermes"])
def template(request, served):
    """Each test runs under SmolLM2's own template (no tools: the generic format) and under
    Qwen2.5's (hermes), on the one engine: the API reads the template at each request."""
    _, _, tokenizer = served
    old = tokenizer.chat_template
    if request.param == "hermes":
        tokenizer.chat_template = QWEN
    yield request.param
    tokenizer.chat_template = old


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served[1] + "/v1", api_key="x", max_retries=0, timeout=120)


def check_call(call) -> dict:
    assert call.type == "function" and call.id
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, PARAMS[call.function.name])
    return args


# ---- response_format and the guided extensions --------------------------------------------------
@pytest.mark.parametrize("seed", range(6))
def test_json_schema_replies_validate(client, seed):
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "A person as JSON"}], n=4,
        temperature=1.0, seed=seed, max_tokens=120,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}})
    for choice in r.choices:
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_json_schema_streamed_and_on_completions(client):
    stream = client.chat.completions.create(
        model=MODEL, messages=ASK, temperature=1.0, seed=7, max_tokens=120, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), SCHEMA)
    r = client.completions.create(model=MODEL, prompt="Person:", temperature=1.0, seed=3,
                                  max_tokens=120, extra_body={"guided_json": SCHEMA})
    jsonschema.validate(json.loads(r.choices[0].text), SCHEMA)


@pytest.mark.parametrize("extra, check", [
    ({"response_format": {"type": "json_object"}}, lambda t: isinstance(json.loads(t), dict)),
    ({"guided_regex": "[a-c]{3}-[0-9]{2}"}, lambda t: len(t) == 6 and t[3] == "-"),
    ({"guided_choice": ["yes", "no", "maybe"]}, lambda t: t in ("yes", "no", "maybe")),
    ({"guided_grammar": 'root ::= "(" [0-9] ("+" [0-9])? ")"'},
     lambda t: t.startswith("(") and t.endswith(")")),
    ({"structured_outputs": {"choice": ["left", "right"]}}, lambda t: t in ("left", "right")),
])
def test_guided_extensions(client, extra, check):
    for seed in range(3):
        r = client.chat.completions.create(model=MODEL, messages=ASK, temperature=1.0,
                                           seed=seed, max_tokens=200, extra_body=extra)
        text, reason = r.choices[0].message.content, r.choices[0].finish_reason
        if reason == "length":      # only "any JSON object" is unbounded: cut, it is a prefix
            assert "json_object" in str(extra) and text.startswith("{"), text
        else:
            assert reason == "stop" and check(text), text


# ---- tools --------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(4))
def test_tool_choice_required(client, template, seed):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                       tool_choice="required", temperature=1.0, seed=seed,
                                       max_tokens=300, parallel_tool_calls=False)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert len(choice.message.tool_calls) == 1 and not choice.message.content
    check_call(choice.message.tool_calls[0])


def test_tool_choice_named_with_n(client, template):
    r = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, n=3, temperature=1.0, seed=11, max_tokens=300,
        tool_choice={"type": "function", "function": {"name": "get_time"}})
    for choice in r.choices:
        assert choice.finish_reason == "tool_calls"
        [call] = choice.message.tool_calls
        assert call.function.name == "get_time"
        check_call(call)
    assert len({c.message.tool_calls[0].id for c in r.choices}) == 3


@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                 "function": {"name": "get_weather"}}])
def test_tool_calls_streamed(client, template, choice):
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice=choice, temperature=1.0, seed=5,
        max_tokens=300, stream=True, parallel_tool_calls=False))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    first = calls[0]
    assert first.index == 0 and first.id and first.type == "function"
    assert first.function.name and first.function.arguments == ""
    assert all(tc.id is None and tc.function.name is None for tc in calls[1:])
    args = "".join(tc.function.arguments for tc in calls)
    jsonschema.validate(json.loads(args), PARAMS[first.function.name])
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert not "".join(d.content or "" for d in deltas)


def test_tool_choice_auto(client, template):
    """Free text or calls: whatever comes back is consistent, and every call validates."""
    for seed in range(4):
        r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                           temperature=1.0, seed=seed, max_tokens=40)
        choice = r.choices[0]
        for call in choice.message.tool_calls or []:
            check_call(call)
        if choice.finish_reason == "tool_calls":
            assert choice.message.tool_calls
        elif choice.message.tool_calls:
            assert choice.finish_reason == "length"


def test_tool_choice_none_offers_no_tools(client, served, template):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                       tool_choice="none", max_tokens=5, temperature=0)
    assert r.choices[0].message.tool_calls is None
    assert r.usage.prompt_tokens == client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=5, temperature=0).usage.prompt_tokens


def test_tool_result_goes_back_into_the_prompt(client, served, template):
    """The conversation with the call and its result, rendered by the template, is the prompt
    the engine ran: the result's text is in it."""
    _, _, tokenizer = served
    result = "Sunny and 21 degrees"
    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": result}]
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS,
                                       max_tokens=3, temperature=0)
    with_tools = r.usage.prompt_tokens
    from localpaged.chat.tool_calls import ToolSpec, prompt_messages, tool_format
    msgs, kwargs = prompt_messages(messages, [ToolSpec.from_openai(t) for t in TOOLS],
                                   tool_format(tokenizer.chat_template))
    text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True,
                                         **kwargs)
    assert f"<tool_response>\n{result}\n</tool_response>" in text
    assert '"arguments": {"city": "Paris", "unit": "c"}' in text
    assert with_tools == len(tokenizer.apply_chat_template(
        msgs, tokenize=True, add_generation_prompt=True, return_dict=False, **kwargs))


# ---- errors -------------------------------------------------------------------------------------
BAD = [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0]"),
    ({"tools": [TOOLS[0], {"type": "function", "function": {
        "name": "f", "parameters": {"type": "array"}}}]}, "tools[1]"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}}}, "response_format"),
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"guided_grammar": "root ::= undefined_rule"}, "guided_grammar"),
    ({"guided_json": SCHEMA, "guided_regex": "a+"}, "guided_regex"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}}],
      "tool_choice": "required"}, "tools"),
    ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "response_format"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
      "function": {"name": "f", "arguments": "{not json"}}]}], "tools": TOOLS}, "messages"),
]


@pytest.mark.parametrize("extra, param", BAD)
def test_bad_requests_are_400s_naming_the_parameter(client, served, extra, param):
    body = {"messages": ASK, "max_tokens": 4, **extra}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, **{k: v for k, v in body.items()
                                                       if k in ("messages", "max_tokens")},
                                       extra_body={k: v for k, v in body.items()
                                                   if k not in ("messages", "max_tokens")})
    err = info.value.body
    assert err["param"] == param, err
    assert err["message"]
    wait_idle(served[0])


# ---- the chat backends --------------------------------------------------------------------------
def _final(outputs) -> str:
    *_, last = outputs
    return last.outputs[0].text


@pytest.mark.parametrize("remote", [False, True], ids=["local", "remote"])
def test_chat_backend_tools(served, template, remote):
    """ChatBackend.chat with tools and parse_reply, local (grammar and template family here)
    and remote (the server's tool_calls, written into the reply's text)."""
    from localpaged.chat.backend import LocalChatBackend
    from localpaged.chat.remote import RemoteChatBackend
    from localpaged.chat.tool_calls import ToolSpec
    from localpaged.core.sampling_params import SamplingParams
    engine, url, tokenizer = served
    backend = RemoteChatBackend(url + "/v1", model=MODEL) if remote else LocalChatBackend(engine)
    specs = [ToolSpec.from_openai(t) for t in TOOLS]
    for seed, choice in [(1, "required"), (2, "get_time")]:
        text = _final(backend.chat(ASK, [SamplingParams(temperature=1.0, seed=seed,
                                                        max_tokens=300)],
                                   tools=specs, tool_choice=choice))
        reply = backend.parse_reply(text)
        assert reply.tool_calls, text
        for call in reply.tool_calls:
            jsonschema.validate(json.loads(call.arguments), PARAMS[call.name])
        if choice == "get_time":
            assert [c.name for c in reply.tool_calls] == ["get_time"]
    plain = _final(backend.chat(ASK, [SamplingParams(temperature=0, max_tokens=4)]))
    assert backend.parse_reply(plain).tool_calls == []


def test_local_backend_renders_tool_results(served, template):
    from localpaged.chat.backend import LocalChatBackend
    backend = LocalChatBackend(served[0])
    messages = ASK + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_9", "type": "function",
             "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'}}]},
        {"role": "tool", "tool_call_id": "call_9", "content": "12:00 UTC"}]
    text = served[2].decode(backend.prompt_ids(messages))
    assert "<tool_response>\n12:00 UTC\n</tool_response>" in text
    assert '{"name": "get_time", "arguments": {"tz": "UTC"}}' in text
