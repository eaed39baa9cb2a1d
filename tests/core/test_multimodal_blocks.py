"""Block accounting with images (core/multimodal.py): a block holding an image's placeholder
tokens is keyed by the image's content hash too, for whole-block and inside-block hits alike.
Oracle: the hash chain and the common prefixes written out here from the definitions."""

import pytest

from localpaged.core.kv_cache_manager import KVCacheManager
from localpaged.core.prefix_cache import hash_block
from localpaged.core.multimodal import (ImageSpan, block_extra_key, check_spans, chunk_tokens,
                                        token_keys, whole_span_end)
from localpaged.core.request import Sequence

B = 4
IMG = 99


def seq_with(image_hash: bytes | None, tokens: list[int], span=(5, 6)) -> Sequence:
    seq = Sequence(tokens, len(tokens), 0, None)
    if image_hash is not None:
        seq.images = (ImageSpan(span[0], span[1], image_hash, span[1]),)
    return seq


def compute_all(kv: KVCacheManager, seq: Sequence) -> None:
    hits = kv.find_cached_prefix(seq)
    n = len(seq.token_ids) - kv.hit_tokens(hits)
    assert kv.allocate_slots(seq, n, hits)
    seq.num_computed_tokens = len(seq.token_ids)
    kv.cache_full_blocks(seq)


TOKENS = [1, 2, 3, 4, 5] + [IMG] * 6 + [7, 8, 9, 10, 11, 12]     # image at 5..10: blocks 1, 2


def test_chain_hash_carries_the_images_of_each_block():
    kv = KVCacheManager(16, B)
    seq = seq_with(b"A", TOKENS)
    expected, parent = [], None
    for i in range(4):
        block = TOKENS[i * B:(i + 1) * B]
        extra = b"A" if i in (1, 2) else b""
        parent = hash_block(parent, block, extra)
        expected.append(parent)
    assert kv.block_hashes(seq, 4) == expected
    assert kv.block_hashes(seq_with(None, TOKENS), 1) == expected[:1]   # before the image: as text


def test_another_image_hits_only_the_blocks_before_it():
    kv = KVCacheManager(32, B)
    compute_all(kv, seq_with(b"A", TOKENS))
    same = seq_with(b"A", list(TOKENS))
    assert kv.hit_tokens(kv.find_cached_prefix(same)) == len(TOKENS) - 1
    other = seq_with(b"B", list(TOKENS))
    hits = kv.find_cached_prefix(other)
    # block 0 whole, then a tail hit of token 4 only (position 5 is the other image's)
    assert len(hits) == 1 and kv.hit_tokens(hits) == 5
    text = seq_with(None, list(TOKENS))                 # the same ids, no image: no image block
    assert kv.hit_tokens(kv.find_cached_prefix(text)) == 5


def test_token_keys_and_extra_keys():
    spans = (ImageSpan(2, 3, b"X", 3), ImageSpan(6, 2, b"Y", 2))
    ids = list(range(10))
    assert token_keys(ids, spans, 0, 8) == [0, 1, (2, b"X"), (3, b"X"), (4, b"X"), 5,
                                            (6, b"Y"), (7, b"Y")]
    assert block_extra_key(spans, 0, 4) == b"X" and block_extra_key(spans, 4, 8) == b"XY"
    assert block_extra_key(spans, 8, 12) == b""
    check_spans(spans, 8)
    with pytest.raises(ValueError, match="image 1"):
        check_spans(spans, 7)
    with pytest.raises(ValueError, match="image 1"):
        check_spans((spans[0], ImageSpan(4, 2, b"Z", 2)), 10)


def test_whole_span_end_never_cuts_a_bidirectional_image():
    spans = (ImageSpan(4, 6, b"X", 6, whole=True), ImageSpan(12, 3, b"Y", 3))
    assert whole_span_end(spans, 0, 7) == 4         # stops before the image
    assert whole_span_end(spans, 4, 7) == 4         # the image does not fit: nothing this chunk
    assert whole_span_end(spans, 4, 10) == 10       # the whole image
    assert whole_span_end(spans, 10, 13) == 13      # a causal image may be cut


def test_chunk_tokens_keeps_a_bidirectional_image_whole():
    spans = (ImageSpan(4, 6, b"X", 6, whole=True), ImageSpan(12, 3, b"Y", 3))
    assert chunk_tokens(spans, 0, 7) == 4              # up to the image
    assert chunk_tokens(spans, 4, 3) == 6              # the image alone, past a budget of 3
    assert chunk_tokens(spans, 4, 3, grow=False) == 0  # or nothing where the budget is strict
    assert chunk_tokens(spans, 7, 2) == 3              # after a hit inside it: the rest of it
    assert chunk_tokens(spans, 4, 8) == 8              # the image and what follows
    assert chunk_tokens(spans, 10, 3) == 3             # a causal image may be cut
    assert chunk_tokens((), 0, 5) == 5 and chunk_tokens(spans, 0, 0) == 0
