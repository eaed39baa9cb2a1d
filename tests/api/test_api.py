"""Tests of the OpenAI-compatible API (localpaged/api, server.py, remote.py) over a real uvicorn
server in a background thread, driven by the official `openai` client and raw httpx.

The model is a tiny random Llama (tests/helpers/tiny_models.py, via conftest's tiny_llama) whose
tokenizer maps each character U+0100..U+01FF to one token, so prompts built by `words()` differ
token by token; outputs are random-looking text. After every test the engine must hold no KV
block (autouse fixture).
"""

from __future__ import annotations

import http.client
import json
import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from helpers.api_server import (API_KEY, MAX_NUM_SEQS, MODEL, chat_msgs, gate, serve_switchable,
                                start_server, steps_of, stop_server, wait_idle, words)
from helpers.engine_helpers import hf_sampled
from helpers.step_gate import StepGate, poll, shared_step

from localpaged import LLM, SamplingParams
from localpaged.api import APIError, ServedModel, check_bind_safety, resolve_api_key
from localpaged.api.server import build_app
from localpaged.chat.remote import RemoteChatBackend
from localpaged.engine.llm import apply_chat_template


# ---- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_blocks_leak(request):
    yield
    if "engine" in request.fixturenames:
        wait_idle(request.getfixturevalue("engine"))


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=60)


def greedy_chat(client, messages, max_tokens=16, **kw):
    return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens,
                                          temperature=0, **kw)


# ---- models, chat and completions ---------------------------------------------------------------
def test_models(client):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


def test_chat_completion(client, engine):
    msgs = chat_msgs(0)
    r = greedy_chat(client, msgs, max_tokens=8)
    assert r.object == "chat.completion" and r.model == MODEL and r.id.startswith("chatcmpl-")
    (choice,) = r.choices
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length"
    prompt_ids = apply_chat_template(engine.tokenizer, msgs)
    assert r.usage.prompt_tokens == len(prompt_ids)
    assert r.usage.completion_tokens == 8
    assert r.usage.total_tokens == len(prompt_ids) + 8
    # the same as the engine alone
    direct = list(engine.submit(prompt_ids, SamplingParams(max_tokens=8, temperature=0)))[-1]
    assert choice.message.content == direct.outputs[0].text
    # max_completion_tokens is the newer name of max_tokens
    r2 = client.chat.completions.create(model=MODEL, messages=msgs, temperature=0,
                                        max_completion_tokens=8)
    assert r2.choices[0].message.content == choice.message.content


def test_chat_content_parts_and_prefix_cache(client):
    msgs = [{"role": "user", "content": [{"type": "text", "text": words(3, 40)}]}]
    first = greedy_chat(client, msgs, max_tokens=4)
    second = greedy_chat(client, [{"role": "user", "content": words(3, 40)}], max_tokens=4)
    assert first.choices[0].message.content == second.choices[0].message.content
    assert second.usage.prompt_tokens_details.cached_tokens >= 16    # a full block reused


def test_chat_streaming(client):
    msgs = chat_msgs(1)
    whole = greedy_chat(client, msgs, max_tokens=12).choices[0].message.content
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=msgs, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert len(chunks) > 3                                  # streamed, not one blob
    *body, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == 12
    assert all(c.usage is None for c in body)
    # without include_usage there is no usage chunk
    plain = list(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=3,
                                                temperature=0, stream=True))
    assert all(c.choices for c in plain)


def test_completions_string_and_token_ids(client, engine):
    prompt = words(2)
    ids = engine.tokenizer.encode(prompt, add_special_tokens=True)
    by_text = client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0)
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=10, temperature=0)
    assert by_text.object == "text_completion"
    assert by_text.choices[0].text == by_ids.choices[0].text != ""
    assert by_text.usage.prompt_tokens == len(ids) and by_text.usage.completion_tokens == 10
    direct = list(engine.submit(ids, SamplingParams(max_tokens=10, temperature=0)))[-1]
    assert by_text.choices[0].text == direct.outputs[0].text
    batch_of_one = client.completions.create(model=MODEL, prompt=[ids], max_tokens=10,
                                             temperature=0)
    assert batch_of_one.choices[0].text == by_ids.choices[0].text
    # the default max_tokens of /v1/completions is OpenAI's 16
    assert client.completions.create(model=MODEL, prompt=ids, temperature=0).usage \
        .completion_tokens == 16


def test_completions_streaming(client):
    prompt = [7, 8, 9, 10]
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=12,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage.completion_tokens == 12 and chunks[-1].choices == []
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_n_samples(client):
    r = client.chat.completions.create(model=MODEL, messages=chat_msgs(4), max_tokens=10, n=3,
                                       temperature=1.0, seed=5)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert len({c.message.content for c in r.choices}) > 1          # distinct samples
    assert r.usage.completion_tokens == 30
    streamed = list(client.completions.create(model=MODEL, prompt=[3, 4, 5], max_tokens=6, n=3,
                                              temperature=1.0, seed=5, stream=True))
    texts: dict[int, str] = {}
    finished = set()
    for c in streamed:
        for ch in c.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
            if ch.finish_reason:
                finished.add(ch.index)
    assert finished == {0, 1, 2} and all(texts[i] for i in range(3))
    whole = client.completions.create(model=MODEL, prompt=[3, 4, 5], max_tokens=6, n=3,
                                      temperature=1.0, seed=5)
    assert [texts[i] for i in range(3)] == [c.text for c in sorted(whole.choices,
                                                                  key=lambda c: c.index)]


def test_stop_strings(client):
    msgs = chat_msgs(5)
    full = greedy_chat(client, msgs, max_tokens=24).choices[0].message.content
    stop = full[6:8]
    expected = full[:full.find(stop)]
    r = greedy_chat(client, msgs, max_tokens=24, stop=[stop, "\u0000never"])
    assert r.choices[0].message.content == expected
    assert r.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=24,
                                                 temperature=0, stop=stop, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_seed_reproducible(client):
    def sample(seed):
        return client.chat.completions.create(model=MODEL, messages=chat_msgs(6), max_tokens=16,
                                              temperature=1.0, seed=seed).choices[0].message.content
    assert sample(1234) == sample(1234)
    assert sample(1234) != sample(4321)


# (request's sampling fields, the ones of them that change its tokens): no single setting lets all
# of top_p and min_p bite on the tiny model's flat distribution, so two requests cover them.
SAMPLED = [(dict(temperature=0.7, top_p=0.9, min_p=0.05, repetition_penalty=1.2,
                 presence_penalty=1.5, frequency_penalty=-0.5),
            ("top_p", "repetition_penalty", "presence_penalty", "frequency_penalty")),
           (dict(temperature=0.7, top_p=0.9, min_p=0.8, repetition_penalty=1.2,
                 presence_penalty=1.5, frequency_penalty=-0.5),
            ("min_p", "repetition_penalty", "presence_penalty"))]
NEUTRAL = dict(top_p=1.0, min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0,
               frequency_penalty=0.0)


def oracle_sample(path: str, prompt_ids: list[int], n: int, seed: int, fields: dict):
    """engine_helpers.hf_sampled (transformers' logits, the penalties and filters by their
    definitions, the request's seeded draws) for a request's sampling fields."""
    names = dict(repetition_penalty="repetition", presence_penalty="presence",
                 frequency_penalty="frequency")
    return hf_sampled(path, prompt_ids, n, seed=seed, **{names.get(k, k): v for k, v in fields.items()})


def test_sampling_extensions(client, engine, tiny_llama):
    common = dict(model=MODEL, messages=chat_msgs(7), max_tokens=8, seed=3)
    top1 = client.chat.completions.create(**common, temperature=1.0, extra_body={"top_k": 1})
    greedy = client.chat.completions.create(**common, temperature=0)
    assert top1.choices[0].message.content == greedy.choices[0].message.content
    prompt_ids = apply_chat_template(engine.tokenizer, chat_msgs(7))
    for fields, biting in SAMPLED:
        openai_fields = {k: v for k, v in fields.items() if k not in ("min_p", "repetition_penalty")}
        r = client.chat.completions.create(
            **common, **openai_fields, logprobs=True,
            extra_body={"min_p": fields["min_p"], "repetition_penalty": fields["repetition_penalty"]})
        assert r.choices[0].finish_reason == "length"
        want, want_lps = oracle_sample(tiny_llama, prompt_ids, 8, 3, fields)
        content = r.choices[0].logprobs.content
        assert [c.token for c in content] == [engine.tokenizer.decode([t], skip_special_tokens=False)
                                              for t in want]
        assert [c.logprob for c in content] == pytest.approx(want_lps, abs=1e-4)
        for name in biting:          # each of these changes the tokens: the comparison sees it
            assert oracle_sample(tiny_llama, prompt_ids, 8, 3, fields | {name: NEUTRAL[name]})[0] \
                != want, name
    # a vanishing temperature is greedy (no overflow to inf/NaN)
    tiny = client.chat.completions.create(**common, temperature=1e-30)
    assert tiny.choices[0].message.content == greedy.choices[0].message.content


def test_logprobs(client):
    r = greedy_chat(client, chat_msgs(8), max_tokens=6, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == 6
    for item in content:
        tops = [t.logprob for t in item.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert item.logprob == pytest.approx(tops[0], abs=1e-5)     # greedy picks the top
        assert item.bytes == list(item.token.encode())
    assert "".join(i.token for i in content) == r.choices[0].message.content
    assert greedy_chat(client, chat_msgs(8), max_tokens=2).choices[0].logprobs is None
    only = greedy_chat(client, chat_msgs(8), max_tokens=2, logprobs=True)
    assert [t.top_logprobs for t in only.choices[0].logprobs.content] == [[], []]

    c = client.completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=5, temperature=0,
                                  logprobs=2)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert all(len(t) >= 2 for t in lp.top_logprobs)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    streamed = list(client.completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=5,
                                              temperature=0, logprobs=2, stream=True))
    tokens = [t for ch in streamed for choice in ch.choices for t in choice.logprobs.tokens]
    assert tokens == lp.tokens


def test_concurrent_clients_batch_and_match(client, engine, monkeypatch):
    """8 clients at once share the engine's batches and get what each gets alone. The engine
    holds its first step until all eight are submitted, so the next step runs them all."""
    def run(i: int) -> str:
        if i % 2:
            return greedy_chat(client, chat_msgs(20 + i), max_tokens=48,
                               extra_body={"ignore_eos": True}).choices[0].message.content
        chunks = client.completions.create(model=MODEL, prompt=words(20 + i), max_tokens=48,
                                           temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        return "".join(c.choices[0].text for c in chunks)

    alone = [run(i) for i in range(8)]
    submitted = _record_submits(engine, monkeypatch)
    with gate(engine) as held, ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(run, i) for i in range(8)]
        poll(lambda: len(submitted) == 8, "eight submitted requests")
        held.release()
        together = [f.result() for f in futures]
    assert together == alone
    assert shared_step(engine.step_records(), submitted)    # they really ran in one batch


# ---- disconnects --------------------------------------------------------------------------------
def _record_submits(engine, monkeypatch) -> list[str]:
    """The request ids the engine is given from now on (by the server's threads)."""
    submitted: list[str] = []
    real = engine.submit

    def submit(*args, **kwargs):
        stream = real(*args, **kwargs)
        submitted.append(stream.request_id)
        return stream
    monkeypatch.setattr(engine, "submit", submit)
    return submitted


def _record_aborts(engine, monkeypatch) -> list[str]:
    aborted: list[str] = []
    real = engine.abort

    def abort(request_id):
        aborted.append(request_id)
        real(request_id)
    monkeypatch.setattr(engine, "abort", abort)
    return aborted


HELD_STEP = 12        # the request's step the engine holds (the first 3 chunks are out by then)


@pytest.mark.parametrize("endpoint", ["completions", "chat/completions"])
def test_disconnect_mid_stream_frees_blocks(base_url, engine, monkeypatch, endpoint):
    """The client closes the stream after three chunks while its request runs (the engine holds
    the request's 12th step until the abort has arrived): the request runs no further step."""
    aborted = _record_aborts(engine, monkeypatch)
    body = {"model": MODEL, "max_tokens": 900, "stream": True, "ignore_eos": True}
    body.update({"prompt": words(30, 40)} if endpoint == "completions"
                else {"messages": chat_msgs(30)})
    data = []
    with gate(engine, HELD_STEP) as held:
        with httpx.Client(timeout=30) as session:
            with session.stream("POST", f"{base_url}/v1/{endpoint}", json=body) as r:
                assert r.status_code == 200
                assert r.headers["content-type"].startswith("text/event-stream")
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        data.append(json.loads(line[6:]))
                    if len(data) == 3:
                        held.wait_held()           # running: the engine waits in the gate
                        break                      # (leaving iter_lines closes the stream)
        request_id = data[0]["id"]
        poll(lambda: request_id in aborted, "the abort of the closed stream")
    wait_idle(engine, timeout=10)       # the 900-token request stops: idle within the deadline
    assert steps_of(engine, request_id) == HELD_STEP


def test_disconnect_before_answer_aborts(base_url, engine, monkeypatch):
    """A client gone before its answer (not streamed): the request is aborted. The engine holds
    the request's first step until the abort has arrived, so the answer cannot be ready first."""
    aborted = _record_aborts(engine, monkeypatch)
    host, port = base_url.removeprefix("http://").split(":")
    body = {"model": MODEL, "prompt": words(31), "max_tokens": 1000, "ignore_eos": True}
    with gate(engine) as held:
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request("POST", "/v1/completions", json.dumps(body),
                     {"Content-Type": "application/json"})
        held.wait_held()                           # the request runs its first step
        conn.close()                               # and the client leaves without its answer
        request_id = poll(lambda: next((a for a in aborted if a.startswith("cmpl-")), None),
                          "the abort of the request whose client left")
    wait_idle(engine, timeout=10)
    assert steps_of(engine, request_id) == 1


# ---- bad requests -------------------------------------------------------------------------------
OK_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
OK_COMPLETION = {"model": MODEL, "prompt": [5, 6], "max_tokens": 2}


def _with(base: dict, **changes) -> dict:
    body = {**base, **changes}
    return {k: v for k, v in body.items() if v is not ...}


BAD_REQUESTS = [
    # (endpoint, body (dict or raw str), status, param, code)
    ("chat/completions", _with(OK_CHAT, model="gpt-4o"), 404, "model", "model_not_found"),
    ("completions", _with(OK_COMPLETION, model="nope"), 404, "model", "model_not_found"),
    ("chat/completions", _with(OK_CHAT, temperature=-1), 400, "temperature", "invalid_value"),
    ("completions", _with(OK_COMPLETION, temperature=-1), 400, "temperature", "invalid_value"),
    ("chat/completions", _with(OK_CHAT, n=0), 400, "n", "invalid_value"),
    ("completions", _with(OK_COMPLETION, n=MAX_NUM_SEQS + 1), 400, "n", "invalid_value"),
    ("chat/completions", '{"model": "tiny-llama", "messages": [', 400, None, "invalid_json"),
    ("completions", "not json at all", 400, None, "invalid_json"),
    ("chat/completions", "[1, 2]", 400, None, "invalid_body"),
    ("chat/completions", _with(OK_CHAT, messages=...), 400, "messages",
     "missing_required_parameter"),
    ("completions", _with(OK_COMPLETION, prompt=...), 400, "prompt", "missing_required_parameter"),
    ("chat/completions", _with(OK_CHAT, model=...), 400, "model", "missing_required_parameter"),
    ("chat/completions", _with(OK_CHAT, messages=[]), 400, "messages", "invalid_value"),
    ("chat/completions", _with(OK_CHAT, messages="hi"), 400, "messages", "invalid_value"),
    ("chat/completions", _with(OK_CHAT, messages=[{"role": "wizard", "content": "x"}]), 400,
     "messages[0].role", "invalid_value"),
    ("chat/completions", _with(OK_CHAT, messages=[{"content": "x"}]), 400, "messages[0].role",
     "missing_required_parameter"),
    ("chat/completions", _with(OK_CHAT, max_tokens="5"), 400, "max_tokens", "invalid_value"),
    ("chat/completions", _with(OK_CHAT, max_tokens=2.5), 400, "max_tokens", "invalid_value"),
    ("chat/completions", _with(OK_CHAT, temperature="hot"), 400, "temperature", "invalid_value"),
    ("chat/completions", _with(OK_CHAT, stream="yes"), 400, "stream", "invalid_value"),
    ("chat/completions", _with(OK_CHAT, stop=3), 400, "stop", "invalid_value"),
    ("chat/completions", _with(OK_CHAT, stop=["ok", ""]), 400, "stop[1]", "invalid_value"),
    ("chat/completions", _with(OK_CHAT, top_p=0), 400, "top_p", "invalid_value"),
    ("chat/completions", _with(OK_CHAT, presence_penalty=3), 400, "presence_penalty",
     "invalid_value"),
    ("chat/completions", _with(OK_CHAT, top_logprobs=50, logprobs=True), 400, "top_logprobs",
     "invalid_value"),
    ("chat/completions", _with(OK_CHAT, top_logprobs=2), 400, "top_logprobs", "invalid_value"),
    ("chat/completions", _with(OK_CHAT, logit_bias={"5": 10}), 400, "logit_bias",
     "unsupported_parameter"),
    ("chat/completions", _with(OK_CHAT, tools=[{"type": "function"}]), 400, "tools[0]",
     "invalid_value"),
    ("chat/completions", _with(OK_CHAT, messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]), 400, "messages[0].content[0]",
     "unsupported_content"),             # a text-only model (tests/api/test_images_api.py)
    ("chat/completions", _with(OK_CHAT, messages=[{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "x"}}]}]), 400, "messages[0].content",
     "unsupported_content"),
    ("completions", _with(OK_COMPLETION, prompt={"a": 1}), 400, "prompt", "invalid_value"),
    ("completions", _with(OK_COMPLETION, prompt=""), 400, "prompt", "invalid_value"),
    ("completions", _with(OK_COMPLETION, prompt=[]), 400, "prompt", "invalid_value"),
    ("completions", _with(OK_COMPLETION, prompt=["a", "b"]), 400, "prompt", "invalid_value"),
    ("completions", _with(OK_COMPLETION, prompt=[1, 99999]), 400, "prompt", "invalid_value"),
    ("completions", _with(OK_COMPLETION, prompt=[1, -2]), 400, "prompt[1]", "invalid_value"),
    ("completions", _with(OK_COMPLETION, prompt="\ud800 lone surrogate"), 400, "prompt",
     "invalid_value"),
    ("chat/completions", _with(OK_CHAT, messages=[{"role": "user", "content": "a\udfff"}]), 400,
     "messages[0].content", "invalid_value"),
    ("completions", _with(OK_COMPLETION, logprobs=True), 400, "logprobs", "invalid_value"),
    ("completions", _with(OK_COMPLETION, temperature=float("nan")), 400, "temperature",
     "invalid_value"),
    ("completions", _with(OK_COMPLETION, max_tokens=0), 400, "max_tokens", "invalid_value"),
    ("completions", _with(OK_COMPLETION, prompt=[5] * 1030), 400, "prompt",
     "context_length_exceeded"),
    ("completions", _with(OK_COMPLETION, prompt=[5] * 1000, max_tokens=100), 400, "max_tokens",
     "context_length_exceeded"),
    ("chat/completions", _with(OK_CHAT, messages=[{"role": "user", "content": "x" * 1100}]), 400,
     "messages", "context_length_exceeded"),
    ("chat/completions", _with(OK_CHAT, max_completion_tokens=10**9), 400,
     "max_completion_tokens", "context_length_exceeded"),
    ("chat/completions", _with(OK_CHAT, model="\ud800"), 400, "model", "invalid_value"),
]


HTTP = httpx.Client(timeout=30)       # one client: creating one costs ~0.1 s (its SSL context)


def _post(base_url: str, endpoint: str, body, headers=None) -> httpx.Response:
    content = body if isinstance(body, str) else json.dumps(body)
    return HTTP.post(f"{base_url}/v1/{endpoint}", content=content.encode("utf-8", "surrogatepass"),
                     headers={"content-type": "application/json", **(headers or {})})


@pytest.mark.parametrize("endpoint,body,status,param,code", BAD_REQUESTS,
                         ids=[f"{i}-{r[0]}-{r[3]}-{r[4]}" for i, r in enumerate(BAD_REQUESTS)])
def test_bad_request_gets_openai_error(base_url, endpoint, body, status, param, code):
    r = _post(base_url, endpoint, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["message"]
    assert err["param"] == param and err["code"] == code


def test_server_serves_after_bad_requests(base_url, client):
    for endpoint, body, *_ in BAD_REQUESTS:
        for stream in (False, True):
            if isinstance(body, dict):
                _post(base_url, endpoint, {**body, "stream": stream})
    assert greedy_chat(client, chat_msgs(9), max_tokens=3).choices[0].finish_reason == "length"


def test_openai_client_raises_typed_errors(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=chat_msgs(0), max_tokens=2)
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=chat_msgs(0), temperature=-1)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt=[5] * 2000, stream=True)


def test_other_paths_and_methods(base_url):
    r = HTTP.get(f"{base_url}/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    r = HTTP.get(f"{base_url}/v1/nothing-here")
    assert r.status_code == 404 and "error" in r.json()
    r = HTTP.post(f"{base_url}/v1/completions", content=json.dumps(OK_COMPLETION))  # no type
    assert r.status_code == 400 and "Content-Type" in r.json()["error"]["message"]
    r = _post(base_url, "completions", "x" * (32 * 2**20 + 1))
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert HTTP.get(f"{base_url}/health").json() == {"status": "ok"}


# ---- API key ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def keyed_url(engine):
    url, server = start_server(engine, api_key=API_KEY)
    yield url
    stop_server(server)


def test_api_key_enforced(keyed_url):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY},
                    {"Authorization": "Basic " + API_KEY}):
        r = _post(keyed_url, "chat/completions", OK_CHAT, headers)
        assert r.status_code == 401, headers
        assert r.json()["error"]["code"] == "invalid_api_key"
        assert HTTP.get(f"{keyed_url}/v1/models", headers=headers).status_code == 401
    # checked before the body: a malformed body without a key is still a 401
    assert _post(keyed_url, "completions", "{oops").status_code == 401
    good = {"Authorization": f"Bearer {API_KEY}"}
    assert _post(keyed_url, "chat/completions", OK_CHAT, good).status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed_url + "/v1", api_key="wrong", max_retries=0).models.list()
    keyed = openai.OpenAI(base_url=keyed_url + "/v1", api_key=API_KEY, max_retries=0)
    assert keyed.completions.create(model=MODEL, prompt=[4, 5], max_tokens=2).choices[0].text
    assert HTTP.get(f"{keyed_url}/metrics").status_code == 200     # monitoring stays open


def test_bind_safety_and_key_resolution(caplog, monkeypatch):
    with caplog.at_level(logging.WARNING, logger="localpaged.api.security"):
        assert check_bind_safety("127.0.0.1", None)
        assert check_bind_safety("localhost", None)
        assert check_bind_safety("::1", None)
        assert check_bind_safety("0.0.0.0", "key")
        assert not caplog.records
        assert not check_bind_safety("0.0.0.0", None)
        assert not check_bind_safety("192.168.1.5", None)
    assert len(caplog.records) == 2 and "API key" in caplog.records[0].getMessage()
    monkeypatch.setenv("LOCALPAGED_API_KEY", "from-env")
    assert resolve_api_key(None) == "from-env"
    assert resolve_api_key("cli") == "cli"
    monkeypatch.setenv("LOCALPAGED_API_KEY", "")
    assert resolve_api_key(None) is None


# ---- metrics ------------------------------------------------------------------------------------
METRIC_LINE = re.compile(r'^[a-z_:][a-z0-9_:]*(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? '
                         r'(-?[0-9.e+-]+|\+Inf|-Inf|NaN)$')


def _metrics(base_url: str) -> dict[str, float]:
    r = HTTP.get(f"{base_url}/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    values = {}
    for line in r.text.splitlines():
        if line.startswith("#"):
            assert line.startswith(("# HELP ", "# TYPE "))
            continue
        assert METRIC_LINE.match(line), line
        name, value = line.rsplit(" ", 1)
        values[name] = float(value)
    return values


def test_metrics(base_url, client):
    before = _metrics(base_url)
    no_eos = {"ignore_eos": True}           # 5 tokens each, whatever the random model says
    greedy_chat(client, chat_msgs(10), max_tokens=5, extra_body=no_eos)
    list(client.completions.create(model=MODEL, prompt=[9, 9, 9], max_tokens=5, stream=True,
                                   extra_body=no_eos))
    after = _metrics(base_url)
    assert after['localpaged_kv_blocks{state="total"}'] == 256
    states = ("in_use", "cached", "free")
    assert sum(after[f'localpaged_kv_blocks{{state="{s}"}}'] for s in states) == 256
    for name in ("localpaged_prefix_cache_queries_total", "localpaged_prefix_cache_hits_total",
                 "localpaged_num_preemptions_total", "localpaged_num_requests_running",
                 "localpaged_num_requests_waiting"):
        assert name in after
    assert after["localpaged_time_to_first_token_seconds_count"] \
        == before.get("localpaged_time_to_first_token_seconds_count", 0) + 2
    assert after["localpaged_decode_tokens_per_second_count"] \
        == before.get("localpaged_decode_tokens_per_second_count", 0) + 2
    assert after['localpaged_time_to_first_token_seconds_bucket{le="+Inf"}'] \
        == after["localpaged_time_to_first_token_seconds_count"]
    assert after["localpaged_generation_tokens_total"] \
        >= before.get("localpaged_generation_tokens_total", 0) + 10
    assert after["localpaged_prefix_cache_queries_total"] \
        > before.get("localpaged_prefix_cache_queries_total", 0)


# ---- RemoteChatBackend --------------------------------------------------------------------------
def test_remote_backend_columns(base_url, client):
    backend = RemoteChatBackend(base_url + "/v1")
    assert backend.model_name == MODEL and backend.supports_kv_stats is False
    assert backend.stats() is None and backend.prompt_blocks(chat_msgs(11)) == []
    gradio_msgs = [{"role": "user", "content": [{"type": "text", "text": words(11)}]}]
    params = [SamplingParams(max_tokens=10, temperature=0),
              SamplingParams(max_tokens=14, temperature=1.0, seed=9)]
    outs = list(backend.chat(gradio_msgs, params))
    assert len(outs) > 2                                   # streamed
    final = outs[-1]
    assert final.finished and not any(o.finished for o in outs[:-1])
    assert [o.index for o in final.outputs] == [0, 1]
    assert all(o.finish_reason == "length" for o in final.outputs)
    lengths = [[len(o.outputs[i].text) for o in outs] for i in range(2)]
    assert all(ls == sorted(ls) for ls in lengths)        # cumulative text
    alone = greedy_chat(client, [{"role": "user", "content": words(11)}], max_tokens=10)
    assert final.outputs[0].text == alone.choices[0].message.content
    assert final.metrics.num_generated_tokens == 24 and final.metrics.first_token_time


def test_remote_backend_n_samples_errors_and_cancel(base_url, engine, monkeypatch):
    backend = RemoteChatBackend(base_url + "/v1", model=MODEL)
    final = list(backend.chat(chat_msgs(12), [SamplingParams(n=2, max_tokens=6, seed=1)]))[-1]
    assert final.finished and len(final.outputs) == 2 and all(o.text for o in final.outputs)
    with pytest.raises(ValueError, match="context length"):
        backend.chat(chat_msgs(12), [SamplingParams(max_tokens=5000)])
    with pytest.raises(ValueError, match="does not exist"):
        RemoteChatBackend(base_url + "/v1", model="other").chat(chat_msgs(12), [SamplingParams()])
    # closing the iterator early closes the HTTP streams. Held steps make every "while" true:
    # step 1 until both requests are submitted (so step 2 runs both), step 2 until the close
    # (each reader closes its stream at its next chunk: step 2's), step 3 until both aborts.
    aborted = _record_aborts(engine, monkeypatch)
    long_greedy = SamplingParams(max_tokens=900, ignore_eos=True, temperature=0.0)
    start = len(engine.step_records())
    with gate(engine, 1) as submitted, gate(engine, 2) as before_close, \
            gate(engine, 3) as after_close:
        it = backend.chat(chat_msgs(13), [long_greedy] * 2)    # returns once both are queued
        submitted.release()
        next(it)
        before_close.wait_held()
        it.close()
        before_close.release()
        after_close.wait_held()
        poll(lambda: len(set(aborted)) == 2, "the server's aborts of both streams")
    wait_idle(engine)
    later = engine.step_records()[start + 3:]
    assert not any(set(aborted) & r.request_ids for r in later)     # none ran past step 3
    # abort(request_id) ends the stream with finish_reason "abort"
    it = backend.chat(chat_msgs(14), [SamplingParams(max_tokens=900, ignore_eos=True)],
                      request_id="ui-tab-1")
    next(it)
    backend.abort("ui-tab-1")
    last = list(it)[-1]
    assert last.finished and last.outputs[0].finish_reason == "abort"
    wait_idle(engine)


# ---- beside Gradio ------------------------------------------------------------------------------
def test_api_beside_gradio(engine):
    import gradio as gr                          # a dependency of the app (pyproject.toml)
    with gr.Blocks() as demo:
        gr.Markdown("hello")
    app = gr.mount_gradio_app(build_app(engine, MODEL), demo, path="/")
    url, server = start_server(engine, app=app)
    try:
        assert httpx.get(url + "/").status_code == 200
        c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        assert c.models.list().data[0].id == MODEL
        assert c.completions.create(model=MODEL, prompt=[1, 2], max_tokens=2).choices[0].text
        assert _post(url, "completions", {"model": "x", "prompt": "a"}).status_code == 404
        assert httpx.get(url + "/metrics").status_code == 200
    finally:
        stop_server(server)


# ---- a model switch in the UI moves the API along -----------------------------------------------


def test_ui_model_switch_moves_the_api(tiny_root, tiny_llama):
    from helpers.tiny_models import build
    llm = LLM(tiny_llama, num_kv_blocks=64)
    first, mm, server, c = serve_switchable(llm)
    try:
        assert [m.id for m in c.models.list().data] == [first.model_name]
        running = c.chat.completions.create(
            model=first.model_name, messages=chat_msgs(1), max_tokens=900, stream=True,
            extra_body={"ignore_eos": True})
        chunks = iter(running)
        with StepGate(llm.engine) as held:         # running on the old engine during the switch
            next(chunks)
            held.wait_held()
            job = mm.load(build("qwen3", tiny_root))
            assert job.done.wait(60) and job.error is None
        new = mm.backend
        assert new is not first and new.model_name != first.model_name
        assert [m.id for m in c.models.list().data] == [new.model_name]
        assert c.models.retrieve(new.model_name).id == new.model_name
        # the request running on the old engine was aborted, and the old engine shut down
        assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "abort"
        deadline = time.monotonic() + 10
        while not first.engine._stopped.is_set():
            assert time.monotonic() < deadline, "the old engine was kept alive"
            time.sleep(0.05)
        # so these answers come from the new engine
        out = c.completions.create(model=new.model_name, prompt=[1, 2, 3], max_tokens=4)
        assert out.model == new.model_name and out.usage.completion_tokens == 4
        reply = c.chat.completions.create(model=new.model_name, messages=chat_msgs(2),
                                          max_tokens=4, temperature=0)
        assert reply.model == new.model_name and reply.usage.completion_tokens == 4
        with pytest.raises(openai.NotFoundError):
            c.completions.create(model=first.model_name, prompt=[1, 2], max_tokens=2)
        wait_idle(new.engine)
    finally:
        stop_server(server)
        mm.backend.engine.shutdown()


def test_a_request_prepared_before_a_switch_is_refused(engine):
    served = ServedModel(engine, MODEL)
    before = served.current()
    served.swap(engine, "renamed")
    with pytest.raises(APIError) as err:
        served.submit(before, lambda: pytest.fail("submitted to the old model"))
    assert err.value.status == 503 and err.value.code == "model_switched"
    assert served.model_name == "renamed" and served.current().name == "renamed"
