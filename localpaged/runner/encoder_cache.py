"""The encoder cache: a vision tower's output per image content hash, so that an image whose
KV blocks are not (or no longer) in the prefix cache does not run the tower again: a prefill
after preemption by recompute, a prefix hit that ends inside the image, a chunked prefill
that reaches the image over several steps, a regenerate after its blocks were evicted.

Bounded by bytes, least recently used out first. An entry is the tower's whole output for the
image ([placeholder tokens, hidden], on the model's device): the tower runs once per image,
never per chunk. `runs` counts tower runs, `hits` the lookups it answered (EngineStats; each
request's own in its RequestMetrics).
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from localpaged.core.multimodal import ImageSpan
from localpaged.models.vision import ImagePixels, VisionTower

DEFAULT_BYTES = 256 * 2**20


class EncoderCache:
    def __init__(self, tower: VisionTower, max_bytes: int = DEFAULT_BYTES) -> None:
        self.tower = tower
        self.max_bytes = max_bytes
        self.entries: OrderedDict[bytes, torch.Tensor] = OrderedDict()   # oldest use first
        self.bytes = 0
        self.runs = 0
        self.hits = 0

    def embeddings(self, span: ImageSpan) -> tuple[torch.Tensor, bool]:
        """The tower's output for the span's image, run now only if not cached; and whether
        it was cached."""
        cached = self.entries.get(span.content_hash)
        if cached is not None:
            self.entries.move_to_end(span.content_hash)
            self.hits += 1
            return cached, True
        pixels = span.pixels
        if not isinstance(pixels, ImagePixels):
            raise TypeError(f"image span at {span.offset}: pixels must be ImagePixels, "
                            f"got {type(pixels).__name__}")
        out = self.tower.encode(pixels)
        self.runs += 1
        if out.shape[0] != span.num_embeddings:
            raise ValueError(f"the vision tower gave {out.shape[0]} embeddings for an image "
                             f"with {span.num_embeddings} placeholder tokens")
        self._put(span.content_hash, out)
        return out, False

    def _put(self, key: bytes, value: torch.Tensor) -> None:
        size = value.numel() * value.element_size()
        if size > self.max_bytes:
            return                      # larger than the whole cache: used once, not kept
        self.entries[key] = value
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, old = self.entries.popitem(last=False)
            self.bytes -= old.numel() * old.element_size()

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = 0
