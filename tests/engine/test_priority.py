"""Request priorities: background work never delays interactive work, and resumes unchanged.

The oracle for "never delays" is the same interactive requests run with no background work:
their tokens per step (so their time to first token, in steps) must be the same. The oracle for
outputs is every request run alone on a roomy cache, each of them equal to transformers' own
(engine_helpers.hf_expected: greedy, and the seeded samples). A spy on `Scheduler.schedule` records each
step's batch and checks the admission order between the two classes.
"""

import pytest
from helpers.engine_helpers import greedy, hf_expected, prompts

from localpaged import SamplingParams
from localpaged.core.config import EngineConfig
from localpaged.core.sampling_params import BACKGROUND, INTERACTIVE
from localpaged.engine.llm_engine import LLMEngine

TIGHT = dict(block_size=8, num_kv_blocks=22, max_num_seqs=4, max_num_batched_tokens=48,
             swap_space_gb=0.01, debug_checks=True)


def engine(path, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=path, **kw))


class Trace:
    """Spy on the scheduler: per step, tokens per request, preempted requests, and whether a
    background group came in while an interactive one was still queued (never allowed)."""

    def __init__(self, eng: LLMEngine) -> None:
        self.tokens: list[dict[str, int]] = []
        self.preempted: list[str] = []
        self.violations: list[str] = []
        self.interactive_preempted: list[str] = []
        self.prefill_steps_bg_tokens: list[int] = []   # bg tokens per seq in interactive prefill steps
        self.mixed_steps = 0                           # steps with interactive and background work
        sched, schedule = eng.scheduler, eng.scheduler.schedule

        def spy():
            before = {id(g) for g in sched.running}
            out = schedule()
            step: dict[str, int] = {}
            for item in out.scheduled:
                step[item.group.request_id] = step.get(item.group.request_id, 0) + item.num_tokens
            self.tokens.append(step)
            self.preempted += [g.request_id for g in out.preempted]
            queued = [g for q in (sched.waiting, sched.swapped) for g in q if g.priority == INTERACTIVE]
            came_in = [g for g in sched.running if id(g) not in before and g.priority == BACKGROUND]
            if came_in and queued:
                self.violations.append(f"{came_in[0].request_id} admitted before {queued[0].request_id}")
            lost = [g.request_id for g in out.preempted if g.priority == INTERACTIVE]
            still = [g.request_id for g in sched.running if g.priority == BACKGROUND]
            if lost and still:
                self.violations.append(f"{lost[0]} preempted while {still[0]} runs")
            self.interactive_preempted += lost
            self.mixed_steps += len({it.group.priority for it in out.scheduled}) == 2
            if any(it.num_tokens > 1 and it.group.priority == INTERACTIVE for it in out.scheduled):
                self.prefill_steps_bg_tokens += [it.num_tokens for it in out.scheduled
                                                 if it.group.priority == BACKGROUND]
            return out

        sched.schedule = spy


def drive(eng: LLMEngine, adds: dict[int, list[tuple]]) -> tuple[dict, dict, Trace]:
    """Add requests at the given step numbers, step until all finish; returns the finished
    outputs by id, the step of each request's first token (counted from its own add) and the trace."""
    trace = Trace(eng)
    added_at, first, done = {}, {}, {}
    step = 0
    while step <= max(adds) or eng.has_unfinished_requests():
        for rid, prompt, params, priority in adds.get(step, []):
            eng.add_request(rid, prompt, params, priority=priority)
            added_at[rid] = step
        for out in eng.step():
            if out.request_id not in first and any(c.token_ids for c in out.outputs):
                first[out.request_id] = step - added_at[out.request_id]
            if out.finished:
                done[out.request_id] = out
        step += 1
    eng.check_invariants()
    eng.block_manager.check(expect_empty=True)
    return done, first, trace


def ids(out) -> list[list[int]]:
    return [c.token_ids for c in out.outputs]


@pytest.fixture(scope="module")
def requests():
    bg_prompts = prompts(3, seed=7, lo=20, hi=30)
    fg_prompts = prompts(3, seed=8, lo=60, hi=70)         # > one token budget: chunked prefill
    # no token shared with the background prompts (they begin with 1), so no prefix hit makes
    # the steps with and without background work differ
    fg_prompts = [[2] + p[1:] for p in fg_prompts]
    sampled = SamplingParams(n=2, temperature=1.0, top_k=50, seed=3, max_tokens=30, ignore_eos=True)
    background = [("bg0", bg_prompts[0], greedy(40), BACKGROUND),
                  ("bg1", bg_prompts[1], sampled, BACKGROUND),
                  ("bg2", bg_prompts[2], greedy(36), BACKGROUND)]
    interactive = [("fg0", fg_prompts[0], greedy(20), INTERACTIVE),
                   ("fg1", fg_prompts[1], greedy(12), INTERACTIVE),
                   ("fg2", fg_prompts[2], greedy(40), INTERACTIVE)]   # fg* overflow the cache
    return background, interactive


@pytest.fixture(scope="module")
def alone(tiny_llama, requests):
    """Every request run alone on a roomy cache: the output oracle."""
    outputs = {}
    for rid, prompt, params, priority in requests[0] + requests[1]:
        done, _, _ = drive(engine(tiny_llama, num_kv_blocks=256), {0: [(rid, prompt, params, priority)]})
        outputs[rid] = ids(done[rid])
        assert outputs[rid] == hf_expected(tiny_llama, prompt, params), rid
    return outputs


@pytest.mark.parametrize("batch", ["share", "idle"])
@pytest.mark.parametrize("num_interactive", [2, 3])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_background_never_delays_interactive(tiny_llama, requests, alone, mode, num_interactive, batch):
    """With 3 interactive requests the cache is too small for them alone: interactive groups are
    preempted too, but only once no background group runs, and come back first. With "idle",
    background work never shares a step with interactive work."""
    background, interactive = requests[0], requests[1][:num_interactive]
    start = 4                          # background groups fill the batch and the cache by then
    _, first_off, off = drive(engine(tiny_llama, preemption_mode=mode, background_batch=batch,
                                     **TIGHT), {start: interactive})
    eng = engine(tiny_llama, preemption_mode=mode, background_batch=batch, **TIGHT)
    done, first_on, on = drive(eng, {0: background, start: interactive})

    # The interactive requests get the same tokens, step for step, as with no background work.
    fg = [rid for rid, *_ in interactive]
    per_step_off = [{r: s.get(r, 0) for r in fg} for s in off.tokens[start:]]
    per_step_on = [{r: s.get(r, 0) for r in fg} for s in on.tokens[start:]]
    assert per_step_on[:len(per_step_off)] == per_step_off
    assert all(first_on[r] == first_off[r] for r in fg)
    # Background groups were there (batch and cache full) and paid for it, never interactive ones.
    assert sum(on.tokens[start - 1].values()) > 0 and eng.scheduler.num_preemptions > 0
    assert set(on.preempted) & {rid for rid, *_ in background}
    assert bool(on.interactive_preempted) == (num_interactive == 3)
    if mode == "swap":
        assert eng.scheduler.num_swapped_out > 0
    assert on.violations == []
    assert set(on.prefill_steps_bg_tokens) <= {1}      # one token per seq while interactive prefills
    if batch == "idle":
        assert on.mixed_steps == 0
    else:                                 # (with 3, interactive work leaves no background running)
        assert on.mixed_steps > 0 and (on.prefill_steps_bg_tokens or num_interactive == 3)
    # Every output equals the request run alone (greedy and seeded sampling, n=2).
    assert {rid: ids(out) for rid, out in done.items()} == {r: alone[r] for r in done}
    stats = eng.stats()
    assert stats.blocks_in_use == 0 and stats.cpu_blocks_in_use == 0


@pytest.mark.parametrize("batch", ["share", "idle"])
def test_background_siblings_share_the_prompt(tiny_llama, requests, alone, batch):
    """Alternatives submitted with the interactive reply reuse its prompt blocks, and the cache
    preview equals the hit the engine then reports."""
    _, interactive = requests
    rid, prompt, params, _ = interactive[0]
    eng = engine(tiny_llama, block_size=8, num_kv_blocks=128, debug_checks=True, background_batch=batch)
    assert eng.cached_prefix_tokens(prompt) == 0
    siblings = SamplingParams(n=2, temperature=1.0, seed=11, max_tokens=10, ignore_eos=True,
                              priority=BACKGROUND)
    done, first, _ = drive(eng, {0: [("siblings", prompt, siblings, None), interactive[0]]})
    full_blocks = (len(prompt) - 1) // 8 * 8
    # the whole prompt shared: its full blocks while the interactive reply prefills beside them
    # ("share"); with "idle" the siblings wait for that reply, which has filled the last block
    shared = full_blocks if batch == "share" else len(prompt) - 1
    assert done["siblings"].metrics.num_cached_tokens == shared
    assert ids(done[rid]) == alone[rid]
    # now the replies have filled the prompt's last block: all of it but the last token
    assert eng.cached_prefix_tokens(prompt) == len(prompt) - 1
    edited = prompt[:20] + [5, 6, 7]
    preview = eng.cached_prefix_tokens(edited)
    again, _, _ = drive(eng, {0: [("edit", edited, greedy(2), INTERACTIVE)]})
    # 20 shared tokens: two whole blocks of 8, and the start of the third (copied)
    assert preview == 20 and again["edit"].metrics.num_cached_tokens == preview


def test_priority_is_validated(tiny_llama):
    with pytest.raises(ValueError, match="priority must be one of 'interactive', 'background'"):
        SamplingParams(priority="urgent")
    eng = engine(tiny_llama, num_kv_blocks=16)
    with pytest.raises(ValueError, match="priority must be one of"):
        eng.add_request(None, [1, 5, 6], greedy(2), priority="low")
    assert not eng.has_unfinished_requests()
    with pytest.raises(ValueError, match="background_batch must be one of 'auto', 'share', 'idle', got"):
        EngineConfig(model=tiny_llama, background_batch="always")
    assert eng.scheduler.background_shares_batch is (eng.device.type == "cuda")    # auto


def test_a_finished_sequence_frees_its_blocks_at_once(tiny_llama):
    """Outputs of one request that end at different steps: the first one's blocks are freed
    when it ends, not when the whole request does (debug_checks checks every step)."""
    eng = engine(tiny_llama, block_size=4, num_kv_blocks=64, debug_checks=True)
    group = eng.make_group(prompts(1, seed=9, lo=10, hi=11)[0], column_params=[greedy(2), greedy(9)])
    eng.add_group(group)
    short, long_ = group.seqs[0], None
    while eng.has_unfinished_requests():
        eng.step()
        if short.is_finished and eng.has_unfinished_requests():
            long_ = group.seqs[1]
            assert short.seq_id not in eng.block_manager.tables
            assert long_.seq_id in eng.block_manager.tables
    assert long_ is not None and [len(s.output_token_ids) for s in group.seqs] == [2, 9]
    eng.block_manager.check(expect_empty=True)
