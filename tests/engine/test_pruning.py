"""Parallel thinking: n branches over one shared prompt, the ones that fall behind pruned at
checkpoints (core/pruning.py). The prompt's blocks are held once by all branches, a pruned
branch's own blocks are free in the step it is pruned, nothing is held after the request, and
the surviving branches' tokens equal the same request's without pruning, whatever the batch and
preemption."""

from __future__ import annotations

import pytest
from helpers.engine_helpers import prompts

from localpaged import LLM, SamplingParams
from localpaged.core.pruning import score
from localpaged.core.sampling_params import PruneRule

N, MAX_TOKENS = 4, 40
RULE = PruneRule(margin=0.0, after=8, every=4, keep=2)


def params(rule: PruneRule | None = RULE, **kw) -> SamplingParams:
    return SamplingParams(n=N, temperature=1.0, seed=7, max_tokens=MAX_TOKENS, ignore_eos=True,
                          prune=rule, logprobs=0, **kw)


@pytest.fixture(scope="module")
def prompt():
    return prompts(1, seed=11, lo=70, hi=71)[0]        # 4 full blocks and a partial one


@pytest.fixture(scope="module")
def unpruned(tiny_llama, prompt):
    return LLM(tiny_llama, num_kv_blocks=64).generate([prompt], params(None))[0]


def test_prompt_blocks_shared_by_all_branches_pruned_blocks_free_at_once(tiny_llama, prompt):
    llm = LLM(tiny_llama, num_kv_blocks=64, debug_checks=True)
    engine, kv = llm.engine, llm.engine.block_manager
    engine.add_request("r", prompt, params())
    group = engine.groups["r"]
    full_prompt_blocks = len(prompt) // kv.block_size
    saw_shared, pruned = False, []
    while engine.has_unfinished_requests():
        live = [s for s in group.seqs if not s.is_finished]
        # blocks each live branch holds alone, before this step
        alone = {s.seq_id: [b for b in kv.block_ids(s) if kv.pool.blocks[b].ref_count == 1]
                 for s in live}
        engine.step()
        if len(group.seqs) == N and not saw_shared:
            tables = [kv.block_ids(s) for s in group.seqs]
            shared = tables[0][:full_prompt_blocks]
            assert all(t[:full_prompt_blocks] == shared for t in tables)
            assert all(kv.pool.blocks[b].ref_count == N for b in shared)
            saw_shared = True
        for s in live:
            if s.pruned is not None:
                pruned.append(s)
                assert s.seq_id not in kv.tables                  # freed in its step
                assert s.released_blocks == len(alone[s.seq_id]) >= 1
                assert all(kv.pool.blocks[b].ref_count == 0 for b in alone[s.seq_id])
    assert saw_shared
    assert len(pruned) == N - RULE.keep                  # margin 0: all but the best `keep`
    assert llm.stats().blocks_in_use == 0
    engine.block_manager.check(expect_empty=True)


def test_survivors_equal_the_unpruned_request_and_scores_are_the_rule(tiny_llama, prompt,
                                                                      unpruned):
    out = LLM(tiny_llama, num_kv_blocks=64).generate([prompt], params())[0]
    full = {o.index: o for o in unpruned.outputs}
    pruned = [o for o in out.outputs if o.pruned is not None]
    survivors = [o for o in out.outputs if o.pruned is None]
    assert len(pruned) == N - RULE.keep and len(survivors) == RULE.keep
    for o in survivors:
        assert o.token_ids == full[o.index].token_ids and o.finish_reason == "length"
    at = RULE.after                                       # margin 0 prunes at the first checkpoint
    scores = {i: sum(lp.logprob for lp in o.logprobs[:at]) / at for i, o in full.items()}
    best = max(scores.values())
    assert {o.index for o in survivors} == set(sorted(scores, key=scores.get)[-RULE.keep:])
    for o in pruned:
        assert o.finish_reason == "abort" and o.finish_detail == "pruned"
        assert o.pruned.at == at and o.pruned.best == pytest.approx(best)
        assert o.pruned.score == pytest.approx(scores[o.index])
        assert o.token_ids == full[o.index].token_ids[:len(o.token_ids)]
        assert at <= len(o.token_ids) < MAX_TOKENS


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_pruning_is_the_same_under_preemption_and_batching(tiny_llama, prompt, mode):
    alone = LLM(tiny_llama, num_kv_blocks=64).generate([prompt], params())[0]
    llm = LLM(tiny_llama, num_kv_blocks=14, preemption_mode=mode, debug_checks=True)
    others = prompts(3, seed=12, lo=30, hi=40)
    outs = llm.generate([prompt] + others, [params()] + [SamplingParams(
        max_tokens=30, temperature=0.0, ignore_eos=True)] * 3)
    assert llm.stats().num_preemptions > 0
    assert [o.token_ids for o in outs[0].outputs] == [o.token_ids for o in alone.outputs]
    for o, a in zip(outs[0].outputs, alone.outputs):    # logprobs: equal up to float rounding
        assert (o.pruned is None) == (a.pruned is None)
        if o.pruned is not None:
            assert o.pruned.at == a.pruned.at
            assert (o.pruned.score, o.pruned.best) == pytest.approx((a.pruned.score, a.pruned.best))


def test_margin_keeps_close_branches(tiny_llama, prompt, unpruned):
    wide = PruneRule(margin=100.0, after=8, every=4)
    out = LLM(tiny_llama, num_kv_blocks=64).generate([prompt], params(wide))[0]
    assert all(o.pruned is None for o in out.outputs)
    assert [o.token_ids for o in out.outputs] == [o.token_ids for o in unpruned.outputs]


def test_score_is_the_mean_logprob_of_the_first_tokens(unpruned):
    o = unpruned.outputs[0]

    class Seq:            # score reads only a sequence's logprobs
        logprobs = o.logprobs
    assert score(Seq, 5) == pytest.approx(sum(lp.logprob for lp in o.logprobs[:5]) / 5)
    assert score(Seq, 10_000) == pytest.approx(o.cumulative_logprob / len(o.token_ids))


@pytest.mark.parametrize("bad", [dict(margin=-1), dict(margin=float("nan")), dict(after=0),
                                 dict(every=0), dict(keep=0), dict(keep=1.5), dict(after=True)])
def test_bad_rules_are_refused_by_name(bad):
    with pytest.raises(ValueError, match=f"PruneRule.{next(iter(bad))}"):
        PruneRule(**bad)


def test_prune_needs_several_branches(tiny_llama, prompt):
    llm = LLM(tiny_llama, num_kv_blocks=64)
    with pytest.raises(ValueError, match="prune"):
        llm.generate([prompt], SamplingParams(n=1, prune=PruneRule()))
    with pytest.raises(ValueError, match="prune"):
        SamplingParams(prune={"margin": 1})
