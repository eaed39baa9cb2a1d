"""Admission of waiting sequences into a block manager (`admit_seqs`): each sequence's prefix
hits, then its first chunk's blocks; all or nothing.

It drives KVCacheManager.admit and HybridKVCacheManager.admit alike through the manager's own
calls (find_cached_prefix / no_hits, hit_tokens, fits_admission, allocate_slots,
reset_computed), so the rule is written once for one KV-cache group or several.
Invariants: on failure nothing stays held (every sequence admitted so far is reset); a chunk
never ends strictly inside an image's tokens (core.multimodal.chunk_tokens); the watermark stays
free (`fits_admission`).
"""

from __future__ import annotations

from localpaged.core.multimodal import chunk_tokens
from localpaged.core.request import Sequence


def admit_seqs(manager, seqs: list[Sequence], budget: int, use_prefix_cache: bool) -> list[int] | None:
    """`admit` for a KVCacheManager or a HybridKVCacheManager (whose hits are one list per
    group, every list as long as the hit): prefix hits, then allocation; all or nothing."""
    admitted: list[Sequence] = []
    cached_tokens: list[int] = []
    disk_tokens: list[int] = []
    for seq in seqs:
        manager.last_disk_tokens = 0
        hits = manager.find_cached_prefix(seq) if use_prefix_cache else manager.no_hits()
        num_cached = manager.hit_tokens(hits)
        disk_tokens.append(manager.last_disk_tokens)
        n = chunk_tokens(seq.images, seq.num_computed_tokens + num_cached,
                         min(seq.num_uncomputed_tokens - num_cached, budget))
        if not manager.fits_admission(seq, n, hits) or not manager.allocate_slots(seq, n, hits):
            for s in admitted:
                manager.reset_computed(s)
            return None
        admitted.append(seq)
        cached_tokens.append(num_cached)
        budget -= n
    manager.admitted_disk_tokens = disk_tokens
    return cached_tokens
