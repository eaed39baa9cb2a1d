"""Continue: a reply stopped early and resumed from its token ids equals one uninterrupted greedy
reply (transformers' generate is the oracle), with its prefix served from the prefix cache; and
the finish details tell a full KV cache from the length limit."""

import pytest
from helpers.engine_helpers import greedy, hf_greedy, prompts

from localpaged import LLM
from localpaged.chat.continuation import (
    continue_request,
    continued_text,
    stop_explanation,
)

BLOCK = 16


def _cached_prefix(num_tokens: int) -> int:
    """Tokens of a prompt the prefix cache can serve: its full blocks, short of the last token
    (whose K/V a finished reply never computed)."""
    return (num_tokens - 1) // BLOCK * BLOCK


@pytest.mark.parametrize("stop_at", [5, 19])
def test_stop_after_k_then_continue_equals_uninterrupted(tiny_llama, stop_at):
    llm = LLM(tiny_llama, num_kv_blocks=64, block_size=BLOCK)
    prompt = prompts(1, seed=11, lo=40, hi=41)[0]
    total = 30
    expected = hf_greedy(tiny_llama, prompt, total)

    first = llm.generate([prompt], greedy(stop_at))[0].outputs[0]
    assert first.token_ids == expected[:stop_at]
    assert first.finish_detail == "max_tokens" and first.can_continue
    assert stop_explanation(first) == "stopped: the reply reached its token limit (max_tokens)"

    req = continue_request(prompt, first.token_ids, greedy(total))
    assert req.params.max_tokens == total - stop_at
    hits_before = llm.stats().prefix_cache_hits
    out = llm.generate([req.prompt_token_ids], req.params)[0]
    assert first.token_ids + out.outputs[0].token_ids == expected
    cached = _cached_prefix(len(prompt) + stop_at)
    assert out.metrics.num_cached_tokens == cached
    assert llm.stats().prefix_cache_hits - hits_before == cached
    text = continued_text(llm.tokenizer, first.token_ids, out.outputs[0].token_ids)
    assert text == llm.tokenizer.decode(expected, skip_special_tokens=True)


def test_abort_mid_reply_then_continue(tiny_llama):
    """The Stop button: abort after some steps, continue from whatever was generated."""
    llm = LLM(tiny_llama, num_kv_blocks=64, block_size=BLOCK)
    prompt = prompts(1, seed=12, lo=35, hi=36)[0]
    expected = hf_greedy(tiny_llama, prompt, 24)
    engine = llm.engine
    rid = engine.add_request(None, prompt, greedy(24))
    for _ in range(8):                         # 1 prefill step + 7 decode steps
        engine.step()
    stopped = engine.abort(rid).outputs[0]
    assert stopped.finish_reason == "abort" and stopped.finish_detail == "abort"
    assert len(stopped.token_ids) == 8 and stopped.can_continue
    req = continue_request(prompt, stopped.token_ids, greedy(24))
    out = llm.generate([req.prompt_token_ids], req.params)[0]
    assert stopped.token_ids + out.outputs[0].token_ids == expected
    assert out.metrics.num_cached_tokens == _cached_prefix(len(prompt) + 8)


def test_finish_details_tell_kv_cache_full_from_length(tiny_llama):
    # 4 blocks of 16 = 64 tokens of KV cache; the model's context is 1024.
    llm = LLM(tiny_llama, num_kv_blocks=4, block_size=BLOCK)
    assert llm.engine.kv_capacity_tokens == 64
    assert llm.engine.context_limit() == 64
    prompt = prompts(1, seed=13, lo=40, hi=41)[0]
    full = llm.generate([prompt], greedy(100))[0].outputs[0]
    assert full.finish_reason == "length"           # OpenAI's value is kept
    assert full.finish_detail == "kv_cache_full" and full.can_continue
    assert len(prompt) + len(full.token_ids) == 64 + 1     # the last token needs no K/V slot
    assert full.token_ids == hf_greedy(tiny_llama, prompt, len(full.token_ids))
    assert stop_explanation(full) == "stopped: the KV cache was full"
    with pytest.raises(ValueError, match="fill the context limit of 64 tokens"):
        continue_request(prompt, full.token_ids, greedy(100), llm.engine.context_limit())

    limited = llm.generate([prompt], greedy(3))[0].outputs[0]
    assert (limited.finish_reason, limited.finish_detail) == ("length", "max_tokens")

    capped = LLM(tiny_llama, num_kv_blocks=64, block_size=BLOCK, max_model_len=50)
    assert capped.engine.context_limit() == 50
    out = capped.generate([prompt], greedy(None))[0].outputs[0]
    assert (out.finish_reason, out.finish_detail) == ("length", "max_model_len")
    assert len(prompt) + len(out.token_ids) == 50


def test_natural_end_cannot_continue(tiny_llama):
    llm = LLM(tiny_llama, num_kv_blocks=64, block_size=BLOCK)
    prompt = prompts(1, seed=14, lo=20, hi=21)[0]
    expected = hf_greedy(tiny_llama, prompt, 6)
    stop_id = expected[3]
    out = llm.generate([prompt], greedy(20, stop_token_ids=[stop_id]))[0].outputs[0]
    assert out.token_ids == expected[:expected.index(stop_id) + 1]
    assert out.finish_detail == "stop_token" and not out.can_continue
    assert stop_explanation(out) is None


def test_continue_request_bad_input():
    with pytest.raises(ValueError, match="max_tokens is 5 and the reply already has 5"):
        continue_request([1, 2], [3, 4, 5, 6, 7], greedy(5))
    with pytest.raises(ValueError, match="reply_token_ids must not be empty"):
        continue_request([1, 2], [], greedy(5))
    with pytest.raises(ValueError, match="prompt_token_ids must not be empty"):
        continue_request([], [3], greedy(5))
    assert continue_request([1], [2], greedy(None)).params.max_tokens is None


def test_streamed_outputs_are_snapshots(tiny_llama):
    """An output handed out mid-reply keeps its logprobs when the engine goes on (they used to
    alias the sequence's growing list, so an API stream re-sent tokens)."""
    llm = LLM(tiny_llama, num_kv_blocks=64, block_size=BLOCK)
    engine = llm.engine
    engine.add_request(None, prompts(1, seed=15, lo=10, hi=11)[0], greedy(6, logprobs=1))
    seen = []
    while engine.has_unfinished_requests():
        seen += [o.outputs[0] for o in engine.step()]
    assert [len(o.logprobs) for o in seen] == [len(o.token_ids) for o in seen] == [1, 2, 3, 4, 5, 6]
