"""Grammar-constrained decoding in the engine (engine/grammar.py; the masks in engine/sampler.py,
drafts and jump-forward in engine/llm_engine.py).

The gold standard: transformers' greedy decoding under an independent xgrammar matcher (built
here from the spec, not through our compiler) gives the same tokens as our engine. Around it:
every output over many seeds parses and validates, for n > 1, columns, beams, speculation and
jump-forward on or off (the same tokens either way), and preemption by recompute and by swap
(the same tokens as without). The model is a random Llama with SmolLM2's real vocabulary
(helpers/grammar_models.py), so keys and values meet real token boundaries.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch
import xgrammar as xgr

from helpers.engine_helpers import hf_model
from helpers.grammar_models import smol_tokenizer, tiny_smol
from localpaged import LLM, SamplingParams
from localpaged.chat.tool_calls import ToolSpec, tool_format
from localpaged.core.guided import GuidedDecoding
from localpaged.core.request import BeamParams
from localpaged.engine.grammar import GrammarError, json_grammar

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 10},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]},
                                  "maxItems": 3},
                         "ok": {"type": "boolean"}},
          "required": ["name", "age", "tags", "ok"], "additionalProperties": False}
PROMPT = "Describe a person as JSON:"


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return tiny_smol(str(tmp_path_factory.mktemp("grammar")))


@pytest.fixture(scope="module")
def llm(path):
    return LLM(path, debug_checks=True)


def schema_params(**kw) -> SamplingParams:
    kw.setdefault("max_tokens", 160)
    return SamplingParams(guided=GuidedDecoding.json_schema(SCHEMA), **kw)


def valid(text: str) -> dict:
    value = json.loads(text)
    jsonschema.validate(value, SCHEMA)
    return value


def hf_constrained_greedy(path: str, prompt: list[int], spec_schema: dict, max_tokens: int) -> list[int]:
    """transformers' forward, argmax under the mask of a matcher of our own: the oracle."""
    tok = smol_tokenizer()
    model = hf_model(path)
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=model.config.vocab_size,
                                              stop_token_ids=[tok.eos_token_id])
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(spec_schema),
                                                             any_whitespace=False)
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, model.config.vocab_size)
    ids, out = list(prompt), []
    with torch.inference_mode():
        for _ in range(max_tokens):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            matcher.fill_next_token_bitmask(bitmask)
            xgr.apply_token_bitmask_inplace(logits[None], bitmask)
            token = int(logits.argmax())
            assert matcher.accept_token(token)
            out.append(token)
            ids.append(token)
            if matcher.is_terminated():
                break
    return out


def test_greedy_equals_transformers_under_the_same_grammar(path, llm):
    prompt = smol_tokenizer().encode(PROMPT)
    out = llm.generate([prompt], schema_params(temperature=0.0))[0].outputs[0]
    assert out.token_ids == hf_constrained_greedy(path, prompt, SCHEMA, 160)
    assert out.finish_reason == "stop"
    valid(out.text)


def test_every_sample_validates_over_many_seeds(llm):
    outs = llm.generate([PROMPT] * 12, [schema_params(temperature=1.0, seed=s, n=2)
                                        for s in range(12)])
    texts = [c.text for o in outs for c in o.outputs]
    assert all(c.finish_reason == "stop" for o in outs for c in o.outputs)
    values = [valid(t) for t in texts]
    assert len({json.dumps(v) for v in values}) > 6        # the samples differ: not one answer


def test_length_limited_strings_parse(llm):
    """Strings with maxLength may hold no raw control character (JSON forbids them): every
    sample parses, and the grammar itself refuses a tab inside such a string."""
    schema = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 8},
                                               "b": {"type": "string", "minLength": 2}},
              "required": ["a", "b"], "additionalProperties": False}
    guided = GuidedDecoding.json_schema(schema)
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=80, guided=guided) for s in range(16)]
    for out in llm.generate([PROMPT] * 16, params):
        c = out.outputs[0]
        if c.finish_reason == "stop":
            jsonschema.validate(json.loads(c.text), schema)
    tok = smol_tokenizer()
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok)))
    compiled = compiler.compile_grammar(json_grammar(guided.value))
    assert xgr.GrammarMatcher(compiled).accept_string('{"a": "x y", "b": "zz"}')
    assert not xgr.GrammarMatcher(compiled).accept_string('{"a": "x\ty", "b": "zz"}')
    # the same in a tool call's arguments (a structural tag's JSON part)
    tool = ToolSpec("f", "", {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
                              "required": ["city"]})
    fmt = tool_format(None)
    tag = llm.engine.grammars.compile(fmt.guided([tool], "required", True))
    assert tag.matcher().matcher.accept_string(fmt.call_text("f", '{"city": "Paris"}'))
    assert not tag.matcher().matcher.accept_string(fmt.call_text("f", '{"city": "x\ty"}'))


def test_unconstrained_output_is_not_json(llm):
    """The check above can fail: without the grammar the same model writes no JSON."""
    out = llm.generate([PROMPT], SamplingParams(temperature=1.0, seed=0, max_tokens=40))[0]
    with pytest.raises(ValueError):
        valid(out.outputs[0].text)


@pytest.mark.parametrize("spec, check", [
    (GuidedDecoding.regex(r"[0-9]{3}-[a-z]{2,4}"), lambda t: re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", t)),
    (GuidedDecoding.choice(["yes", "no", "maybe"]), lambda t: t in ("yes", "no", "maybe")),
    (GuidedDecoding.grammar('root ::= "(" [a-c]+ ")" | "[" [0-9]+ "]"'),
     lambda t: re.fullmatch(r"\([a-c]+\)|\[[0-9]+\]", t)),
])
def test_regex_choice_grammar_and_any_object(llm, spec, check):
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=300, guided=spec) for s in range(6)]
    for out in llm.generate(["Answer:"] * 6, params):
        c = out.outputs[0]
        assert c.finish_reason == "stop", c.text
        assert check(c.text), c.text


def test_any_object_stays_a_prefix_of_an_object(llm):
    """Free keys and strings let a random model write on: a reply that reaches max_tokens is
    still a prefix the grammar accepts (checked by a matcher of our own), one that stops is an
    object."""
    tok = smol_tokenizer()
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok))
    compiled = xgr.GrammarCompiler(info).compile_json_schema('{"type": "object"}')
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=60,
                             guided=GuidedDecoding.json_object()) for s in range(6)]
    for out in llm.generate(["Answer:"] * 6, params):
        c = out.outputs[0]
        assert c.text.startswith("{")
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.text), dict)
        else:
            assert xgr.GrammarMatcher(compiled).accept_string(c.text), c.text


def test_columns_each_keep_their_own_constraint(llm):
    columns = [schema_params(temperature=1.0, seed=1),
               SamplingParams(temperature=1.0, seed=1, max_tokens=20,
                              guided=GuidedDecoding.regex("[xyz]{5}")),
               SamplingParams(temperature=0.0, max_tokens=8)]
    group = llm.engine.make_group(PROMPT, column_params=columns)
    llm.engine.add_group(group)
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    a, b, c = group.seqs
    valid(a.text)
    assert re.fullmatch("[xyz]{5}", b.text)
    assert c.grammar is None and c.num_output_tokens == 8


def test_beams_are_all_valid(llm):
    group = llm.engine.make_group(PROMPT, schema_params(temperature=0.0, max_tokens=120),
                                  beam=BeamParams(3))
    llm.engine.add_group(group)
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    assert len(group.seqs) == 3
    for seq in group.seqs:
        assert seq.finish_reason == "stop"
        valid(seq.text)


def run_all(llm: LLM, prompts, params) -> list[list[list[int]]]:
    return [[c.token_ids for c in o.outputs] for o in llm.generate(prompts, params)]


def test_speculation_and_jump_forward_keep_the_tokens(path):
    prompts = [PROMPT] * 4
    params = [schema_params(temperature=t, seed=s) for t, s in ((0.0, None), (1.0, 1), (0.7, 2),
                                                                  (1.0, 3))]
    plain = LLM(path, debug_checks=True, jump_forward=False)
    expected = run_all(plain, prompts, params)
    assert plain.engine.jump_forward_tokens == 0
    for speculation in ("off", "ngram"):
        llm = LLM(path, debug_checks=True, speculation=speculation)
        assert run_all(llm, prompts, params) == expected
        assert llm.engine.jump_forward_tokens > 0


def test_masks_computed_during_the_forward_keep_the_tokens(path):
    """The GPU's way (masks on a worker thread while the model runs) gives the tokens the
    CPU's way (masks computed at sampling) gives, drafts and forked samples included."""
    prompts = [PROMPT] * 3
    params = [schema_params(temperature=0.0), schema_params(temperature=1.0, seed=4, n=2),
              schema_params(temperature=0.8, seed=5)]
    inline = LLM(path, speculation="ngram")
    ahead = LLM(path, speculation="ngram")
    ahead.engine.masks_during_forward = True
    assert run_all(ahead, prompts, params) == run_all(inline, prompts, params)
    assert ahead.engine._mask_worker is not None and inline.engine._mask_worker is None


def test_jump_forward_saves_steps(path):
    prompts, params = [PROMPT], [schema_params(temperature=0.0)]
    steps = {}
    for jump in (False, True):
        llm = LLM(path, debug_checks=True, jump_forward=jump, record_steps=True)
        tokens = run_all(llm, prompts, params)
        steps[jump] = (len(llm.engine.step_records), tokens)
    assert steps[True][1] == steps[False][1]
    assert steps[True][0] < steps[False][0]


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_keeps_the_tokens(path, mode):
    prompts = [PROMPT + " " * i for i in range(6)]
    params = [schema_params(temperature=1.0, seed=s, n=2) for s in range(6)]
    expected = run_all(LLM(path, debug_checks=True), prompts, params)
    small = LLM(path, debug_checks=True, num_kv_blocks=24, preemption_mode=mode,
                swap_space_gb=0.05)
    assert run_all(small, prompts, params) == expected
    assert small.engine.scheduler.num_preemptions > 0


def test_a_bad_schema_is_a_clear_error_and_holds_nothing(llm):
    bad = GuidedDecoding.json_schema({"type": "object", "properties": {"a": {"type": "nope"}}})
    with pytest.raises(GrammarError, match="JSON schema cannot be compiled"):
        llm.generate([PROMPT], SamplingParams(guided=bad))
    with pytest.raises(GrammarError, match="regex cannot be compiled"):
        llm.generate([PROMPT], SamplingParams(guided=GuidedDecoding.regex("([a-z")))
    assert not llm.engine.has_unfinished_requests()
    llm.engine.check_invariants()
    assert llm.generate([PROMPT], schema_params(temperature=0.0))[0].outputs[0].finish_reason == "stop"


def test_spec_validation():
    with pytest.raises(ValueError, match="kind must be one of"):
        GuidedDecoding("xml", "x")
    with pytest.raises(ValueError, match="needs a non-empty value"):
        GuidedDecoding.regex("")
    with pytest.raises(ValueError, match="not valid JSON"):
        GuidedDecoding.json_schema("{nope")
    with pytest.raises(ValueError, match="SamplingParams.guided"):
        SamplingParams(guided={"type": "json_object"})
    # key order is the output's order: kept
    assert GuidedDecoding.json_schema({"b": 1, "a": 2}).value == '{"b":1,"a":2}'


def test_a_schema_compiles_once(llm):
    compiler = llm.engine.grammars
    schema = {"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]}
    before = compiler.compiles
    for _ in range(3):
        llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=30,
                                              guided=GuidedDecoding.json_schema(json.dumps(schema))))
    assert compiler.compiles == before + 1


def test_a_grammar_the_vocabulary_cannot_write(tiny_llama):
    """A toy vocabulary of characters from U+0100 on writes no JSON: refused at admission, not
    a failed step. A grammar that runs into text the vocabulary cannot write midway ends the
    reply there (its stop token), and the engine goes on."""
    llm = LLM(tiny_llama, debug_checks=True)
    with pytest.raises(GrammarError, match="allows no text this model's vocabulary can write"):
        llm.generate([[5, 6, 7]], SamplingParams(guided=GuidedDecoding.json_object()))
    midway = SamplingParams(temperature=1.0, seed=0, max_tokens=20,
                            guided=GuidedDecoding.regex("\u0100\u0101[a-z]+"))
    out = llm.generate([[5, 6, 7]], midway)[0].outputs[0]
    assert out.text == "\u0100\u0101" and out.finish_reason == "stop"
    assert not llm.engine.has_unfinished_requests()
    assert len(llm.generate([[5, 6, 7]], SamplingParams(max_tokens=5, temperature=0.0))[0]
               .outputs[0].token_ids) == 5


def test_packed_masks_against_one_bool_per_token():
    """The packed masks the sampler applies equal a plain bool mask per token: liveness ignores
    the padding bits of the last word, dead rows open their stop tokens (bit 31 included)."""
    from localpaged.engine.grammar import _open_dead_ends, apply_mask, live_rows
    vocab, g = 70, torch.Generator().manual_seed(0)
    bitmask = torch.randint(-2**31, 2**31 - 1, (4, 3), dtype=torch.int32, generator=g)
    bitmask[1] = 0
    bitmask[2] = 0
    bitmask[2, 2] = -(1 << 6)                  # only padding bits (tokens 70..95) set: dead
    bits = ((bitmask.view(torch.uint8).long()[:, :, None] >> torch.arange(8)) & 1).bool()
    plain = bits.reshape(4, -1)[:, :vocab]
    assert live_rows(bitmask, vocab).tolist() == plain.any(dim=1).tolist() == [True, False, False, True]
    logits = torch.randn(4, vocab, generator=g)
    assert torch.equal(apply_mask(logits.clone(), bitmask), logits.masked_fill(~plain, float("-inf")))
    _open_dead_ends(bitmask, vocab, (31, 63))
    masked = apply_mask(logits.clone(), bitmask)
    for row in (1, 2):
        assert torch.isfinite(masked[row]).nonzero()[:, 0].tolist() == [31, 63]
    assert torch.equal(masked[0], logits[0].masked_fill(~plain[0], float("-inf")))
