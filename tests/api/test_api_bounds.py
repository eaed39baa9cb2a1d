"""Bounds on what one API request may ask for: caps on every list and string of the body, and a
prompt too long for the context refused before the chat template or the tokenizer sees it.

Runs against a real server over the tiny model of tests/api/test_api.py (context limit 1,024 tokens;
its longest vocabulary entry is 6 characters: with prompt_bound's allowance for Unicode
composition, 24,576 characters is the most text that could fit). The tokenizer is spied on: a
refused text must never reach it, and one request held inside the tokenizer must not hold up
another client's request.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from helpers.api_server import MODEL, wait_idle, words

from localpaged.api.prompt_bound import max_chars, max_token_chars
from localpaged.api.protocol import (
    MAX_CONTENT_PARTS,
    MAX_LOGIT_BIAS,
    MAX_MESSAGES,
    MAX_N,
    MAX_TOOLS,
    MAX_TOP_LOGPROBS,
)
from localpaged.core.sampling_params import MAX_STOP_CHARS, MAX_STOP_STRINGS

HUGE = 20_000_000            # characters: under the 32 MB body limit, far over any context
LONG = 3_000                 # characters: within the bound, over the context once tokenized




@pytest.fixture(scope="module")
def http(base_url):
    with httpx.Client(base_url=base_url + "/v1", timeout=60) as client:
        yield client


@pytest.fixture(autouse=True)
def _idle_after(engine):
    yield
    wait_idle(engine)


@pytest.fixture
def seen(engine, monkeypatch):
    """Lengths of the texts the tokenizer was given (encode and the chat template)."""
    tok, lengths = engine.tokenizer, []

    def spy(method):
        def call(first, *args, **kwargs):
            lengths.append(len(str(first)))
            return method(first, *args, **kwargs)
        return call
    for name in ("encode", "apply_chat_template"):
        monkeypatch.setattr(tok, name, spy(getattr(tok, name)))
    return lengths


def chat(http, messages, **fields) -> httpx.Response:
    return http.post("/chat/completions", json={"model": MODEL, "messages": messages,
                                                "max_tokens": 2, "temperature": 0, **fields})


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def assert_refused(r: httpx.Response, param: str, code: str | None = None) -> dict:
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"].startswith(param), err
    assert code is None or err["code"] == code, err
    return err


# ---- caps on the body -------------------------------------------------------------------------
@pytest.mark.parametrize("field,value,param", [
    ("stop", ["x"] * (MAX_STOP_STRINGS + 1), "stop"),
    ("stop", "x" * (MAX_STOP_CHARS + 1), "stop"),
    ("stop", ["ok", "x" * (MAX_STOP_CHARS + 1)], "stop[1]"),
    ("n", MAX_N + 1, "n"),
    ("logit_bias", {str(i): 1.0 for i in range(MAX_LOGIT_BIAS + 1)}, "logit_bias"),
    ("tools", [{"type": "function"}] * (MAX_TOOLS + 1), "tools"),
    ("top_logprobs", MAX_TOP_LOGPROBS + 1, "top_logprobs"),
    ("user", "u" * 10_000, "user"),
])
def test_capped_fields_are_refused_naming_them(http, field, value, param):
    assert_refused(chat(http, user(words(1)), **{field: value, "logprobs": True}), param)


def test_stop_strings_at_the_caps_are_served(http):
    stop = ["\u0200" * MAX_STOP_CHARS] * MAX_STOP_STRINGS        # no such text in the reply
    r = chat(http, user(words(1)), stop=stop)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"


def test_message_and_content_part_counts_are_capped(http):
    assert_refused(chat(http, user(words(1)) * (MAX_MESSAGES + 1)), "messages")
    parts = [{"type": "text", "text": "a"}] * (MAX_CONTENT_PARTS + 1)
    assert_refused(chat(http, [{"role": "user", "content": parts}]), "messages[0].content")
    assert chat(http, user(words(1)) * 8).status_code == 200


# ---- prompt length before tokenizing ----------------------------------------------------------
def test_the_bound_is_the_longest_vocabulary_entry(engine):
    assert max_token_chars(engine.tokenizer) == len("<x511>")
    assert LONG < max_chars(engine.tokenizer, engine.context_limit()) < HUGE // 2


@pytest.mark.parametrize("kind", ["chat", "completion", "chat-drop-oldest"])
def test_huge_prompt_is_refused_without_tokenizing(http, seen, kind):
    text = "a" * HUGE
    if kind == "completion":
        r = http.post("/completions", json={"model": MODEL, "prompt": text, "max_tokens": 2})
        param = "prompt"
    else:
        extra = {"context_overflow": "drop_oldest"} if kind == "chat-drop-oldest" else {}
        r, param = chat(http, user(text), **extra), "messages"
    err = assert_refused(r, param, "context_length_exceeded")
    assert f"{HUGE} characters" in err["message"]
    assert all(n < HUGE for n in seen)          # the chat template and tokenizer never saw it
    assert chat(http, user(words(2))).status_code == 200


def test_drop_oldest_leaves_out_huge_old_turns_untokenized(http, seen):
    msgs = [{"role": "system", "content": words(3, 4)}, *user("a" * (HUGE // 2)),
            {"role": "assistant", "content": "b" * (HUGE // 2)}, *user(words(4))]
    r = chat(http, msgs, context_overflow="drop_oldest")
    assert r.status_code == 200, r.text[:300]
    assert r.json()["dropped_messages"] == 2
    assert all(n < HUGE // 2 for n in seen)


def test_text_within_the_bound_is_still_counted_exactly(http):
    """The bound refuses only what cannot fit: a long text is tokenized, then refused by count."""
    err = assert_refused(chat(http, user("a" * LONG)), "messages", "context_length_exceeded")
    assert "tokens" in err["message"] and "characters" not in err["message"]


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_a_request_inside_the_tokenizer_holds_up_no_other(http, engine, monkeypatch, kind):
    """A long prompt stopped inside the tokenizer; meanwhile another client's chat is served.
    (A lock shared by all requests around tokenizing would keep the second one waiting.)"""
    tok, inside, release = engine.tokenizer, threading.Event(), threading.Event()

    def held(method):
        def call(first, *args, **kwargs):
            if len(str(first)) >= LONG:
                inside.set()
                assert release.wait(60)
            return method(first, *args, **kwargs)
        return call
    for name in ("encode", "apply_chat_template"):
        monkeypatch.setattr(tok, name, held(getattr(tok, name)))
    with ThreadPoolExecutor(1) as pool:
        if kind == "chat":
            big = pool.submit(chat, http, user("a" * LONG))
        else:
            big = pool.submit(http.post, "/completions",
                              json={"model": MODEL, "prompt": "a" * LONG, "max_tokens": 2})
        try:
            assert inside.wait(30)
            small = chat(http, user(words(5)))
            assert small.status_code == 200 and not big.done()
        finally:
            release.set()
        assert_refused(big.result(60), "messages" if kind == "chat" else "prompt",
                       "context_length_exceeded")
