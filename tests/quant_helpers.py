"""Logits of every position of a token sequence from an engine's model (one fresh prefill).

Used for perplexity and teacher-forced comparisons; needs an engine with no request running
(the prefill writes blocks 0.. of its KV cache).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from localpaged.attention import AttentionMetadata


@torch.inference_mode()
def sequence_logits(llm, ids: list[int]) -> torch.Tensor:
    eng = llm.engine
    T, B = len(ids), eng.config.block_size
    nb = -(-T // B)
    assert nb <= eng.kv_cache.num_blocks if hasattr(eng.kv_cache, "num_blocks") else True
    i32 = dict(dtype=torch.int32, device=eng.device)
    meta = AttentionMetadata(
        slot_mapping=torch.arange(T, dtype=torch.long, device=eng.device), num_decode_tokens=0,
        decode_block_tables=torch.zeros((0, 0), **i32), decode_seq_lens=torch.zeros(0, **i32),
        prefill_block_tables=torch.arange(nb, **i32).view(1, nb),
        prefill_query_start_loc=torch.tensor([0, T], **i32), prefill_seq_lens=torch.tensor([T], **i32))
    hidden = eng.model(torch.tensor(ids, device=eng.device), torch.arange(T, device=eng.device),
                       eng.kv_cache.layers, meta, eng.backend)
    return eng.model.compute_logits(hidden).float().cpu()


def perplexity(llm, ids: list[int]) -> float:
    logits = sequence_logits(llm, ids)
    nll = F.cross_entropy(logits[:-1], torch.tensor(ids[1:]), reduction="mean")
    return float(torch.exp(nll))
