"""The tool-call module (localpaged/chat/tool_calls.py): tool specs, the family a template
declares, parsing recorded replies of each family whole and streamed in random chunkings, the
grammars of auto / required / named calls compiled and run by xgrammar's own matcher, and the
prompts of conversations with calls and results rendered through real models' templates."""

from __future__ import annotations

import copy
import json
import os

import pytest
import xgrammar as xgr
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from helpers.grammar_models import smol_tokenizer
from localpaged.chat.tool_calls import (
    ArgsDelta,
    CallStart,
    TextDelta,
    ToolFormat,
    ToolSpec,
    normalize_choice,
    prompt_messages,
    tool_format,
)

TEMPLATES = os.path.join(os.path.dirname(__file__), "..", "data", "chat_templates")
QWEN = open(os.path.join(TEMPLATES, "qwen2.5.jinja")).read()
LLAMA = open(os.path.join(TEMPLATES, "llama3.2.jinja")).read()
# Mistral's tool-calling template, reduced to its tool parts (ids of 9 letters and digits).
MISTRAL = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m.role == 'user' %}{% if loop.last and tools %}[AVAILABLE_TOOLS] {{ tools | tojson }}"
    "[/AVAILABLE_TOOLS]{% endif %}[INST] {{ m.content }}[/INST]"
    "{% elif m.role == 'assistant' and m.tool_calls %}[TOOL_CALLS] ["
    "{% for c in m.tool_calls %}{% if c.id is not string or c.id | length != 9 %}"
    "{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}"
    "{% endif %}{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}, \"id\": \"{{ c.id }}\"}"
    "{% if not loop.last %}, {% endif %}{% endfor %}]{{ eos_token }}"
    "{% elif m.role == 'assistant' %} {{ m.content }}{{ eos_token }}"
    "{% elif m.role == 'tool' %}[TOOL_RESULTS] {\"content\": {{ m.content | tojson }}, "
    "\"call_id\": \"{{ m.tool_call_id }}\"}[/TOOL_RESULTS]{% endif %}{% endfor %}")
# Mistral's newer templates (tokenizers v11 and later), reduced to their tool parts.
MISTRAL_V11 = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m.role == 'user' %}{% if loop.last and tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}"
    "[/AVAILABLE_TOOLS]{% endif %}[INST]{{ m.content }}[/INST]"
    "{% elif m.role == 'assistant' and m.tool_calls %}{% for c in m.tool_calls %}"
    "{% if c.id is not string or c.id | length != 9 %}"
    "{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}"
    "{% endif %}[TOOL_CALLS]{{ c.function.name }}[ARGS]{% if c.function.arguments is string %}"
    "{{ c.function.arguments }}{% else %}{{ c.function.arguments | tojson }}{% endif %}{% endfor %}"
    "{{ eos_token }}"
    "{% elif m.role == 'assistant' %}{{ m.content }}{{ eos_token }}"
    "{% elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]{% endif %}"
    "{% endfor %}")
TOY = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
       "{% if add_generation_prompt %}assistant:{% endif %}")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}
TOOLS = [ToolSpec.from_openai(WEATHER), ToolSpec.from_openai(TIME)]

# Replies as models of each family write them: (text, content, [(name, arguments)]).
RECORDED = {
    "hermes": [
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n'
         '</tool_call>', "", [("get_weather", {"city": "Paris", "unit": "c"})]),
        ('Let me check both.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
         '"Oslo", "unit": "f"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": '
         '{"tz": "CET"}}\n</tool_call>\nOne moment.', "Let me check both.\nOne moment.",
         [("get_weather", {"city": "Oslo", "unit": "f"}), ("get_time", {"tz": "CET"})]),
        ('<tool_call>\n{"arguments": {"tz": "a}\\"b"}, "name": "get_time"}\n</tool_call>', "",
         [("get_time", {"tz": 'a}"b'})]),
        ("It is sunny in Paris, 21°C.", "It is sunny in Paris, 21°C.", []),
        ('Broken: <tool_call>\n{"name": get_weather}\n</tool_call> end',
         'Broken: <tool_call>\n{"name": get_weather}\n</tool_call> end', []),
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": }}\n</tool_call>',
         '<tool_call>\n{"name": "get_weather", "arguments": {"city": }}\n</tool_call>', []),
        ("Use <tool_call> tags, like <tool_call>", "Use <tool_call> tags, like <tool_call>", []),
    ],
    "llama3": [
        ('{"name": "get_weather", "parameters": {"city": "Rome", "unit": "c"}}', "",
         [("get_weather", {"city": "Rome", "unit": "c"})]),
        ('<|python_tag|>{"name": "get_time", "parameters": {"tz": "UTC"}}', "",
         [("get_time", {"tz": "UTC"})]),
        ('{"name": "get_time", "parameters": {"tz": "UTC"}}; {"name": "get_weather", '
         '"parameters": {"city": "Bern", "unit": "c"}}', "",
         [("get_time", {"tz": "UTC"}), ("get_weather", {"city": "Bern", "unit": "c"})]),
        ('The JSON {"a": 1} is not a call.', 'The JSON {"a": 1} is not a call.', []),
        ('{"name": "x"} has no arguments', "has no arguments", [("x", {})]),
    ],
    "mistral": [
        ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Nice", "unit": "c"}}, '
         '{"name": "get_time", "arguments": {"tz": "CET"}}]', "",
         [("get_weather", {"city": "Nice", "unit": "c"}), ("get_time", {"tz": "CET"})]),
        # the special [TOOL_CALLS] token is dropped when the reply is detokenized
        (' [{"name": "get_time", "arguments": {"tz": "CET"}}]', "", [("get_time", {"tz": "CET"})]),
        ("[TOOL_CALLS] not json", "[TOOL_CALLS] not json", []),
    ],
}
RECORDED["mistral_v11"] = [
    ('[TOOL_CALLS]get_weather[ARGS]{"city": "Nice", "unit": "c"}[TOOL_CALLS]get_time[ARGS]'
     '{"tz": "CET"}', "", [("get_weather", {"city": "Nice", "unit": "c"}), ("get_time", {"tz": "CET"})]),
    ('Let me look.\n[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS] {"tz": "UTC"}', "Let me look.",
     [("get_time", {"tz": "UTC"})]),
    ("[TOOL_CALLS] not a call", "[TOOL_CALLS] not a call", []),
    ("[TOOL_CALLS]get_time[ARGS]no json here", "[TOOL_CALLS]get_time[ARGS]no json here", []),
    ("Tags like [TOOL_CALLS] and [ARGS] are markers.", "Tags like [TOOL_CALLS] and [ARGS] are markers.", []),
]
RECORDED["generic"] = RECORDED["hermes"]
CASES = [(fam, *case) for fam, cases in RECORDED.items() for case in cases]


# ---- specs and choices --------------------------------------------------------------------------
def test_tool_spec_from_openai():
    spec = ToolSpec.from_openai(WEATHER)
    assert spec.name == "get_weather" and spec.parameters["required"] == ["city", "unit"]
    assert spec.openai() == {**WEATHER, "function": {**WEATHER["function"]}}
    bare = ToolSpec.from_openai({"type": "function", "function": {"name": "ping"}})
    assert bare.parameters == {"type": "object", "properties": {}} and bare.description == ""


@pytest.mark.parametrize("tool, words", [
    ({"type": "function", "function": {"name": "bad name!"}}, "'bad name!'"),
    ({"type": "function", "function": {"name": "x" * 65}}, "64"),
    ({"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}},
     "tool 'f'"),
    ({"type": "function", "function": {"name": "f", "parameters": [1]}}, "tool 'f'"),
    ({"type": "retrieval", "function": {"name": "f"}}, "tool 'f'"),
    ({"type": "function"}, "name"),
    ("get_weather", "object"),
])
def test_tool_spec_refuses_bad_tools(tool, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        ToolSpec.from_openai(tool)


def test_normalize_choice():
    assert normalize_choice(None, TOOLS).mode == "auto"
    assert normalize_choice(None, []).mode == "none"
    assert normalize_choice({"type": "function", "function": {"name": "get_time"}},
                            TOOLS).name == "get_time"
    with pytest.raises(ValueError, match="'nope'"):
        normalize_choice({"type": "function", "function": {"name": "nope"}}, TOOLS)
    with pytest.raises(ValueError, match="needs tools"):
        normalize_choice("required", [])


def test_family_from_template():
    assert tool_format(QWEN).family == "hermes"
    assert tool_format(LLAMA).family == "llama3"
    assert tool_format(MISTRAL).family == "mistral"
    assert tool_format(MISTRAL_V11).family == "mistral_v11"
    assert tool_format(TOY).family == "generic"
    assert tool_format(None).family == "generic"
    assert not tool_format(TOY).template_has_tools and tool_format(QWEN).template_has_tools


# ---- parsing ------------------------------------------------------------------------------------
def _calls(reply) -> list:
    return [(c.name, json.loads(c.arguments)) for c in reply.tool_calls]


@pytest.mark.parametrize("family, text, content, calls", CASES)
def test_parse_recorded(family, text, content, calls):
    reply = ToolFormat(family).parse(text)
    assert reply.content == content
    assert _calls(reply) == calls
    ids = [c.id for c in reply.tool_calls]
    assert len(set(ids)) == len(ids)
    if family.startswith("mistral"):
        assert all(len(i) == 9 and i.isalnum() for i in ids)


def _stream(fmt: ToolFormat, pieces: list[str]):
    parser, deltas = fmt.stream_parser(), []
    for p in pieces:
        deltas += parser.feed(p)
    return deltas + parser.finish()


def _chunks(text: str, cuts: list[int]) -> list[str]:
    cuts = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in zip(cuts, cuts[1:])]


@settings(max_examples=300, deadline=None)
@given(case=st.sampled_from([c for c in CASES if c[3] or "<tool_call>" not in c[1]]),
       cuts=st.lists(st.integers(0, 10_000), max_size=30))
def test_stream_equals_parse_in_any_chunking(case, cuts):
    """Text deltas join to the content, each call starts once with its name, and its argument
    fragments join to its arguments, however the reply is cut."""
    family, text, content, calls = case
    deltas = _stream(ToolFormat(family), _chunks(text, cuts))
    assert "".join(d.text for d in deltas if isinstance(d, TextDelta)) == content
    starts = [d for d in deltas if isinstance(d, CallStart)]
    assert [d.index for d in starts] == list(range(len(calls)))
    got = []
    for s in starts:
        args = "".join(d.text for d in deltas if isinstance(d, ArgsDelta) and d.index == s.index)
        got.append((s.name, json.loads(args)))
        first_args = next(i for i, d in enumerate(deltas)
                          if isinstance(d, ArgsDelta) and d.index == s.index)
        assert deltas.index(s) < first_args
    assert got == calls


def test_stream_holds_back_only_a_possible_marker():
    p = ToolFormat("hermes").stream_parser()
    assert p.feed("Hello <too") == [TextDelta("Hello")]
    assert p.feed("l") == []
    assert p.feed("s are handy") == [TextDelta(" <tools are handy")]
    assert p.feed("\n<tool_call>\n") == []
    out = p.feed('{"name": "get_time", "arguments": {"tz"')
    assert out[0].name == "get_time" and out[1:] == [ArgsDelta(0, '{"tz"')]
    assert p.feed(': "UTC"}}\n</tool_call>') == [ArgsDelta(0, ': "UTC"}')]
    assert p.finish() == []
    q = ToolFormat("llama3").stream_parser()
    assert q.feed("Sure {") == [TextDelta("Sure")]
    assert q.feed("x}") == [TextDelta(" {x}")]


def test_named_calls_stream_their_arguments_as_they_come():
    """Mistral's newer syntax: the call starts at its arguments' first brace, whatever the
    chunks; arguments that are not JSON after a started call stay a call when streamed and
    become text when parsed whole (as a cut-off call of any family)."""
    p = ToolFormat("mistral_v11").stream_parser()
    assert p.feed("Sure.[TOOL_") == [TextDelta("Sure.")]
    assert p.feed("CALLS]get_ti") == []
    assert p.feed("me[AR") == []
    assert p.feed('GS]{"tz"') == [CallStart(0, p._ids[0], "get_time"), ArgsDelta(0, '{"tz"')]
    assert p.feed(': "UTC"}') == [ArgsDelta(0, ': "UTC"}')]
    assert p.finish() == []
    text = '[TOOL_CALLS]get_time[ARGS]{"tz": }'
    assert isinstance(_stream(ToolFormat("mistral_v11"), [text])[0], CallStart)
    reply = ToolFormat("mistral_v11").parse(text)
    assert reply.tool_calls == [] and reply.content == text


def test_cut_off_call():
    """A call cut by max_tokens: streamed, its start already went out; parsed, it is text."""
    text = '<tool_call>\n{"name": "get_time", "arguments": {"tz": "U'
    deltas = _stream(ToolFormat("hermes"), [text])
    assert isinstance(deltas[0], CallStart)
    assert ToolFormat("hermes").parse(text).tool_calls == []


# ---- grammars -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def compiler():
    tok = smol_tokenizer()
    info = xgr.TokenizerInfo.from_huggingface(tok, stop_token_ids=[tok.eos_token_id])
    return tok, xgr.GrammarCompiler(info)


def _accepts(compiler, spec, text: str, end: bool = True) -> bool:
    tok, c = compiler
    m = xgr.GrammarMatcher(c.compile_structural_tag(spec.value))
    ok = all(m.accept_token(t) for t in tok.encode(text, add_special_tokens=False))
    return ok and (not end or m.accept_token(tok.eos_token_id))


@pytest.mark.parametrize("family", ["hermes", "llama3", "mistral", "mistral_v11", "generic"])
def test_grammars_of_each_choice(compiler, family):
    fmt = ToolFormat(family)
    good = fmt.call_text("get_weather", '{"city": "Paris", "unit": "c"}')
    bad_args = fmt.call_text("get_weather", '{"city": "Paris", "unit": "k"}')
    other = fmt.call_text("get_time", '{"tz": "UTC"}')
    assert fmt.guided(TOOLS, "none") is None and fmt.guided(None, "auto") is None
    auto = fmt.guided(TOOLS, "auto")
    assert _accepts(compiler, auto, "Just text.")
    assert _accepts(compiler, auto, "Calling. " + good)
    assert not _accepts(compiler, auto, "Calling. " + bad_args, end=False)
    required = fmt.guided(TOOLS, "required")
    assert _accepts(compiler, required, good) and _accepts(compiler, required, other)
    assert not _accepts(compiler, required, "Just text.")
    named = fmt.guided(TOOLS, {"type": "function", "function": {"name": "get_time"}})
    assert _accepts(compiler, named, other)
    assert not _accepts(compiler, named, good, end=False)
    single = fmt.guided(TOOLS, "required", parallel_tool_calls=False)
    assert _accepts(compiler, single, good)
    assert not _accepts(compiler, single, good + other, end=False)
    # what the grammar lets through is what the parser finds
    assert _calls(fmt.parse(good)) == [("get_weather", {"city": "Paris", "unit": "c"})]


# ---- prompts ------------------------------------------------------------------------------------
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_abc123def456", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}}]},
    {"role": "tool", "tool_call_id": "call_abc123def456", "content": '{"temp": 21}'},
]


@pytest.fixture(scope="module")
def tokenizer(tiny_llama):
    return AutoTokenizer.from_pretrained(tiny_llama)


def render(tokenizer, template: str, tools=TOOLS, messages=CONVERSATION) -> str:
    msgs, kwargs = prompt_messages(messages, tools, tool_format(template))
    return tokenizer.apply_chat_template(msgs, chat_template=template, tokenize=False,
                                         add_generation_prompt=True, **kwargs)


def test_prompt_qwen(tokenizer):
    text = render(tokenizer, QWEN)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert json.dumps(WEATHER["function"]["parameters"]) in text
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris", "unit": "c"}}\n</tool_call><|im_end|>') in text
    assert '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response><|im_end|>' in text
    assert text.endswith("<|im_start|>assistant\n")
    assert "# Tools" not in render(tokenizer, QWEN, tools=None)


def test_prompt_llama(tokenizer):
    text = render(tokenizer, LLAMA)
    assert "Environment: ipython" in text and '"name": "get_time"' in text
    assert ('<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", '
            '"parameters": {"city": "Paris", "unit": "c"}}<|eot_id|>') in text
    # the template writes a string result through tojson
    assert '<|start_header_id|>ipython<|end_header_id|>\n\n"{\\"temp\\": 21}"<|eot_id|>' in text


def test_prompt_mistral_ids(tokenizer):
    text = render(tokenizer, MISTRAL)
    call_id = text.split('"id": "')[1][:9]
    assert call_id.isalnum() and f'"call_id": "{call_id}"' in text
    assert '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}' \
        in text and "[AVAILABLE_TOOLS]" not in text      # tools go with the last user message


def test_prompt_mistral_v11(tokenizer):
    text = render(tokenizer, MISTRAL_V11)
    assert '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "c"}' in text
    assert '[TOOL_RESULTS]{"temp": 21}[/TOOL_RESULTS]' in text


def test_the_markers_that_are_special_tokens_stay_in_the_text():
    """Mistral's markers are special tokens of its vocabulary: a reply's text leaves them out
    unless the request keeps them (SamplingParams.text_special_tokens), and then the parser
    finds the calls; a family without such markers keeps nothing."""
    from localpaged.engine.detokenizer import decode
    tok = copy.deepcopy(smol_tokenizer())              # a byte-level BPE that spells any text
    tok.add_special_tokens({"additional_special_tokens": ["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"]})
    fmt = ToolFormat("mistral_v11")
    markers = fmt.marker_ids(tok)
    assert len(markers) == 3 and tok.convert_ids_to_tokens(list(markers)) == \
        ["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"]
    assert ToolFormat("mistral").marker_ids(tok) == markers[:1]
    assert ToolFormat("hermes").marker_ids(tok) == () == fmt.marker_ids(smol_tokenizer())
    ids = tok.encode('Sure.[TOOL_CALLS]get_time[ARGS]{"tz": "UTC"}', add_special_tokens=False)
    assert set(markers[:2]) <= set(ids)
    dropped = decode(tok, ids)
    assert "[ARGS]" not in dropped and fmt.parse(dropped).tool_calls == []
    kept = decode(tok, ids, markers)
    assert _calls(fmt.parse(kept)) == [("get_time", {"tz": "UTC"})]
    assert fmt.parse(kept).content == "Sure."


def test_a_request_with_tools_keeps_its_family_markers():
    """The API's tool request: with tools offered, the reply is held to the calls' grammar and
    keeps the family's special-token markers in its text; with tool_choice "none", neither."""
    from types import SimpleNamespace

    from localpaged.api.structured import tool_request
    from localpaged.core.sampling_params import SamplingParams
    tok = copy.deepcopy(smol_tokenizer())
    tok.add_special_tokens({"additional_special_tokens": ["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"]})
    tok.chat_template = MISTRAL_V11

    def body(choice):
        return SimpleNamespace(tools=[WEATHER], tool_choice=choice, parallel_tool_calls=None)

    offered = tool_request(body(None), tok).apply(SamplingParams())
    assert offered.guided is not None
    assert offered.text_special_tokens == ToolFormat("mistral_v11").marker_ids(tok) != ()
    none = tool_request(body("none"), tok).apply(SamplingParams())
    assert none.guided is None and none.text_special_tokens == ()


@pytest.mark.parametrize("template", [TOY, None])
def test_prompt_generic(tokenizer, template):
    messages = CONVERSATION + [{"role": "tool", "tool_call_id": "x", "content": "second"}]
    msgs, kwargs = prompt_messages(messages, TOOLS, tool_format(template))
    assert kwargs == {}
    assert msgs[0]["role"] == "system" and msgs[0]["content"].startswith("Be brief.\n\n# Tools")
    assert '"name": "get_time"' in msgs[0]["content"] and "<tool_call>" in msgs[0]["content"]
    assert msgs[2] == {"role": "assistant", "content": '<tool_call>\n{"name": "get_weather", '
                       '"arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>'}
    assert msgs[3] == {"role": "user", "content": '<tool_response>\n{"temp": 21}\n'
                       '</tool_response>\n<tool_response>\nsecond\n</tool_response>'}
    assert len(msgs) == 4
    text = render(tokenizer, TOY, messages=messages)
    assert "user: <tool_response>\n{\"temp\": 21}" in text
    assert render(tokenizer, TOY, tools=None).startswith("system: Be brief.\nuser:")


def test_prompt_refuses_arguments_that_are_not_json():
    bad = [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]
    with pytest.raises(ValueError, match=r"messages\[0\]\.tool_calls\[0\]"):
        prompt_messages(bad, TOOLS, tool_format(QWEN))
