"""A step's image embeddings: which rows of the flat batch are image placeholders being
computed now, and the vision tower's rows for them (from the encoder cache).

The flat batch holds each scheduled sequence's new tokens, positions num_computed ..
num_computed + num_tokens - 1, in the runner's order (model_runner.order_batch). A span's
k-th placeholder token (counting the image token only, not the markers between crops) takes
row k of the image's embeddings; a chunk that begins or ends inside the span takes its slice,
so a prefill split anywhere (chunks, a prefix hit inside the image, a recompute) feeds the
model the same inputs as a prefill in one piece. Each lookup counts in its group's
`num_encoder_runs` / `num_encoder_hits` (the request's RequestMetrics).
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
            emb, cached = cache.embeddings(span)
            it.group.num_encoder_hits += cached
            it.group.num_encoder_runs += not cached
            rows.extend(base + placeholders[k] - start for k in wanted)
            parts.append(emb[wanted[0]:wanted[-1] + 1])     # placeholders in [start, end) are consecutive k
        base += it.num_tokens
    if not rows:
        return None
    return (torch.tensor(rows, dtype=torch.long, device=device),
            torch.cat(parts).to(device))


def open_runs(prefills: list[ScheduledSeq], image_token_id: int) -> list[list[tuple[int, int]]] | None:
    """Per prefill chunk (in `prefills`' order), the runs [lo, hi) of consecutive image tokens of
    its `whole` images (core.multimodal.ImageSpan): their tokens attend to each other both ways
    (models/attention.py: AttentionMetadata.open_runs), as transformers' token_type_ids groups
    them. None when no chunk holds one. The scheduler never ends a chunk inside a whole span
    (core.multimodal.chunk_tokens): a run may begin before the chunk (a prefix hit ended inside
    it; those keys are cached, computed with the whole image) and always ends in it; a span
    the chunk ends inside is a RuntimeError, never a silently causal image."""
    out: list[list[tuple[int, int]]] = []
    for it in prefills:
        start, end = it.seq.num_computed_tokens, it.seq.num_computed_tokens + it.num_tokens
        runs: list[tuple[int, int]] = []
        for span in it.seq.images:
            if not span.whole or span.end <= start or span.offset >= end:
                continue
            if span.end > end:
                raise RuntimeError(f"image at {span.offset}..{span.end - 1} is cut by the chunk "
                                   f"{start}..{end - 1}: its two-way attention needs it whole")
            tokens, p = it.seq.token_ids, span.offset
            while p < span.end:
                if tokens[p] != image_token_id:
                    p += 1
                    continue
                lo = p
                while p < span.end and tokens[p] == image_token_id:
                    p += 1
                runs.append((lo, p))
        out.append(runs)
    return out if any(out) else None
