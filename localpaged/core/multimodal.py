"""Images in a prompt, as block accounting and scheduling see them: where an image's
placeholder tokens lie and which image it is.

A prompt with images holds, per image, a run of placeholder tokens (the model's image token,
possibly with marker tokens between them: Idefics3 puts a row/column tag before each crop's
placeholders) whose input embeddings are the vision tower's output instead of the token
embedding. Two prompts with the same token ids but different images must never share K/V, so
the image's content hash is part of the key of every block its span touches, as vLLM's
multimodal hashes are: `block_extra_key` gives it to `prefix_cache.hash_block`'s `extra`,
and `token_keys` stands in for the tokens where a prefix hit ends inside a block
(core.partial_prefix compares them position by position).

Invariants:
- spans of one sequence are sorted, disjoint, and lie inside its prompt;
- a block's chain hash covers the content hash of every image whose span overlaps it, so a
  cached block is found again only by a prompt with the same tokens and the same images at
  the same positions (the positions are fixed by the chain of token ids before them);
- a `whole` span (an image whose tokens attend to each other both ways) is computed in one
  step: no prefill chunk ends strictly inside it (`chunk_tokens`), so the K/V of every cached
  block holding its tokens were computed with the whole image in view. A prefix hit may end
  inside it: the rest of the span is then one chunk whose tokens attend both ways to the
  cached ones and to each other (runner/image_batch.py: open_runs), which gives the K/V a
  prefill in one piece gives.
`pixels` is what the model's vision tower takes for the image: opaque here (the runner's).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ImageSpan:
    """One image of a prompt: positions offset .. offset + length - 1 hold its expansion: its
    `num_embeddings` placeholder tokens and the marker tokens around and between them."""
    offset: int
    length: int
    content_hash: bytes
    num_embeddings: int              # placeholder tokens in the span: rows of the tower's output
    # True where the model attends bidirectionally within the image (Gemma 3): what is left of
    # its span to compute is computed in one step, never split by a prefill chunk.
    whole: bool = False
    pixels: object = field(default=None, compare=False, repr=False)

    @property
    def end(self) -> int:
        return self.offset + self.length


def check_spans(spans: tuple[ImageSpan, ...], prompt_len: int) -> None:
    """A ValueError unless the spans are sorted, disjoint, non-empty and inside the prompt."""
    last_end = 0
    for i, span in enumerate(spans):
        if span.length <= 0 or span.offset < last_end or span.end > prompt_len:
            raise ValueError(f"image {i}: its placeholder tokens (positions {span.offset} .. "
                             f"{span.end - 1}) must lie in the prompt, after the image before it")
        last_end = span.end


def block_extra_key(spans: tuple[ImageSpan, ...], start: int, end: int) -> bytes:
    """The content hashes of the images whose spans overlap positions start .. end - 1, in
    order (b"" where none does): the `extra` key of the block holding those positions."""
    return b"".join(s.content_hash for s in spans if s.offset < end and start < s.end)


def token_keys(token_ids: list[int], spans: tuple[ImageSpan, ...], start: int,
               end: int) -> list[int | tuple[int, bytes]]:
    """token_ids[start:end], each position inside an image's span keyed by (token, content
    hash): equal keys mean equal K/V inputs, position by position."""
    keys: list[int | tuple[int, bytes]] = list(token_ids[start:end])
    for s in spans:
        for p in range(max(start, s.offset), min(end, s.end)):
            keys[p - start] = (token_ids[p], s.content_hash)
    return keys


def whole_span_end(spans: tuple[ImageSpan, ...], start: int, end: int) -> int:
    """Where a chunk of positions start .. end - 1 may end so that it splits no `whole` span:
    `end` itself, or the start of the span it would cut (which may be `start`: the span does
    not fit in this chunk)."""
    for s in spans:
        if s.whole and s.offset < end < s.end:
            return max(start, s.offset)
    return end


def chunk_tokens(spans: tuple[ImageSpan, ...], start: int, num_tokens: int, grow: bool = True) -> int:
    """How many of the next `num_tokens` positions from `start` a prefill chunk computes so that
    it splits no `whole` span: all of them, or those before the span it would cut; where that
    leaves none (the chunk starts at or, after a prefix hit, inside a span that does not fit
    the budget) the chunk is the rest of that span when `grow` (a step then exceeds its token
    budget by at most one span), else 0."""
    if num_tokens <= 0 or not spans:
        return num_tokens
    end = whole_span_end(spans, start, start + num_tokens)
    if end == start and grow:
        end = next(s.end for s in spans if s.whole and s.offset <= start < s.end)
    return end - start
