"""The engine on the Triton backend gives the same tokens as on the torch backend.

On CPU the kernels run under TRITON_INTERPRET=1 (set in conftest.py), on CUDA natively. The batch
includes a prefix-cache hit (prefill over cached blocks) and parallel samples whose shared last
block is copied on write (the batched block-copy kernel).
"""

import pytest
import torch
from helpers.engine_helpers import greedy, prompts, token_ids

from localpaged import LLM, SamplingParams


@pytest.mark.parametrize("block_size", [8, 16])
def test_triton_backend_equals_torch_backend(tiny_llama, block_size):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    batch = prompts(3, seed=9, lo=40, hi=60)
    shared = batch[0][:2 * block_size + 3]
    work = batch + [shared + [7, 8, 9]]                    # hits the cached blocks of batch[0]
    results = {}
    for backend in ("torch", "triton"):
        llm = LLM(tiny_llama, num_kv_blocks=64, block_size=block_size, attention_backend=backend,
                  device=device)
        first = token_ids(llm.generate(work, greedy(6)))
        forked = token_ids(llm.generate([batch[1]], SamplingParams(n=3, temperature=1.0, seed=2,
                                                                   max_tokens=6)))
        results[backend] = (first, forked, llm.stats().prefix_cache_hits)
        assert llm.stats().blocks_in_use == 0
    assert results["triton"] == results["torch"]
    assert results["torch"][2] >= 2 * block_size
