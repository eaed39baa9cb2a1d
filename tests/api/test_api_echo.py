"""echo=true on /v1/completions: the prompt and its tokens' logprobs before the completion.

Checked through the official openai client and raw HTTP against a real server over the tiny
model: prompt logprobs equal log_softmax of transformers' logits; the completion part equals the
same request without echo; `max_tokens=0` returns the prompt alone; streamed chunks join into the
whole response; the payload lm-eval's
`local-completions` sends for log-likelihood requests is parsed as lm-eval parses it.
"""

from __future__ import annotations

import httpx
import pytest
import torch
from helpers.api_server import MODEL, words
from helpers.engine_helpers import hf_greedy, hf_model
# no block left held, and an openai client on this module's server (conftest.py: engine, base_url)
from test_api import _no_blocks_leak, client  # noqa: F401

ATOL = 2e-4


def hf_logprobs(path: str, ids: list[int]) -> torch.Tensor:
    """Row q - 1 is the distribution of token q (transformers' own forward pass)."""
    with torch.inference_mode():
        return torch.log_softmax(hf_model(path)(torch.tensor([ids])).logits[0].float(), -1)


def test_echo_with_logprobs_matches_transformers(client, engine, tiny_llama):
    text = words(3, 20)
    ids = engine.tokenizer.encode(text)
    kw = dict(model=MODEL, prompt=text, max_tokens=4, temperature=0, logprobs=2)
    plain = client.completions.create(**kw).choices[0]
    echoed = client.completions.create(echo=True, **kw)
    (choice,) = echoed.choices
    assert choice.text == text + plain.text
    lp = choice.logprobs
    P = len(ids)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == P + 4
    assert lp.tokens[:P] == [engine.tokenizer.decode([t]) for t in ids]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    ref = hf_logprobs(tiny_llama, ids)
    for q in range(1, P):
        assert lp.token_logprobs[q] == pytest.approx(ref[q - 1, ids[q]].item(), abs=ATOL)
        assert len(lp.top_logprobs[q]) >= 2
        assert max(lp.top_logprobs[q].values()) == pytest.approx(ref[q - 1].max().item(), abs=ATOL)
    # the completion's part is what the same request without echo returns
    assert lp.tokens[P:] == plain.logprobs.tokens
    assert lp.token_logprobs[P:] == pytest.approx(plain.logprobs.token_logprobs, abs=1e-6)
    assert lp.text_offset[:2] == [0, len(lp.tokens[0])]
    assert lp.text_offset[P:] == [len(text) + o for o in plain.logprobs.text_offset]
    assert echoed.usage.prompt_tokens == P and echoed.usage.completion_tokens == 4


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_lm_eval_loglikelihood_payload(base_url, tiny_llama, max_tokens):
    """lm-eval's local-completions sends token ids in a batch of one, echo, logprobs=1 and
    max_tokens=1 (older releases 0); it sums token_logprobs[ctxlen:] (dropping the generated
    token) and calls the continuation greedy when each logprob is its position's top one."""
    context = [1, 40, 41, 42, 43, 44]
    argmax = hf_greedy(tiny_llama, context, 3)
    for continuation in (argmax, [45, 46, 47] if argmax != [45, 46, 47] else [48, 49, 50]):
        ids = context + continuation
        body = {"model": MODEL, "prompt": [ids], "temperature": 0, "max_tokens": max_tokens,
                "logprobs": 1, "seed": 1234, "echo": True}
        r = httpx.post(f"{base_url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        (choice,) = r.json()["choices"]
        lp = choice["logprobs"]
        assert len(lp["token_logprobs"]) == len(ids) + max_tokens
        scored = lp["token_logprobs"][len(context):len(ids)]
        tops = lp["top_logprobs"][len(context):len(ids)]
        ref = hf_logprobs(tiny_llama, ids)
        rows = torch.arange(len(context) - 1, len(ids) - 1)
        expected = ref[rows, torch.tensor(continuation)]
        assert sum(scored) == pytest.approx(expected.sum().item(), abs=1e-3)
        is_greedy = all(tok == max(top.values()) for tok, top in zip(scored, tops))
        assert is_greedy == (continuation == argmax)
        if max_tokens == 0:
            assert r.json()["usage"]["completion_tokens"] == 0
            assert choice["finish_reason"] == "length"


def test_max_tokens_zero_echo_returns_prompt_only_for_each_choice(client):
    text = words(5, 9)
    r = client.completions.create(model=MODEL, prompt=text, max_tokens=0, echo=True, n=2,
                                  temperature=1.0, seed=3, logprobs=0)
    assert [c.text for c in r.choices] == [text, text]
    assert r.choices[0].logprobs.token_logprobs == r.choices[1].logprobs.token_logprobs
    assert len(r.choices[0].logprobs.tokens) == 9
    assert r.usage.completion_tokens == 0
    without = client.completions.create(model=MODEL, prompt=text, max_tokens=2, echo=True)
    assert without.choices[0].text.startswith(text) and without.choices[0].logprobs is None


@pytest.mark.parametrize("max_tokens", [3, 0])
def test_streamed_echo_equals_whole_response(client, max_tokens):
    """Streaming puts the prompt and its logprobs in each choice's first chunk; joined, the
    chunks equal the whole response (greedy, n = 2)."""
    kw = dict(model=MODEL, prompt=words(7, 15), max_tokens=max_tokens, temperature=0, n=2,
              logprobs=1, echo=True)
    whole = client.completions.create(**kw).choices
    text, reasons = {0: "", 1: ""}, {}
    tokens, lps, offsets = ({0: [], 1: []} for _ in range(3))
    for chunk in client.completions.create(stream=True, **kw):
        for c in chunk.choices:
            text[c.index] += c.text
            if c.logprobs:
                tokens[c.index] += c.logprobs.tokens
                lps[c.index] += c.logprobs.token_logprobs
                offsets[c.index] += c.logprobs.text_offset
            reasons[c.index] = c.finish_reason or reasons.get(c.index)
    for c in whole:
        assert text[c.index] == c.text
        assert tokens[c.index] == c.logprobs.tokens
        assert lps[c.index] == pytest.approx(c.logprobs.token_logprobs, abs=1e-6)
        assert offsets[c.index] == c.logprobs.text_offset
        assert reasons[c.index] == c.finish_reason == "length"


@pytest.mark.parametrize("changes,param", [
    ({"max_tokens": 0}, "max_tokens"),                       # 0 only with echo
    ({"echo": True, "logprobs": 21}, "logprobs"),
    ({"echo": True, "logprobs": -1}, "logprobs"),
    ({"echo": True, "max_tokens": -1}, "max_tokens"),
])
def test_bad_echo_requests(base_url, changes, param):
    body = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 2, **changes}
    r = httpx.post(f"{base_url}/v1/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
