"""The thinking budget in the engine (core/reasoning_budget.py), on a tiny model that never closes
its reasoning on its own (helpers/reasoning_models.py).

Oracle: transformers' greedy continuation. With a budget of B, a reply is the model's own first
B reasoning tokens, then the forced closing marker and transition, then transformers' greedy
continuation of everything before it. Without a budget (markers given or not) the tokens equal
transformers' and the engine's without markers. Parallel samples, beams, preemption (recompute
and swap) and speculation give the forced end at the same place and the same tokens as a
lone unpressured run.
"""

import pytest
from helpers.engine_helpers import hf_greedy
from helpers.reasoning_models import (
    END_THINK,
    FORCED,
    NEWLINE,
    QUESTION,
    THINK,
    build_thinker,
    hf_budgeted,
)

from localpaged import LLM, SamplingParams
from localpaged.core.reasoning_budget import ReasoningMarkers, ReasoningState
from localpaged.core.request import BeamParams
from localpaged.core.speculation import StepCost

MARKERS = ReasoningMarkers((THINK,), (END_THINK,), (NEWLINE, NEWLINE))


@pytest.fixture(scope="module")
def thinker(tiny_root):
    return build_thinker(tiny_root)


@pytest.fixture(scope="module")
def prompt(thinker):
    llm = LLM(thinker, num_kv_blocks=64)
    ids = llm.apply_chat_template([{"role": "user", "content": QUESTION}])
    assert ids[-1] == THINK             # the template opens the reasoning
    return ids


def greedy(max_tokens=40, budget=None, markers=MARKERS, **kw):
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, reasoning_markers=markers,
                          reasoning_budget=budget, **kw)


def test_without_a_budget_the_model_never_closes_and_tokens_are_unchanged(thinker, prompt):
    llm = LLM(thinker, num_kv_blocks=64)
    plain = llm.generate([prompt], greedy(60, markers=None))[0].outputs[0]
    counted = llm.generate([prompt], greedy(60))[0].outputs[0]
    assert plain.token_ids == counted.token_ids == hf_greedy(thinker, prompt, 60)
    assert END_THINK not in plain.token_ids            # the premise: it thinks forever
    assert plain.reasoning_tokens == 0 and counted.reasoning_tokens == 60


@pytest.mark.parametrize("budget", [0, 1, 12])
def test_a_spent_budget_closes_the_reasoning_and_the_answer_follows(thinker, prompt, budget):
    llm = LLM(thinker, num_kv_blocks=64, debug_checks=True)
    out = llm.generate([prompt], greedy(40, budget))[0].outputs[0]
    assert out.token_ids == hf_budgeted(thinker, prompt, budget, 40)
    assert out.reasoning_tokens == budget
    assert "</think>" in out.text and out.text.split("</think>")[1].strip()


def test_parallel_samples_each_close_after_their_budget(thinker, prompt):
    llm = LLM(thinker, num_kv_blocks=64, debug_checks=True)
    params = dict(max_tokens=30, temperature=1.0, seed=7, reasoning_markers=MARKERS,
                  reasoning_budget=6)
    pair = llm.generate([prompt], SamplingParams(n=2, **params))[0].outputs
    alone = llm.generate([prompt], SamplingParams(n=1, **params))[0].outputs[0]
    assert pair[0].token_ids == alone.token_ids
    assert pair[0].token_ids != pair[1].token_ids
    for o in pair:
        assert o.token_ids[6:9] == FORCED and o.reasoning_tokens == 6


def test_beams_close_after_the_budget(thinker, prompt):
    llm = LLM(thinker, num_kv_blocks=128, debug_checks=True)
    group = llm.engine.make_group(prompt, greedy(16, 5), beam=BeamParams(3))
    for hyp in llm._run([group], False)[0].outputs:
        assert hyp.token_ids[5:8] == FORCED
        assert hyp.reasoning_tokens == 5                 # counted as a sample's are


def test_beams_without_a_budget_count_every_reasoning_token(thinker, prompt):
    llm = LLM(thinker, num_kv_blocks=128)
    group = llm.engine.make_group(prompt, greedy(12), beam=BeamParams(2))
    for hyp in llm._run([group], False)[0].outputs:
        assert END_THINK not in hyp.token_ids and hyp.reasoning_tokens == len(hyp.token_ids)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_keeps_the_budget_state(thinker, prompt, mode):
    batch = [prompt + [3 + i] * (8 + 5 * i) + [NEWLINE] for i in range(4)]
    batch = [p[:len(prompt) - 1] + p[len(prompt):] + [THINK] for p in batch]   # still opened
    params = [greedy(48, 10 + 3 * i, ignore_eos=True) for i in range(len(batch))]
    roomy = LLM(thinker, num_kv_blocks=256)
    want = [o.outputs[0].token_ids for o in roomy.generate(batch, params)]
    tight = LLM(thinker, num_kv_blocks=14, block_size=8, preemption_mode=mode,
                swap_space_gb=0.01, debug_checks=True)
    got = [o.outputs[0].token_ids for o in tight.generate(batch, params)]
    assert tight.stats().num_preemptions > 0
    assert got == want
    for i, ids in enumerate(got):
        assert ids[10 + 3 * i:13 + 3 * i] == FORCED


def test_speculation_never_drafts_past_the_budget(thinker, prompt, monkeypatch):
    monkeypatch.setattr(StepCost, "observe", lambda *args, **kwargs: None)   # always draft
    params = greedy(60, 20)
    base = LLM(thinker, num_kv_blocks=64).generate([prompt], params)[0].outputs[0]
    spec_llm = LLM(thinker, num_kv_blocks=64, speculation="ngram", debug_checks=True)
    spec = spec_llm.generate([prompt], params)[0].outputs[0]
    assert spec.token_ids == base.token_ids == hf_budgeted(thinker, prompt, 20, 60)
    assert spec.accepted_draft_tokens > 0                # the model's loops were drafted


def test_the_state_follows_tokens_and_cuts_drafts_before_a_forced_position():
    state = ReasoningState.start(MARKERS, 2, [9, THINK])
    assert state.inside and state.forced() is None
    assert state.check_draft([7, 7, 7]) == 1        # the position after 2 tokens is forced
    for t in (7, 7):
        state.advance(t)
    assert state.forced() == END_THINK and state.check_draft([END_THINK]) == 0
    for t in FORCED:
        assert state.forced() == t
        state.advance(t)
    assert state.forced() is None and not state.inside and state.count == 2
    closed = ReasoningState.start(MARKERS, 0, [THINK, 5, END_THINK])
    assert not closed.inside and closed.forced() is None
    two = ReasoningMarkers((THINK,), (40, 41))      # a closing marker of two tokens
    s = ReasoningState.start(two, None, [THINK])
    for t in (5, 40, 41, 6):
        s.advance(t)
    assert s.count == 1 and not s.inside
