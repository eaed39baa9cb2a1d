"""Fuzzing the OpenAI-compatible API with hypothesis: random request bodies, mostly well-formed
with some fields wrong, plus arbitrary JSON and raw bytes, for both endpoints, streaming or not.

Every answer must be a 2xx with a well-formed body (or a complete SSE stream), or a 4xx with an
OpenAI error object; never a 5xx. Afterwards the server still serves and the engine holds no KV
block. max_tokens is kept small so a run takes seconds.
"""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from helpers.api_server import MODEL, start_server, stop_server, wait_idle

from localpaged.api.protocol import MAX_NAME_CHARS
from localpaged.core.sampling_params import MAX_STOP_CHARS, MAX_STOP_STRINGS

# ---- strategies ---------------------------------------------------------------------------------
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                           max_leaves=12)
# junk that never means "generate many tokens" (no small positive ints, no null)
junk = st.one_of(st.booleans(), st.text(max_size=8), st.floats(allow_nan=False),
                 st.integers(-5, 0), st.integers(2**31, 2**70),
                 st.lists(scalars, max_size=3), st.dictionaries(st.text(max_size=5), scalars,
                                                                max_size=2))
vocab_text = st.text(alphabet=st.sampled_from([chr(0x100 + i) for i in range(64)]
                                             + list("ab <>|\n")), min_size=1, max_size=30)
any_text = st.one_of(vocab_text, st.text(max_size=20))
small = st.integers(1, 4)

text_part = st.fixed_dictionaries({"type": st.just("text"), "text": any_text})
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool"]),
     "content": st.one_of(any_text, st.lists(text_part, min_size=1, max_size=3))},
    optional={"name": st.text(max_size=5)})
prompts = st.one_of(vocab_text, st.lists(st.integers(0, 511), min_size=1, max_size=40),
                    st.lists(vocab_text, min_size=1, max_size=1),
                    st.lists(st.lists(st.integers(0, 511), min_size=1, max_size=10), min_size=1,
                             max_size=1))

# Valid values of each field (within the API's ranges), and values likely to be refused.
VALID = {
    "model": st.just(MODEL), "max_tokens": small, "max_completion_tokens": small,
    "messages": st.lists(message, min_size=1, max_size=4), "prompt": prompts,
    "n": small, "temperature": st.one_of(st.floats(0, 2), st.sampled_from([0, 1e-30, 1e-6])),
    "top_p": st.floats(0.01, 1), "top_k": st.integers(-1, 600), "min_p": st.floats(0, 1),
    "presence_penalty": st.floats(-2, 2), "frequency_penalty": st.floats(-2, 2),
    "repetition_penalty": st.floats(0.01, 100), "seed": st.integers(-2**63, 2**64),
    "stop": st.one_of(vocab_text, st.lists(vocab_text, max_size=4)),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}),
    "ignore_eos": st.booleans(), "stop_token_ids": st.lists(st.integers(0, 600), max_size=4),
    "logit_bias": st.just({}), "user": st.text(max_size=5), "unknown_field": json_values,
}
CHAT_ONLY = {"logprobs": st.booleans(), "top_logprobs": st.integers(0, 20),
             "response_format": st.just({"type": "text"}), "tools": st.just([])}
COMPLETION_ONLY = {"logprobs": st.integers(0, 20), "echo": st.just(False)}
WRONG = {
    "model": st.one_of(st.text(max_size=8), junk),
    "messages": st.one_of(st.just([]), junk, st.lists(st.fixed_dictionaries(
        {"role": st.one_of(st.text(max_size=6), junk), "content": st.one_of(any_text, junk)}),
        min_size=1, max_size=2)),
    "prompt": st.one_of(st.just(""), st.just([]), st.lists(st.integers(-3, 10**6), min_size=1,
                                                           max_size=5), junk),
    "n": st.one_of(st.integers(-3, 0), st.integers(17, 10**6), junk),
    "temperature": st.one_of(st.floats(-5, -0.001), junk),
    "top_p": st.one_of(st.sampled_from([0, 1.5, -1]), junk),
    "stop": st.one_of(st.just(""), st.lists(st.just(""), min_size=1, max_size=2), junk,
                      st.text(min_size=MAX_STOP_CHARS + 1, max_size=MAX_STOP_CHARS + 4),
                      st.lists(vocab_text, min_size=MAX_STOP_STRINGS + 1,
                               max_size=MAX_STOP_STRINGS + 2)),
    "user": st.text(min_size=MAX_NAME_CHARS + 1, max_size=MAX_NAME_CHARS + 4),
    "stop_token_ids": st.one_of(st.lists(st.integers(-5, -1), min_size=1, max_size=2), junk),
    "logprobs": st.one_of(st.integers(21, 100), st.integers(-5, -1), junk),
    "top_logprobs": st.one_of(st.integers(21, 100), junk),
    "tools": st.lists(json_values, min_size=1, max_size=1),
    "logit_bias": st.dictionaries(st.text(max_size=3), st.floats(-5, 5), min_size=1, max_size=2),
    "response_format": st.just({"type": "json_object"}), "echo": st.just(True),
}
REQUIRED = {"chat/completions": ("model", "messages", "max_tokens"),
            "completions": ("model", "prompt", "max_tokens")}


@st.composite
def bodies(draw, endpoint: str) -> dict:
    """A valid body, or one with one field wrong, or one required field missing."""
    fields = {**VALID, **(CHAT_ONLY if endpoint == "chat/completions" else COMPLETION_ONLY)}
    body = {k: draw(fields[k]) for k in REQUIRED[endpoint]}
    body["stream"] = draw(st.booleans())
    optional = sorted(set(fields) - set(body) - {"prompt", "messages"})
    for k in draw(st.lists(st.sampled_from(optional), unique=True, max_size=7)):
        body[k] = draw(fields[k])
    mode = draw(st.sampled_from(["valid", "valid", "valid", "wrong", "wrong", "missing"]))
    if mode == "wrong":
        k = draw(st.sampled_from(sorted(set(body) | set(WRONG) & set(fields))))
        body[k] = draw(WRONG.get(k, junk))
    elif mode == "missing":
        del body[draw(st.sampled_from(REQUIRED[endpoint]))]
    return body


requests = st.one_of(
    st.tuples(st.just("chat/completions"), bodies("chat/completions")),
    st.tuples(st.just("completions"), bodies("completions")),
    st.tuples(st.sampled_from(["chat/completions", "completions"]), json_values),
)

# Derandomized, with no example database, by the suite's hypothesis profile (tests/conftest.py).
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow, HealthCheck.data_too_large])


# ---- fixtures -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def http(engine):
    url, server = start_server(engine)
    with httpx.Client(base_url=url, timeout=60) as client:
        yield client
    stop_server(server)


def check_answer(r: httpx.Response, streamed: bool) -> None:
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        err = r.json()["error"]
        assert isinstance(err["message"], str) and err["message"]
        assert err["type"] == "invalid_request_error"
        assert set(err) == {"message", "type", "param", "code"}
        return
    assert r.status_code == 200
    if streamed:
        events = [e for e in r.text.split("\n\n") if e]
        assert events[-1] == "data: [DONE]", r.text[-300:]
        for e in events[:-1]:
            assert e.startswith("data: ")
            chunk = json.loads(e[6:])
            assert "error" not in chunk, chunk
    else:
        body = r.json()
        assert body["choices"] and body["usage"]["completion_tokens"] >= 1


def assert_still_serving(http: httpx.Client, engine) -> None:
    wait_idle(engine)
    r = http.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 2, "ignore_eos": True,
                                                "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"


# ---- tests --------------------------------------------------------------------------------------
@SETTINGS
@given(request=requests)
def test_fuzz_json_bodies(http, engine, request):
    endpoint, body = request
    streamed = isinstance(body, dict) and body.get("stream") is True
    r = http.post(f"/v1/{endpoint}", content=json.dumps(body),
                  headers={"content-type": "application/json"})
    check_answer(r, streamed)


@settings(SETTINGS, max_examples=30)
@given(endpoint=st.sampled_from(["chat/completions", "completions"]),
       raw=st.one_of(st.binary(max_size=200),
                     st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
                     st.just(b"[" * 100_000), st.just(b'{"model": "' + b"\xff" * 10 + b'"}')),
       content_type=st.sampled_from(["application/json", "text/plain", None]))
def test_fuzz_raw_bytes(http, engine, endpoint, raw, content_type):
    headers = {"content-type": content_type} if content_type else {}
    r = http.post(f"/v1/{endpoint}", content=raw, headers=headers)
    assert 400 <= r.status_code < 500, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_server_alive_after_fuzzing(http, engine):
    assert_still_serving(http, engine)
