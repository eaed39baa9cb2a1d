"""Beam search in the engine equals transformers' beam search, and beams share blocks."""

import pytest
from helpers import tiny_models
from helpers.engine_helpers import hf_beams, prompts

from localpaged import LLM


@pytest.mark.parametrize("kind,width,penalty,early", [
    ("llama-gqa", 4, 1.0, False), ("qwen2-bias", 3, 0.5, True), ("llama-gqa", 2, 2.0, "never"),
])
def test_beam_search_equals_transformers(kind, width, penalty, early, tiny_root):
    path = tiny_models.build(kind, tiny_root)
    llm = LLM(path, num_kv_blocks=128, debug_checks=True)
    batch = prompts(3, seed=21)
    outs = llm.beam_search(batch, width, 12, length_penalty=penalty, early_stopping=early,
                           ignore_eos=True)
    for prompt, out in zip(batch, outs):
        ref, scores = hf_beams(path, prompt, width, 12, penalty, early)
        assert [c.token_ids for c in out.outputs] == ref
        assert [c.cumulative_logprob for c in out.outputs] == pytest.approx(scores, abs=1e-4)
    assert llm.stats().blocks_in_use == 0


def test_beams_share_blocks(tiny_llama):
    llm = LLM(tiny_llama, num_kv_blocks=128, debug_checks=True)
    engine = llm.engine
    prompt = prompts(1, seed=4, lo=60, hi=61)[0]
    from localpaged import SamplingParams
    from localpaged.core.request import BeamParams
    group = engine.make_group(prompt, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
                              beam=BeamParams(4))
    engine.add_group(group)
    ratios = []
    while engine.has_unfinished_requests():
        engine.step()
        stats = llm.stats()
        if stats.blocks_in_use and len(group.seqs) == 4:
            ratios.append(stats.blocks_in_use / stats.blocks_without_sharing)
    assert ratios and max(ratios) < 1.0          # four beams hold fewer blocks than four requests
    assert llm.stats().blocks_in_use == 0
