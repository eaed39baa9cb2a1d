"""API extensions over a real server (the tiny Llama): continue_final_message /
add_generation_prompt (the continued reply equals the uninterrupted one), context_overflow
("error" never drops silently, "drop_oldest" says how many messages it dropped); prefill
progress on engine and async-engine outputs (the API stream stays as before); --max-model-len."""

from __future__ import annotations

import json

import httpx
import pytest
from helpers.api_server import MODEL, make_engine, start_server, stop_server, wait_idle, words
from helpers.engine_helpers import greedy

from localpaged import LLM
from localpaged.chat.context_window import ContextWindow
from localpaged.cli import parse_args
from localpaged.engine.async_engine import AsyncEngine


@pytest.fixture(scope="module")
def served(tiny_llama):
    engine = make_engine(tiny_llama)
    url, server = start_server(engine)
    yield engine, httpx.Client(base_url=url + "/v1", timeout=60)
    stop_server(server)
    engine.shutdown()


def _chat(client, messages, **kw):
    body = {"model": MODEL, "messages": messages, "temperature": 0, "ignore_eos": True} | kw
    return client.post("/chat/completions", json=body)


def test_continue_final_message(served):
    """The server continues the assistant message in place: its prompt is transformers' own
    continue_final_message rendering, and the reply equals a completion of those token ids."""
    engine, client = served
    msgs = [{"role": "user", "content": words(1, 30)},
            {"role": "assistant", "content": words(2, 10)}]
    oracle = list(engine.tokenizer.apply_chat_template(
        msgs, continue_final_message=True, tokenize=True, return_dict=False))
    plain = client.post("/completions", json={"model": MODEL, "prompt": oracle, "max_tokens": 12,
                                              "temperature": 0, "ignore_eos": True}).json()
    cont = _chat(client, msgs, max_tokens=12, add_generation_prompt=False,
                 continue_final_message=True).json()
    assert cont["choices"][0]["message"]["content"] == plain["choices"][0]["text"]
    assert cont["usage"]["prompt_tokens"] == len(oracle)
    assert cont["usage"]["prompt_tokens_details"]["cached_tokens"] > 0   # the prefix cache
    assert "dropped_messages" not in cont                   # no extension unless asked
    fresh = _chat(client, msgs, max_tokens=1).json()        # default: a new assistant turn
    assert fresh["usage"]["prompt_tokens"] == len(engine.tokenizer.apply_chat_template(
        msgs, add_generation_prompt=True, tokenize=True, return_dict=False))
    wait_idle(engine)


def test_template_flag_errors(served):
    _, client = served
    msgs = [{"role": "user", "content": words(2)}, {"role": "assistant", "content": words(3)}]
    r = _chat(client, msgs, continue_final_message=True)    # add_generation_prompt left true
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message"
    r = _chat(client, msgs[:1], add_generation_prompt=False, continue_final_message=True)
    assert r.status_code == 400 and "'user'" in r.json()["error"]["message"]
    r = _chat(client, msgs[:1], context_overflow="truncate")
    assert r.status_code == 400 and "context_overflow" in r.json()["error"]["param"]


def _long_chat(turns: int) -> list[dict]:
    msgs = [{"role": "system", "content": words(99, 4)}]
    for i in range(turns):
        msgs += [{"role": "user", "content": words(i, 40)},
                 {"role": "assistant", "content": words(50 + i, 40)}]
    return msgs + [{"role": "user", "content": words(7, 10)}]


def test_context_overflow(served):
    engine, client = served
    limit = engine.context_limit()                     # 1024: the tiny model's context
    msgs = _long_chat(12)                              # about 12 * 2 * 50 = 1200 tokens
    assert ContextWindow(engine.tokenizer, limit).count_tokens(msgs) > limit
    r = _chat(client, msgs, max_tokens=8)                       # no extension: refused as before
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = _chat(client, msgs, max_tokens=8, context_overflow="error")
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "context_length_exceeded"
    assert "over the context limit of 1024" in err["message"]

    r = _chat(client, msgs, max_tokens=8, context_overflow="drop_oldest")
    assert r.status_code == 200, r.text
    body = r.json()
    fit = ContextWindow(engine.tokenizer, limit).fit(msgs, 8)
    assert body["dropped_messages"] == fit.num_dropped > 0 and fit.num_dropped % 2 == 0
    assert body["usage"]["prompt_tokens"] == fit.num_tokens
    # The reply equals a plain request for exactly the kept messages.
    kept = _chat(client, fit.messages, max_tokens=8).json()
    assert body["choices"][0]["message"]["content"] == kept["choices"][0]["message"]["content"]

    with client.stream("POST", "/chat/completions", json={
            "model": MODEL, "messages": msgs, "max_tokens": 4, "stream": True,
            "context_overflow": "drop_oldest"}) as resp:
        chunks = [json.loads(line[6:]) for line in resp.iter_lines()
                  if line.startswith("data: {")]
    assert chunks[0]["dropped_messages"] == fit.num_dropped
    assert all("dropped_messages" not in c for c in chunks[1:])
    wait_idle(engine)


def test_prefill_progress(tiny_llama):
    """A 200-token prompt prefilled in chunks of 64 reports 64, 128, 192 of 200 before the first
    token, on the engine and on an AsyncEngine stream; finished outputs report the whole."""
    llm = LLM(tiny_llama, num_kv_blocks=64, max_num_batched_tokens=64)
    prompt = [1] + [3 + i % 500 for i in range(199)]
    engine = llm.engine
    rid = engine.add_request(None, prompt, greedy(3))
    seen = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.request_id == rid
            seen.append((out.num_computed_prompt_tokens, len(out.outputs[0].token_ids),
                         out.prefilling))
    assert [s for s in seen if s[2]] == [(64, 0, True), (128, 0, True), (192, 0, True)]
    assert seen[3:] == [(200, 1, False), (200, 2, False), (200, 3, False)]

    def streamed_progress(ids: list[int]) -> list[int]:
        async_engine = AsyncEngine(engine)
        try:
            return [o.num_computed_prompt_tokens for o in
                    async_engine.submit(ids, greedy(2)) if o.prefilling]
        finally:
            async_engine.shutdown()

    # Again: 192 tokens (12 full blocks) come from the prefix cache, the rest in one chunk.
    assert streamed_progress(prompt) == [] and llm.stats().prefix_cache_hits >= 192
    assert streamed_progress([2] + prompt[1:]) == [64, 128, 192]


def _stream_texts(client: httpx.Client, prompt: list[int]) -> list[str]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0,
            "ignore_eos": True, "stream": True}
    with client.stream("POST", "/completions", json=body) as resp:
        return [json.loads(line[6:])["choices"][0]["text"] for line in resp.iter_lines()
                if line.startswith("data: {")]


def test_api_stream_unchanged_by_chunked_prefill(served, tiny_llama):
    """Progress outputs add no chunk to an API stream: a server prefilling in chunks of 64
    streams the same text as one prefilling the prompt at once, in no more chunks than tokens."""
    _, whole_client = served
    chunked = AsyncEngine(LLM(tiny_llama, num_kv_blocks=64, max_num_batched_tokens=64).engine)
    url, server = start_server(chunked)
    try:
        prompt = [1] + [3 + (7 * i) % 500 for i in range(199)]
        texts = _stream_texts(httpx.Client(base_url=url + "/v1", timeout=60), prompt)
        # a slow reader gets tokens merged into fewer chunks, so compare the text and that no
        # chunk is empty (one per progress output would be)
        assert "".join(texts) == "".join(_stream_texts(whole_client, prompt))
        assert all(texts) and 1 <= len(texts) <= 4
    finally:
        stop_server(server)
        chunked.shutdown()


def test_max_model_len_flag(tiny_llama):
    assert parse_args(["--max-model-len", "2048"]).max_model_len == 2048
    assert parse_args([]).max_model_len is None
    with pytest.raises(ValueError, match="max_model_len must be >= 2"):
        LLM(tiny_llama, max_model_len=1)


def test_return_token_ids_and_a_completion_forked_at_a_token(served, tiny_llama):
    """return_token_ids gives the prompt's and the reply's token ids (whole and streamed alike),
    return_tokens_as_token_ids names logprobs' tokens by id; a completion whose prompt is the
    prompt, the reply's first t tokens and one of the alternatives logprobs listed at t gets all
    but its last token from the prefix cache (the block it leaves mid-way copied), and the
    tokens of that prompt on an engine with nothing cached."""
    engine, client = served
    messages = [{"role": "user", "content": words(4, 40)}]
    body = {"model": MODEL, "messages": messages, "temperature": 0, "ignore_eos": True,
            "max_tokens": 30, "logprobs": True, "top_logprobs": 3, "return_token_ids": True,
            "return_tokens_as_token_ids": True}
    whole = client.post("/chat/completions", json=body).json()
    prompt_ids, reply = whole["prompt_token_ids"], whole["choices"][0]["token_ids"]
    assert prompt_ids == list(engine.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False))
    content = whole["choices"][0]["logprobs"]["content"]
    assert len(reply) == 30 and [c["token"] for c in content] == [f"token_id:{t}" for t in reply]
    with client.stream("POST", "/chat/completions", json=body | {"stream": True}) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: {")]
    assert chunks[0]["prompt_token_ids"] == prompt_ids
    assert [t for c in chunks for ch in c["choices"] for t in ch.get("token_ids", [])] == reply

    t = next(t for t in range(3, 25) if 3 <= (len(prompt_ids) + t) % 16 <= 12)   # mid-block
    alt = next(int(e["token"].split(":")[1]) for e in content[t]["top_logprobs"]
               if e["token"] != content[t]["token"])
    forked = prompt_ids + reply[:t] + [alt]
    done = client.post("/completions", json={
        "model": MODEL, "prompt": forked, "max_tokens": 8, "temperature": 0,
        "ignore_eos": True, "return_token_ids": True}).json()
    assert done["choices"][0]["prompt_token_ids"] == forked
    assert done["usage"]["prompt_tokens_details"]["cached_tokens"] == len(forked) - 1
    fresh = LLM(tiny_llama, enable_prefix_caching=False).generate([forked], greedy(8))[0]
    assert done["choices"][0]["token_ids"] == fresh.outputs[0].token_ids
    wait_idle(engine)


def test_prune_extension(served):
    """`prune` over the API: with margin 0 all but the best branch end at the first checkpoint,
    as the engine's own request with the same rule; streamed, each pruned choice's last chunk
    says so; n = 1 with prune is a 400 naming it; a bad rule is a 400 naming the field."""
    from localpaged import SamplingParams
    from localpaged.core.sampling_params import PruneRule

    engine, client = served
    prompt = words(5, 20)
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 24, "temperature": 1.0, "seed": 4,
            "ignore_eos": True, "n": 3, "prune": {"margin": 0, "after": 6, "every": 4}}
    r = client.post("/completions", json=body).json()
    pruned = [c for c in r["choices"] if "pruned" in c]
    assert len(pruned) == 2 and all(c["finish_reason"] == "abort" for c in pruned)
    assert all(c["pruned"]["at"] == 6 and c["pruned"]["score"] < c["pruned"]["best"]
               for c in pruned)
    out = engine.generate(prompt, SamplingParams(         # the engine's own request
        n=3, temperature=1.0, seed=4, max_tokens=24, ignore_eos=True,
        prune=PruneRule(margin=0, after=6, every=4)))
    final = list(out)[-1]
    assert [c["text"] for c in r["choices"]] == [o.text for o in final.outputs]
    streamed = client.post("/completions", json=body | {"stream": True})
    chunks = [json.loads(line[6:]) for line in streamed.text.splitlines()
              if line.startswith("data: {")]
    ends = [c for chunk in chunks for c in chunk["choices"] if c.get("finish_reason")]
    assert sorted(c["index"] for c in ends if "pruned" in c) == \
        sorted(c["index"] for c in r["choices"] if "pruned" in c)
    one = client.post("/completions", json=body | {"n": 1})
    assert one.status_code == 400 and "prune" in one.json()["error"]["message"]
    bad = client.post("/completions", json=body | {"prune": {"margin": -1}})
    assert bad.status_code == 400 and "margin" in json.dumps(bad.json())
    wait_idle(engine)
