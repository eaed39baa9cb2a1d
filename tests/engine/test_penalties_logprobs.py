"""Penalties and logprobs against an independent computation.

The oracle re-runs transformers' model on the whole sequence at every step (no KV cache, no
engine code), applies the penalties as their definitions say (engine_helpers.penalized;
repetition: transformers' RepetitionPenaltyLogitsProcessor over prompt and output;
presence/frequency: OpenAI's, over the output), takes the argmax, and computes logprobs as
`log_softmax` of the raw logits (vLLM's convention: before penalties). Tolerance: logprobs within 1e-4 absolute (fp32, two different
attention implementations); tokens equal (greedy on random tiny models has wide margins, and
transformers' own generate with repetition_penalty is checked too).
"""

from __future__ import annotations

import pytest
import torch
from helpers.engine_helpers import greedy, hf_model, penalized, prompts

from localpaged import LLM

STEPS = 12
TOP = 4


def reference(path: str, prompt: list[int], rep: float, presence: float, frequency: float):
    """(tokens, chosen-token logprobs, top-TOP {id: logprob} per step), computed from scratch."""
    model = hf_model(path)
    ids, chosen, tops = list(prompt), [], []
    for _ in range(STEPS):
        with torch.inference_mode():
            raw = model(torch.tensor([ids])).logits[0, -1].double()
        logprobs = torch.log_softmax(raw, dim=-1)
        token = int(torch.argmax(penalized(raw, prompt, ids, rep, presence, frequency)))
        top = torch.topk(logprobs, TOP)
        ids.append(token)
        chosen.append(float(logprobs[token]))
        tops.append(dict(zip(top.indices.tolist(), top.values.tolist())))
    return ids[len(prompt):], chosen, tops


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(tiny_llama, num_kv_blocks=64)


@pytest.mark.parametrize("rep,presence,frequency", [
    (1.0, 0.0, 0.0), (1.8, 0.0, 0.0), (1.0, 1.5, 0.0), (1.0, 0.0, 1.2), (1.3, 0.5, -0.4)])
def test_penalties_and_logprobs_match_reference(llm, tiny_llama, rep, presence, frequency):
    batch = prompts(2, seed=71, lo=6, hi=14)
    params = greedy(STEPS, repetition_penalty=rep, presence_penalty=presence,
                    frequency_penalty=frequency, logprobs=TOP)
    outs = llm.generate(batch, params)
    for prompt, out in zip(batch, outs):
        comp = out.outputs[0]
        tokens, chosen, tops = reference(tiny_llama, prompt, rep, presence, frequency)
        assert comp.token_ids == tokens
        assert [lp.token_id for lp in comp.logprobs] == tokens
        assert [lp.logprob for lp in comp.logprobs] == pytest.approx(chosen, abs=1e-4)
        for lp, top in zip(comp.logprobs, tops):
            assert set(lp.top) == set(top)
            assert [lp.top[t] for t in top] == pytest.approx(list(top.values()), abs=1e-4)
        assert comp.cumulative_logprob == pytest.approx(sum(chosen), abs=1e-3)


def test_penalties_repeat_less(llm, tiny_llama):
    """The penalties change the output where the plain greedy text repeats (else the reference
    comparison above could pass with penalties ignored)."""
    prompt = prompts(1, seed=72, lo=6, hi=8)[0]
    plain = llm.generate([prompt], greedy(48))[0].outputs[0].token_ids
    assert len(set(plain)) < len(plain)                  # the random model repeats itself
    for kw in ({"repetition_penalty": 1.8}, {"frequency_penalty": 1.5},
               {"presence_penalty": 1.5}):
        out = llm.generate([prompt], greedy(48, **kw))[0].outputs[0].token_ids
        assert out != plain, kw
        assert len(set(out)) > len(set(plain)), kw


def test_repetition_penalty_equals_transformers_generate(llm, tiny_llama):
    prompt = prompts(1, seed=73, lo=8, hi=12)[0]
    with torch.inference_mode():
        hf = hf_model(tiny_llama).generate(
            torch.tensor([prompt]), max_new_tokens=24, min_new_tokens=24, do_sample=False,
            repetition_penalty=1.5, eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    assert llm.generate([prompt], greedy(24, repetition_penalty=1.5))[0].outputs[0].token_ids == hf
