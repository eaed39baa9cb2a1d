"""Sampler semantics on hand-made logits, and stop strings / logprobs through the engine."""

import math

import torch
from helpers.engine_helpers import greedy

from localpaged import LLM, SamplingParams
from localpaged.core.request import Sequence
from localpaged.engine.sampler import sample


def draw_many(logits, params, n=400, tokens=(0,)):
    seen = set()
    for i in range(n):
        seq = Sequence(list(tokens), len(tokens), 0, torch.Generator().manual_seed(i))
        seen.add(sample(logits[None], [seq], [params])[0].token_id)
    return seen


LOGITS = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.06, 0.04]))


def test_filters_keep_exactly_the_allowed_tokens():
    assert draw_many(LOGITS, SamplingParams(temperature=1.0)) == {0, 1, 2, 3, 4}
    assert draw_many(LOGITS, SamplingParams(temperature=1.0, top_k=2)) == {0, 1}
    assert draw_many(LOGITS, SamplingParams(temperature=1.0, top_p=0.65)) == {0, 1}
    assert draw_many(LOGITS, SamplingParams(temperature=1.0, top_p=0.75)) == {0, 1, 2}
    assert draw_many(LOGITS, SamplingParams(temperature=1.0, min_p=0.6)) == {0, 1}
    assert draw_many(LOGITS, SamplingParams(temperature=0.0)) == {0}


def test_sampling_frequencies_follow_the_distribution():
    counts = torch.zeros(5)
    g = torch.Generator().manual_seed(0)
    seq = Sequence([0], 1, 0, g)
    for _ in range(3000):
        counts[sample(LOGITS[None], [seq], [SamplingParams(temperature=1.0)])[0].token_id] += 1
    freq = counts / counts.sum()
    assert torch.allclose(freq, LOGITS.exp(), atol=0.03)


def test_penalties():
    logits = torch.tensor([2.0, 1.9, -1.0])
    seq = Sequence([0, 0, 0], 1, 0, None)          # prompt [0], output [0, 0]
    assert sample(logits[None], [seq], [SamplingParams(temperature=0)])[0].token_id == 0
    assert sample(logits[None], [seq], [SamplingParams(temperature=0, repetition_penalty=1.5)])[0].token_id == 1
    assert sample(logits[None], [seq], [SamplingParams(temperature=0, frequency_penalty=0.1)])[0].token_id == 1
    assert sample(logits[None], [seq], [SamplingParams(temperature=0, presence_penalty=0.2)])[0].token_id == 1


def test_logprobs_and_stop_strings(tiny_llama):
    llm = LLM(tiny_llama, num_kv_blocks=64)
    full = llm.generate([[1, 40, 41]], greedy(12, logprobs=3))[0].outputs[0]
    assert len(full.logprobs) == 12
    for lp in full.logprobs:
        assert len(lp.top) == 3 and lp.logprob <= 0 and max(lp.top.values()) >= lp.logprob - 1e-6
    assert math.isclose(full.cumulative_logprob, sum(lp.logprob for lp in full.logprobs), rel_tol=1e-5)
    # A stop string spanning two tokens' text ends the output before it.
    stop = full.text[3:5]
    cut = llm.generate([[1, 40, 41]], greedy(12, stop=[stop]))[0].outputs[0]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert cut.text == full.text[:full.text.index(stop)]
    kept = llm.generate([[1, 40, 41]], greedy(12, stop=[stop], include_stop_str_in_output=True))[0]
    assert kept.outputs[0].text == full.text[:full.text.index(stop) + len(stop)]
    # A stop token id ends it too, and is reported.
    tid = full.token_ids[4]
    by_id = llm.generate([[1, 40, 41]], greedy(12, stop_token_ids=[tid]))[0].outputs[0]
    assert by_id.finish_reason == "stop" and by_id.stop_reason == tid
    assert by_id.token_ids == full.token_ids[:full.token_ids.index(tid) + 1]
