"""OpenAI's harmony format (GPT-OSS's channels) on a model the engine runs: the tiny Llama with a
harmony tokenizer and template (helpers/reasoning_models.py `build_harmony_thinker`), which
never leaves its analysis channel on its own.

Oracle: transformers' greedy tokens under the budget (hf_budgeted with harmony's forced
`<|end|><|start|>assistant<|channel|>final<|message|>`), decoded by the tokenizer: the reasoning
is the text of the model's own analysis tokens, the content the text after the forced marker.
The split itself is checked on token ids written out by hand (both markers written by the
model, two analysis messages, a direct answer, a reply cut short), decoded as the engine
decodes them, whole and fed in every cut.
"""

from __future__ import annotations

import json

import pytest
from helpers.api_server import MODEL, serve_model
from helpers.reasoning_models import (
    H_ANALYSIS,
    H_ASSISTANT,
    H_CHANNEL,
    H_END,
    H_FINAL,
    H_MESSAGE,
    H_START,
    HARMONY_FORCED,
    HARMONY_SPECIAL,
    HARMONY_TEMPLATE,
    QUESTION,
    build_harmony_thinker,
    hf_budgeted,
)
from transformers import AutoTokenizer

from localpaged import LLM, SamplingParams
from localpaged.chat.reasoning import Split, reasoning_format
from localpaged.core.reasoning_budget import ReasoningState
from localpaged.engine.detokenizer import decode

MESSAGES = [{"role": "user", "content": QUESTION}]
OPEN = [H_CHANNEL, H_ANALYSIS, H_MESSAGE]
NEXT = [H_END, H_START, H_ASSISTANT]
A, B, C = [10, 11, 12], [20, 21], [30, 31, 32]       # ordinary tokens: text of their own


@pytest.fixture(scope="module")
def harmony(tiny_root):
    return build_harmony_thinker(tiny_root)


@pytest.fixture(scope="module")
def llm(harmony):
    return LLM(harmony, num_kv_blocks=128, max_num_seqs=8)


@pytest.fixture(scope="module")
def fmt(llm):
    return reasoning_format(llm.tokenizer)


def test_the_format_is_found_from_the_template_and_the_tokens(fmt, thinker, tiny_llama):
    assert fmt.family == "harmony" and not fmt.has_switch
    assert fmt.markers.start == tuple(OPEN) and fmt.markers.end == tuple(HARMONY_FORCED)
    assert sorted(fmt.markers.special) == sorted(HARMONY_SPECIAL) and fmt.markers.transition == ()
    tok = AutoTokenizer.from_pretrained(thinker)       # a copy of its own
    assert reasoning_format(tok).family == "think"
    tok.chat_template = HARMONY_TEMPLATE               # harmony's template, not its tokens
    assert reasoning_format(tok) is None
    assert reasoning_format(AutoTokenizer.from_pretrained(tiny_llama)) is None


def _text(llm, fmt, ids):
    return decode(llm.tokenizer, ids, fmt.markers.special)


def _plain(llm, ids):
    return llm.tokenizer.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("case", ["both", "two_analyses", "direct", "cut_short", "opened"])
def test_a_reply_splits_into_analysis_and_final_whole_and_streamed(llm, fmt, case):
    final = NEXT + [H_CHANNEL, H_FINAL, H_MESSAGE]
    reply, prompt, want = {
        "both": (OPEN + A + final + C, [H_START, H_ASSISTANT], (A, C)),
        "two_analyses": (OPEN + A + NEXT + OPEN + B + final + C, [], (A, C)),
        "direct": ([H_CHANNEL, H_FINAL, H_MESSAGE] + C, [], ([], C)),
        "cut_short": (OPEN + A + [H_END, H_START], [], (A, [])),
        "opened": (A + final + C, OPEN, (A, C)),      # the template opened the analysis
    }[case]
    text = _text(llm, fmt, reply)
    assert "<|channel|>" in text or case == "opened"        # the engine's text keeps markers
    reasoning = _plain(llm, want[0])
    if case == "two_analyses":
        reasoning += "\n\n" + _plain(llm, B)
    expected = Split(reasoning, _plain(llm, want[1]))
    assert fmt.split(text, prompt) == expected
    for cut in range(len(text) + 1):                        # every two-delta stream
        parser = fmt.parser(prompt)
        assert parser.feed(text[:cut]) + parser.feed(text[cut:]) + parser.finish() == expected
    parser = fmt.parser(prompt)                             # one character a delta
    assert sum((parser.feed(ch) for ch in text), Split()) + parser.finish() == expected


def test_the_state_counts_analysis_tokens_written_by_the_model(fmt):
    state = ReasoningState.start(fmt.markers, None, [H_START, H_ASSISTANT])
    final = NEXT + [H_CHANNEL, H_FINAL, H_MESSAGE]
    for t in OPEN + A + final + C:
        state.advance(t)
    assert state.count == len(A) and not state.inside


@pytest.mark.parametrize("budget", [0, 6])
def test_the_budget_forces_the_final_channel(llm, fmt, harmony, budget):
    prompt = llm.apply_chat_template(MESSAGES)
    assert prompt[-3:] == OPEN
    params = SamplingParams(max_tokens=24, temperature=0.0, reasoning_markers=fmt.markers,
                            reasoning_budget=budget)
    out = llm.generate([prompt], params)[0].outputs[0]
    ids = hf_budgeted(harmony, prompt, budget, 24, HARMONY_FORCED)
    assert out.token_ids == ids and out.reasoning_tokens == budget
    assert fmt.split(out.text, prompt) == Split(
        _plain(llm, ids[:budget]).strip(), _plain(llm, ids[budget + 6:]).lstrip())
    plain = llm.generate([prompt], SamplingParams(max_tokens=24, temperature=0.0))[0].outputs[0]
    assert "<|" not in plain.text             # without the markers no special token is shown


@pytest.fixture(scope="module")
def served(harmony):
    yield from serve_model(harmony)


def _body(**kw):
    return {"model": MODEL, "messages": MESSAGES, "temperature": 0, "max_tokens": 24} | kw


def _expected(engine, harmony, budget):
    tok = engine.tokenizer
    prompt = list(tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True,
                                          return_dict=False))
    ids = hf_budgeted(harmony, prompt, budget, 24, HARMONY_FORCED)
    return (tok.decode(ids[:budget], skip_special_tokens=True).strip(),
            tok.decode(ids[budget + 6:], skip_special_tokens=True).lstrip())


def test_the_api_returns_the_channels_apart(served, harmony):
    engine, client = served
    r = client.post("/chat/completions", json=_body(max_reasoning_tokens=7)).json()
    msg = r["choices"][0]["message"]
    assert (msg["reasoning_content"], msg["content"]) == _expected(engine, harmony, 7)
    assert msg["content"] and msg["reasoning_content"]
    assert r["usage"]["completion_tokens_details"] == {"reasoning_tokens": 7}
    for text in (msg["reasoning_content"], msg["content"]):
        assert "<|" not in text and "analysis" not in text and "final" not in text


def test_the_api_streams_the_channels_apart(served, harmony):
    engine, client = served
    body = _body(max_reasoning_tokens=5, stream=True, stream_options={"include_usage": True})
    with client.stream("POST", "/chat/completions", json=body) as resp:
        chunks = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    first_content = next(i for i, d in enumerate(deltas) if d.get("content"))
    assert all("reasoning_content" not in d for d in deltas[first_content:])
    streamed = ("".join(d.get("reasoning_content", "") for d in deltas),
                "".join(d.get("content") or "" for d in deltas))
    assert streamed == _expected(engine, harmony, 5)
    assert chunks[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": 5}
