"""Speculative decoding with n-gram drafts (core/speculation.py; verification: engine/sampler.py
verify, engine/step_decisions.py; bookkeeping: scheduler and KV cache manager).

The gold standard is decoding without speculation: greedy tokens equal token for token (and
transformers' own greedy output), with every block invariant checked after every step
(debug_checks), under preemption by recompute and swap, with stop rules landing inside a draft,
parallel samples and a later prefix-cache hit on blocks that drafts wrote. Sampled outputs keep
their distribution: the rejection rule is checked by drawing against the exact probabilities.
"""

from __future__ import annotations

import pytest
import torch

from helpers.engine_helpers import hf_greedy
from localpaged import LLM, SamplingParams
from localpaged.core.request import Sequence
from localpaged.core.speculation import (CONTROL_EVERY, PRIOR_ROW_COST, PROBE_EVERY, DraftState, StepCost,
                                         propose, propose_from)
from localpaged.engine.sampler import _filtered_probs, verify

# Prompts whose continuations repeat what they hold (so drafts get accepted), and one that
# does not; the tiny model's greedy output falls into loops, which drafts then follow.
PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12] * 6, [3, 4, 3, 4, 3, 4, 20, 21, 22] * 3, list(range(30, 80))]


@pytest.fixture
def always_draft(monkeypatch):
    """Drafting never stops for cost (StepCost judges wall time, which a shared test machine
    makes noisy): the tests that count drafts see every draft the rules allow."""
    monkeypatch.setattr(StepCost, "observe", lambda *args, **kwargs: None)


def greedy(max_tokens: int = 60, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=2, **kw)


def run(path, prompts, params, **engine):
    llm = LLM(path, debug_checks=True, record_steps=True, **engine)
    outs = llm.generate(prompts, params)
    return llm, outs


def tokens(outs):
    return [[o.token_ids for o in out.outputs] for out in outs]


def test_propose_takes_the_latest_longest_match():
    assert propose([1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3], 2) == [7, 1]       # latest of two
    assert propose([5, 2, 3, 8, 1, 2, 3, 6, 4, 2, 3], 3) == [6, 4, 2]    # "2 3": its latest
    assert propose([1, 2, 3, 4, 9, 9, 2, 3, 4, 5, 1, 2, 3, 4], 2) == [9, 9]   # 4-gram first
    assert propose([1, 2, 3, 4, 5], 3) == []                             # nothing repeats
    assert propose([1, 2, 1, 2], 5) == [1, 2]                            # what there is
    assert propose([1, 2, 1, 2], 0) == []


def cost_of(row: float, steps: int = 60) -> StepCost:
    """A StepCost that saw plain steps of 10 ms and drafted steps where a draft row costs `row`
    plain steps (draft lengths 2 to 9)."""
    cost = StepCost()
    cost.observe(0.010, 0)
    for i in range(steps):
        d = 2 + i % 8
        cost.observe(0.010 * (1 + row * d), d)
    return cost


def test_a_copy_keeps_copying_from_where_it_was():
    """Lines that share all but one token (a pasted function's `if orders[i]` lines): the latest
    occurrence of the suffix drafts the line just written again; after a draft copied from
    position p and had a tokens accepted, the occurrence at or after p + a drafts the next line."""
    def line(i):
        return [7, 8, 9, 1, 2, i, 5]
    prompt = line(10) + line(11) + line(12)
    tokens = prompt + line(10) + [7, 8, 9, 1, 2]             # the first line copied, the second begun
    assert propose(tokens, 2) == [10, 5]                     # the latest "8 9 1 2": the reply's own
    draft, at = propose_from(tokens, 2, after=12)            # was copying the prompt's second line
    assert (draft, at) == ([11, 5], 12)
    state = DraftState(k_max=4, draft_at=at)
    state.update(2, 2)
    assert state.copy_from == 14                             # the next copy starts after that line
    more = tokens + [11, 5, 7, 8, 9, 1, 2]
    assert propose_from(more, 2, after=state.copy_from) == ([12, 5], 19)
    assert propose_from(tokens, 2, after=100) == ([10, 5], 26)   # none after it: the latest


def test_the_step_cost_is_measured_per_draft_row():
    cost = StepCost()
    assert cost.ratio(4) == pytest.approx(1 + 4 * PRIOR_ROW_COST)      # until measured
    assert [cost.allows() for _ in range(CONTROL_EVERY)].count(False) == 1
    cost.observe(0.030, 4)                                # no plain step seen yet: not counted
    assert cost.ratio(4) == pytest.approx(1 + 4 * PRIOR_ROW_COST)
    cost = cost_of(0.1)
    assert [cost.ratio(d) for d in (1, 4, 16)] == pytest.approx([1.1, 1.4, 2.6], rel=1e-2)
    cost.observe(0.005, 3)                                # faster than a plain step: a row is free
    assert 0 < cost.row < 0.1 and cost.ratio(1) >= 1.0


def test_draft_length_follows_acceptance_and_cost():
    cheap = cost_of(0.05)                                 # weights' reads bound a step
    state = DraftState(k_max=16)
    for _ in range(6):
        state.update(8, 8)
    assert state.rate > 0.95 and state.next_k(cheap) == 16     # a sibling's reply, copied
    for _ in range(12):
        state.update(8, 1)                                # one token kept of each draft
    assert state.rate < 0.6 and 1 <= state.next_k(cheap) <= 4
    # the draft with the most tokens per cost, against every other length
    best = max(range(1, 17), key=lambda k: state.expected(k) / cheap.ratio(k))
    assert state.next_k(cheap) == best
    dear = cost_of(1.0)                                   # a row costs a whole plain step
    sure = DraftState(k_max=8, successes=9, trials=10)
    assert [sure.next_k(dear) for _ in range(PROBE_EVERY)].count(0) == PROBE_EVERY - 1  # probes
    for _ in range(8):
        state.update(2, 0)
    assert state.rate < 0.2 and [state.next_k(cheap) for _ in range(16)].count(0) == 15


def test_the_expected_tokens_of_a_draft():
    state = DraftState(k_max=4, successes=1, trials=2)    # rate 0.5
    assert state.expected(1) == pytest.approx(1.5) and state.expected(3) == pytest.approx(1.875)
    assert DraftState(k_max=4, successes=5, trials=5).expected(4) == pytest.approx(5.0)


def test_greedy_equals_decoding_without_speculation_and_transformers(tiny_llama, always_draft):
    base_llm, base = run(tiny_llama, PROMPTS, greedy(), num_kv_blocks=64)
    spec_llm, spec = run(tiny_llama, PROMPTS, greedy(), num_kv_blocks=64, speculation="ngram")
    assert tokens(spec) == tokens(base)
    assert spec[0].outputs[0].token_ids == hf_greedy(tiny_llama, PROMPTS[0], 60)
    for a, b in zip(base, spec):
        lp_a = [t.logprob for t in a.outputs[0].logprobs]
        lp_b = [t.logprob for t in b.outputs[0].logprobs]
        assert max(abs(x - y) for x, y in zip(lp_a, lp_b)) < 1e-4
        assert [set(t.top) for t in a.outputs[0].logprobs] == [set(t.top) for t in b.outputs[0].logprobs]
    stats = spec_llm.stats()
    assert stats.draft_tokens > 0 and 0 < stats.accepted_draft_tokens <= stats.draft_tokens
    assert len(spec_llm.engine.step_records) < len(base_llm.engine.step_records)
    spec_llm.engine.check_invariants()


def test_preemption_in_the_middle_of_drafts_loses_nothing(tiny_llama, always_draft):
    _, base = run(tiny_llama, PROMPTS, greedy(80), num_kv_blocks=64)
    for mode in ("recompute", "swap"):
        llm, spec = run(tiny_llama, PROMPTS, greedy(80), num_kv_blocks=14, speculation="ngram",
                        preemption_mode=mode)
        assert llm.stats().num_preemptions > 0, mode
        assert tokens(spec) == tokens(base), mode
        assert llm.stats().accepted_draft_tokens > 0


def test_a_draft_never_preempts_anyone(tiny_llama, always_draft):
    """The fewest blocks that hold the batch without drafts (16 preempt once): speculation
    preempts nobody either, and it did draft."""
    base_llm, base = run(tiny_llama, PROMPTS, greedy(40), num_kv_blocks=17)
    assert base_llm.stats().num_preemptions == 0
    spec_llm, spec = run(tiny_llama, PROMPTS, greedy(40), num_kv_blocks=17, speculation="ngram")
    assert spec_llm.stats().num_preemptions == 0 and tokens(spec) == tokens(base)
    assert spec_llm.stats().draft_tokens > 0


def test_stops_inside_a_draft_end_where_they_would_without_one(tiny_llama, always_draft):
    _, plain = run(tiny_llama, PROMPTS[:1], greedy(60), num_kv_blocks=64)
    ids = plain[0].outputs[0].token_ids
    stop_at = ids[25]                          # deep inside the loop drafts follow
    for params in (greedy(60, stop_token_ids=[stop_at]), greedy(37), greedy(60, stop=["<4"])):
        _, base = run(tiny_llama, PROMPTS[:1], params, num_kv_blocks=64)
        llm, spec = run(tiny_llama, PROMPTS[:1], params, num_kv_blocks=64, speculation="ngram")
        a, b = base[0].outputs[0], spec[0].outputs[0]
        assert (b.token_ids, b.text, b.finish_reason) == (a.token_ids, a.text, a.finish_reason)
        assert llm.stats().draft_tokens > 0


def test_parallel_samples_and_a_later_prefix_hit(tiny_llama, always_draft):
    """n=2 greedy samples fork after the prompt and draft each on its own; then a request for
    the prompt plus the reply hits the blocks the drafts wrote (their hashes checked by
    debug_checks) and continues as an engine without speculation does."""
    llm = LLM(tiny_llama, num_kv_blocks=64, debug_checks=True, speculation="ngram")
    out = llm.generate([PROMPTS[0]], greedy(50, n=2))[0]
    assert out.outputs[0].token_ids == out.outputs[1].token_ids
    assert all(c.draft_tokens > 0 for c in out.outputs)          # each sample drafted
    follow = PROMPTS[0] + out.outputs[0].token_ids
    again = llm.generate([follow], greedy(30))[0]
    assert again.metrics.num_cached_tokens >= 32
    base = LLM(tiny_llama, num_kv_blocks=64).generate([follow], greedy(30))[0]
    assert again.outputs[0].token_ids == base.outputs[0].token_ids


def test_penalties_beams_and_opted_out_requests_are_not_drafted(tiny_llama):
    llm = LLM(tiny_llama, num_kv_blocks=64, speculation="ngram")
    llm.generate(PROMPTS[:1], greedy(30, repetition_penalty=1.3))
    llm.generate(PROMPTS[:1], greedy(30, speculative=False))
    llm.beam_search([PROMPTS[0]], beam_width=2, max_tokens=10)
    assert llm.stats().draft_tokens == 0


def test_each_output_counts_its_drafts_and_the_footer_shows_them(tiny_llama, always_draft):
    from localpaged.ui.render import fmt_stats
    llm = LLM(tiny_llama, num_kv_blocks=64, speculation="ngram")
    outs = llm.generate(PROMPTS, greedy(60))
    per_output = [(o.outputs[0].draft_tokens, o.outputs[0].accepted_draft_tokens) for o in outs]
    stats = llm.stats()
    assert sum(d for d, _ in per_output) == stats.draft_tokens
    assert sum(a for _, a in per_output) == stats.accepted_draft_tokens > 0
    drafted, accepted = per_output[0]
    assert f"drafted {drafted}, accepted {accepted}" in fmt_stats(
        {"draft_tokens": drafted, "accepted_draft_tokens": accepted})
    assert "drafted" not in fmt_stats({"generated_tokens": 3})
    from localpaged.ui.engine_panel.logic import KvSnapshot
    from localpaged.ui.engine_panel.view import render_panel
    rate = f"{100 * stats.accepted_draft_tokens / stats.draft_tokens:.0f}%"
    assert f"<b>{rate}</b><span>Drafts accepted</span>" in render_panel(KvSnapshot(True, stats=stats))


def test_sampled_drafts_keep_the_distribution():
    """The rejection rule against the exact probabilities: over 20,000 draws, the first kept
    token is distributed as p at the first position (whatever the draft), and after an
    accepted draft the next one as p at the second position."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 6, generator=g) * 1.5
    params = SamplingParams(temperature=0.8, top_k=5, max_tokens=4)
    probs = _filtered_probs(logits, [params, params])
    draft = [int(probs[0].argsort()[-2])]       # the second most likely token
    seq = Sequence([1, 2, 3], 3, 0, torch.Generator().manual_seed(1))
    first, second = torch.zeros(6), torch.zeros(6)
    for _ in range(20_000):
        chosen = [r.token_id for r in verify(logits, seq, params, draft)]
        first[chosen[0]] += 1
        if chosen[0] == draft[0]:
            second[chosen[1]] += 1
    assert (first / first.sum() - probs[0]).abs().max() < 0.012
    assert (second / second.sum() - probs[1]).abs().max() < 0.02
    assert first[int(probs[0].argmin())] == 0 or probs[0].min() > 0      # top-k respected


def test_sampling_through_the_rejection_rule_in_the_engine(tiny_llama, always_draft):
    """top_k=1 sampling takes the rejection path with a point-mass distribution: it must keep
    exactly the greedy tokens, drafts accepted; a seeded request at a real temperature gives
    the same tokens on every run."""
    _, base = run(tiny_llama, PROMPTS, greedy(50), num_kv_blocks=32)
    one = SamplingParams(max_tokens=50, temperature=1.0, top_k=1, seed=3, ignore_eos=True)
    llm, outs = run(tiny_llama, PROMPTS, one, num_kv_blocks=32, speculation="ngram")
    assert tokens(outs) == tokens(base)
    assert llm.stats().accepted_draft_tokens > 0
    warm = SamplingParams(max_tokens=50, temperature=0.7, seed=3, ignore_eos=True)
    runs = [LLM(tiny_llama, num_kv_blocks=32, speculation="ngram").generate(PROMPTS, warm)
            for _ in range(2)]
    assert tokens(runs[0]) == tokens(runs[1])


def test_the_api_takes_a_per_request_opt_out():
    import pydantic
    from localpaged.api.protocol import ChatCompletionRequest
    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert ChatCompletionRequest(**base).sampling_params().speculative is True
    assert ChatCompletionRequest(**base, speculative=False).sampling_params().speculative is False
    with pytest.raises(pydantic.ValidationError, match="speculative"):
        ChatCompletionRequest(**base, speculative="no")


def test_propose_looks_in_the_draft_sources_first():
    own = [1, 2, 3, 9, 8, 1, 2, 3]
    assert propose(own, 2) == [9, 8]
    assert propose(own, 2, sources=((7, 1, 2, 3, 5, 6),)) == [5, 6]     # an earlier reply
    assert propose(own, 2, sources=((7, 2, 3, 5, 6),)) == [9, 8]         # a longer match wins
    assert propose(own, 2, sources=((4, 4),)) == [9, 8]                  # no match there
    src = (2, 3, 4, 0, 2, 3, 6, 0, 2, 3, 7)                              # "2 3" three times
    assert [propose([1, 2, 3], 1, (src,), near=m) for m in (2, 6, 10)] == [[4], [6], [7]]


def test_a_regenerated_reply_drafts_from_its_earlier_sibling(tiny_llama, always_draft):
    """The reply to the same prompt, passed as a draft source: the new greedy reply is the
    same, and most of it comes from verified drafts, every one accepted (a repeated 4-gram in
    the reply does not throw the alignment off: the occurrence nearest the reply's length)."""
    prompt = list(range(100, 140))           # nothing in the prompt repeats
    first = LLM(tiny_llama, num_kv_blocks=64).generate([prompt], greedy(40))[0].outputs[0]
    llm = LLM(tiny_llama, num_kv_blocks=64, speculation="ngram", record_steps=True,
              debug_checks=True)
    again = llm.generate([prompt], greedy(40, draft_sources=[first.token_ids]))[0].outputs[0]
    assert again.token_ids == first.token_ids
    assert again.accepted_draft_tokens == again.draft_tokens >= 25     # lined up with it
    assert len(llm.engine.step_records) <= 12                             # 40 tokens


def test_the_ui_passes_earlier_replies_as_draft_sources(tiny_llama, tmp_path, monkeypatch):
    """Regenerate drafts from the reply it stands beside, an edited message from the old
    message's reply (what the chat backend is asked)."""
    from helpers.ui_helpers import controller, run, tiny_backend
    backends = tiny_backend(tiny_llama, num_kv_blocks=64, speculation="ngram")
    backend = next(backends)
    asked = []
    chat = backend.chat
    monkeypatch.setattr(backend, "chat", lambda messages, params, **kw: (
        asked.append([p.draft_sources for p in params]), chat(messages, params, **kw))[1])
    ctl_gen = controller(backend, tmp_path, {"temperature": 0.0, "max_tokens": 24})
    ctl = next(ctl_gen)
    try:
        cid = ctl.new_conversation().id
        turn = run(ctl.send(cid, "Tell me about blocks"))
        reply = ctl.store.get_message(turn.replies[0].message_id)
        run(ctl.regenerate(reply.id))
        user = ctl.store.get_message(reply.parent_id)
        run(ctl.edit(user.id, "Tell me about pages"))
        assert asked[0] == [()]                                   # a first reply: nothing
        assert asked[1] == [(tuple(reply.token_ids),)]            # beside the first reply
        newest = ctl.store.children(user.id)[-1]
        assert asked[2][0][0] == tuple(newest.token_ids)          # the old branch, newest first
        assert len(asked[2][0]) == 2
    finally:
        next(ctl_gen, None)
        next(backends, None)


@pytest.mark.parametrize("mode", ["ngram", "draft"])
def test_the_engine_suites_pass_with_speculation_on(mode):
    """The transformers-equality, invariance, preemption and prefix tests, rerun with every
    engine speculating (LOCALPAGED_SPECULATION=ngram, or draft with each engine's own model as
    its draft model: LOCALPAGED_DRAFT_MODEL=self) and its block invariants (the draft model's
    too) checked after every step: seeded sampling included, since a verified draft takes the
    same random numbers as decoding one at a time."""
    import os
    import subprocess
    import sys
    files = ["engine/test_hf_equality.py", "engine/test_invariance.py",
             "engine/test_groups_under_pressure.py", "engine/test_prefix_and_fork.py"]
    # test_priority asserts the same token counts step for step with and without background
    # work. In draft mode 4 of its 12 cases differ: the model drafts the interactive requests
    # 3-4 tokens where n-grams find nothing, and in its 22-block cache the blocks background
    # groups hold leave no room for them, so the scheduler drops those drafts (a draft never
    # preempts anyone) where the run without background work keeps them. Outputs stay equal.
    files += ["engine/test_priority.py"] if mode == "ngram" else []
    env = {**os.environ, "LOCALPAGED_SPECULATION": mode, "LOCALPAGED_DEBUG_CHECKS": "1",
           "LOCALPAGED_DRAFT_MODEL": "self"}
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # -p helpers.always_draft: drafting never stops for measured cost, so the steps (which
    # test_priority reads) do not depend on the machine's load
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           "-p", "helpers.always_draft", *files], cwd=tests, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def test_the_bundled_model_regenerates_exactly_from_its_sibling(smollm2_gguf, always_draft):
    """On the real model: a regenerate drafts its whole reply from the first one and keeps
    exactly the tokens of decoding without speculation (the verification runs each position
    through the decode kernels, so no rounding difference can flip a near-tie)."""
    prompt = "Explain in detail how a CPU cache works, with examples."
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    plain = LLM(smollm2_gguf, num_kv_blocks=64).chat(
        [{"role": "user", "content": prompt}], params)[0].outputs[0]
    llm = LLM(smollm2_gguf, num_kv_blocks=64, speculation="ngram", debug_checks=True)
    again = llm.chat([{"role": "user", "content": prompt}], SamplingParams(
        max_tokens=48, temperature=0.0, ignore_eos=True,
        draft_sources=[plain.token_ids]))[0].outputs[0]
    assert again.token_ids == plain.token_ids
    assert again.accepted_draft_tokens == again.draft_tokens >= 30   # every 8th step drafts none
