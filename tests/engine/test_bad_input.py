"""Bad input gets a clear error at add_request, and nothing else running is disturbed."""

import pytest
from helpers.engine_helpers import greedy, prompts

from localpaged import LLM, SamplingParams
from localpaged.core.sampling_params import MAX_STOP_CHARS, MAX_STOP_STRINGS


@pytest.mark.parametrize("field,value", [
    ("temperature", -1.0), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -2), ("min_p", 2.0),
    ("n", 0), ("max_tokens", 0), ("repetition_penalty", 0.0), ("presence_penalty", 3.0),
    ("frequency_penalty", -2.5), ("seed", 1.5), ("logprobs", 100), ("stop", [""]),
    ("stop_token_ids", [-1]), ("temperature", float("nan")),
    ("stop", ["x"] * (MAX_STOP_STRINGS + 1)), ("stop", "x" * (MAX_STOP_CHARS + 1)),
])
def test_bad_sampling_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}"):
        SamplingParams(**{field: value})


def test_stop_strings_at_the_caps_are_accepted():
    stop = ["x" * MAX_STOP_CHARS] * MAX_STOP_STRINGS
    assert SamplingParams(stop=stop).stop == stop


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(tiny_llama, num_kv_blocks=24, max_model_len=512)     # 384 cache slots


def test_prompt_longer_than_context_is_refused_without_disturbing_others(llm):
    engine = llm.engine
    ok = prompts(2, seed=1)
    engine.add_request("a", ok[0], greedy(10))
    engine.step()
    with pytest.raises(ValueError, match="prompt is 600 tokens; the model's context is 512"):
        engine.add_request("too-long", [1] * 600, greedy(10))
    with pytest.raises(ValueError, match="prompt is 400 tokens; the whole KV cache holds 384"):
        engine.add_request("too-big", [1] * 400, greedy(10))
    with pytest.raises(ValueError, match="prompt is empty"):
        engine.add_request("empty", [], greedy(10))
    with pytest.raises(ValueError, match=r"prompt token ids must be in \[0, 512\)"):
        engine.add_request("bad-ids", [1, 99999], greedy(10))
    engine.add_request("b", ok[1], greedy(10))
    outs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outs[out.request_id] = out
    assert set(outs) == {"a", "b"}
    assert outs["a"].outputs[0].token_ids == llm.generate([ok[0]], greedy(10))[0].outputs[0].token_ids
    assert llm.stats().blocks_in_use == 0


def test_duplicate_request_id_is_refused(llm):
    llm.engine.add_request("dup", [1, 2, 3], greedy(3))
    with pytest.raises(ValueError, match="already running"):
        llm.engine.add_request("dup", [1, 2, 3], greedy(3))
    llm.engine.abort("dup")
    assert llm.stats().blocks_in_use == 0


def test_unknown_llm_argument_and_bad_config():
    with pytest.raises(TypeError, match="unknown LLM arguments"):
        LLM("x", num_blocks=3)
    with pytest.raises(ValueError, match="preemption_mode"):
        LLM("x", preemption_mode="drop")


def test_tiny_temperature_is_greedy_and_wide_groups_are_refused(llm):
    tiny = SamplingParams(temperature=1e-40, max_tokens=6, ignore_eos=True)
    assert tiny.greedy
    assert llm.generate([[1, 4, 6]], tiny)[0].outputs[0].token_ids == \
        llm.generate([[1, 4, 6]], greedy(6))[0].outputs[0].token_ids
    old = llm.engine.config.max_num_seqs
    llm.engine.config.max_num_seqs = 4
    try:
        with pytest.raises(ValueError, match="max_num_seqs=4"):
            llm.engine.make_group([1, 2], SamplingParams(n=5))
    finally:
        llm.engine.config.max_num_seqs = old
