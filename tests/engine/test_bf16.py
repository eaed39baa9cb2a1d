"""bf16 output compared with fp32 (the engine's own fp32 run is the oracle; fp32 itself equals
transformers, tests/engine/test_hf_equality.py).

The tiny random model's output head is scaled up so that its next-token distribution is peaked
like a trained model's (top logprobs around -0.3 to -3), where bf16 rounding shows.

Tolerance rule: bf16 keeps 8 significant bits, so each logprob may move by at most TOL nats. Per
sequence, walk the greedy steps while the two runs agree: the chosen token's logprob must be
within TOL of fp32's; a different token is allowed only at a step where fp32's top-2 margin is
under 2 * TOL (a near-tie that the allowed error can flip), and the comparison of that sequence
ends there (the contexts differ after it). Most steps must be compared, or the test says nothing.
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from helpers.engine_helpers import greedy, prompts
from transformers import AutoModelForCausalLM

from localpaged import LLM

TOL = 0.1            # nats; bf16 vs fp32 differences measured here stay under 0.05
STEPS = 24


@pytest.fixture(scope="module")
def sharp_model(tiny_llama, tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("sharp") / "llama-sharp")
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    model.save_pretrained(path)
    for name in os.listdir(tiny_llama):
        if "token" in name:                      # the tokenizer files
            shutil.copy(os.path.join(tiny_llama, name), path)
    return path


def test_bf16_greedy_matches_fp32_within_tolerance(sharp_model):
    batch = prompts(6, seed=81, lo=6, hi=30)
    runs = {}
    for dtype in ("float32", "bfloat16"):
        llm = LLM(sharp_model, num_kv_blocks=64, dtype=dtype)
        runs[dtype] = [o.outputs[0] for o in llm.generate(batch, greedy(STEPS, logprobs=2))]
        assert llm.stats().blocks_in_use == 0
    compared, diffs, chosen = 0, [], []
    for ref, low in zip(runs["float32"], runs["bfloat16"]):
        for a, b in zip(ref.logprobs, low.logprobs):
            top2 = sorted(a.top.values(), reverse=True)[:2]
            if a.token_id != b.token_id:
                assert top2[0] - top2[1] < 2 * TOL, (a, b)
                break
            assert abs(a.logprob - b.logprob) <= TOL, (a, b)
            diffs.append(abs(a.logprob - b.logprob))
            chosen.append(a.logprob)
            compared += 1
    assert compared >= len(batch) * STEPS // 2
    assert sum(chosen) / len(chosen) > -4.0      # peaked: uniform over 512 ids would be -6.2
    assert max(diffs) > 0                        # bf16 really ran (it rounds differently)
