"""A step's image embeddings: which rows of the flat batch are image placeholders being
computed now, and the vision tower's rows for them (from the encoder cache).

The flat batch holds each scheduled sequence's new tokens, positions num_computed ..
num_computed + num_tokens - 1, in the runner's order (model_runner.order_batch). A span's
k-th placeholder token (counting the image token only, not the markers between crops) takes
row k of the image's embeddings; a chunk that begins or ends inside the span takes its slice,
so a prefill split anywhere (chunks, a prefix hit inside the image, a recompute) feeds the
model the same inputs as a prefill in one piece.
"""

from __future__ import annotations

import torch

from localpaged.core.scheduler import ScheduledSeq
from localpaged.runner.encoder_cache import EncoderCache


def gather(items: list[ScheduledSeq], cache: EncoderCache, image_token_id: int,
           device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(batch rows [M], embeddings [M, hidden]) of the image placeholders in this step, in
    `items`' order; None when no scheduled token is one."""
    rows: list[int] = []
    parts: list[torch.Tensor] = []
    base = 0
    for it in items:
        start, end = it.seq.num_computed_tokens, it.seq.num_computed_tokens + it.num_tokens
        for span in it.seq.images:
            if span.end <= start or span.offset >= end:
                continue
            tokens = it.seq.token_ids
            placeholders = [p for p in range(span.offset, span.end) if tokens[p] == image_token_id]
            wanted = [k for k, p in enumerate(placeholders) if start <= p < end]
            if not wanted:
                continue
            emb = cache.embeddings(span)
            rows.extend(base + placeholders[k] - start for k in wanted)
            parts.append(emb[wanted[0]:wanted[-1] + 1])     # placeholders in [start, end) are consecutive k
        base += it.num_tokens
    if not rows:
        return None
    return (torch.tensor(rows, dtype=torch.long, device=device),
            torch.cat(parts).to(device))
