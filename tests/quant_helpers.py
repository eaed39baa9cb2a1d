"""Logits of every position of a token sequence from an engine's model (one fresh prefill).

Used for teacher-forced comparisons (perplexity goes through prompt logprobs:
localpaged.runner.prompt_logprobs.perplexity); needs an engine with no request running
(the prefill writes blocks 0.. of its KV cache).
"""

from __future__ import annotations

import torch

from localpaged.models.attention import AttentionMetadata


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


def compare_where_margins_allow(ref_llm, llm, prompt: list[int], ref_ids: list[int], got: list[int],
                                margin: float) -> int:
    """Greedy `got` equals the reference's `ref_ids` up to the first step whose reference top-2
    logit margin is below `margin`, and teacher-forced over prompt + reply every clear reference
    winner stays the winner; the logits differ by < margin / 2. Returns how many tokens were
    compared (so a caller can check the rule left real ones)."""
    lf, lq = sequence_logits(ref_llm, prompt + ref_ids), sequence_logits(llm, prompt + ref_ids)
    assert (lf - lq).abs().max() < margin / 2
    top2 = lf[len(prompt) - 1:-1].topk(2, dim=-1).values
    close = ((top2[:, 0] - top2[:, 1]) < margin).nonzero()
    upto = int(close[0]) if len(close) else len(ref_ids)
    assert got[:upto] == ref_ids[:upto]
    top2 = lf.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) >= margin
    assert torch.equal(lf.argmax(-1)[clear], lq.argmax(-1)[clear])
    return upto + int(clear.sum())
