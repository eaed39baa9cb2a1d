"""The disk tier for models with sliding-window layers (core.disk_prefix over the hybrid
manager's groups): every KV-cache group keeps its own blocks on disk, a new engine reads back a
hit valid in every group, and the reply equals transformers' token for token; a hit whose
sliding group's blocks are damaged shrinks to what every group can serve; reading ahead of a
request (`LLMEngine.prefetch`, a tab opened) fills free blocks only, and the request's tokens
from it still count as "from disk". Block invariants checked after every step."""

from __future__ import annotations

import os

import pytest
from helpers import tiny_models
from helpers.engine_helpers import greedy, hf_greedy, prompts
from transformers import AutoConfig

from localpaged import LLM
from localpaged.core.hybrid_kv_cache_manager import HybridKVCacheManager
from localpaged.core.request import Sequence

KINDS = ["qwen2-sliding", "mistral-sliding", "gemma3"]   # full + sliding; all sliding; Gemma 3
N_NEW = 12


def disk_engine(path: str, folder, **kw) -> LLM:
    return LLM(path, num_kv_blocks=96, block_size=4, kv_disk_dir=str(folder), debug_checks=True,
               **kw)


def conversation(path: str, seed: int) -> tuple[list[int], list[int]]:
    """A first turn of about 3 windows, and the next turn: it, its greedy reply, more tokens."""
    window = AutoConfig.from_pretrained(path).sliding_window
    first = prompts(1, seed=seed, lo=3 * window, hi=3 * window + 1)[0]
    return first, first + hf_greedy(path, first, N_NEW) + prompts(1, seed=seed + 1, lo=9, hi=10)[0][1:]


def first_turn(path: str, folder, prompt: list[int]) -> None:
    """An app's first life: one turn, its blocks written out when it ends."""
    llm = disk_engine(path, folder)
    assert llm.generate([prompt], greedy(N_NEW))[0].outputs[0].token_ids == hf_greedy(path, prompt, N_NEW)
    llm.engine.kv_disk.flush()
    assert isinstance(llm.engine.block_manager, HybridKVCacheManager)
    groups = {name.split(".")[1] for _, _, names in os.walk(llm.engine.kv_disk.folder) for name in names}
    assert groups == {str(g) for g in range(len(llm.engine.block_manager.groups))}


@pytest.mark.parametrize("kind", KINDS)
def test_the_next_turn_after_a_restart_reads_every_group_back(kind, tiny_root, tmp_path):
    path = tiny_models.build(kind, tiny_root)
    first, second = conversation(path, seed=31)
    first_turn(path, tmp_path, first)
    llm = disk_engine(path, tmp_path)                                # "after a restart"
    out = llm.generate([second], greedy(N_NEW))[0]
    assert out.outputs[0].token_ids == hf_greedy(path, second, N_NEW)
    window = AutoConfig.from_pretrained(path).sliding_window
    assert out.metrics.num_cached_tokens > 2 * window                # past the window: sliding blocks came back
    assert out.metrics.num_disk_tokens == out.metrics.num_cached_tokens
    assert llm.stats().prefix_cache_disk_hits == out.metrics.num_disk_tokens
    assert llm.engine.num_tokens_computed < len(second) - 2 * window + N_NEW


def test_damaged_sliding_blocks_shrink_the_hit(tiny_root, tmp_path):
    path = tiny_models.build("qwen2-sliding", tiny_root)
    first, second = conversation(path, seed=32)
    first_turn(path, tmp_path, first)
    for folder, _, names in os.walk(tmp_path):
        for name in names:
            if name.endswith(".1.kv"):                   # the sliding group's files only
                with open(os.path.join(folder, name), "r+b") as f:
                    f.seek(-1, os.SEEK_END)
                    byte = f.read(1)
                    f.seek(-1, os.SEEK_END)
                    f.write(bytes([byte[0] ^ 0xFF]))
    llm = disk_engine(path, tmp_path)
    out = llm.generate([second], greedy(N_NEW))[0]
    assert out.outputs[0].token_ids == hf_greedy(path, second, N_NEW)
    # group 0 alone could serve the whole prefix; no sliding block checks out, so no hit is valid
    assert out.metrics.num_cached_tokens == 0
    assert llm.stats().kv_disk.misses > 0


@pytest.mark.parametrize("kind", ["qwen2-sliding", "gemma3"])
def test_prefetch_reads_ahead_and_counts_as_disk(kind, tiny_root, tmp_path):
    path = tiny_models.build(kind, tiny_root)
    first, second = conversation(path, seed=33)
    first_turn(path, tmp_path, first)
    llm = disk_engine(path, tmp_path)
    engine = llm.engine
    shown = second[:len(first) + N_NEW]                       # what the opened tab holds
    read = 0
    while (step := engine.prefetch(shown, max_blocks=5)):     # a few blocks at a time
        assert step <= 5
        read += step
    assert read > 0 and engine.stats().kv_disk.hits == read
    assert engine.cached_prefix_tokens(second) > 0            # in memory before the send
    out = llm.generate([second], greedy(N_NEW))[0]
    assert out.outputs[0].token_ids == hf_greedy(path, second, N_NEW)
    assert out.metrics.num_disk_tokens == out.metrics.num_cached_tokens > 0
    assert engine.stats().kv_disk.hits == read                 # nothing read twice
    again = llm.generate([second], greedy(N_NEW))[0]           # now plain memory hits
    assert again.metrics.num_cached_tokens > 0 and again.metrics.num_disk_tokens == 0


def test_prefetch_never_evicts_what_memory_caches():
    """Read ahead only into free blocks that cache nothing: a cached block stays findable."""
    class Disk:                                   # holds every block, any hash
        def contains(self, h, group):
            return True

        def load(self, h, group):
            return b"bytes"

        def save(self, h, group, block_id):
            pass

    kv = HybridKVCacheManager((0, 8), [12, 12], block_size=4)
    kv.attach_disk(Disk())
    cached = Sequence(list(range(100, 120)), 20, 0, None)
    kv.admit([cached], 20)
    cached.num_computed_tokens = 20
    kv.cache_full_blocks(cached)
    kv.free(cached)                               # 5 cached blocks in group 0
    before = kv.cached_prefix_length(list(range(100, 120)))
    read = kv.prefetch(list(range(40)))           # 10 blocks wanted, 12 - 5 - watermark free
    assert 0 < read
    assert kv.cached_prefix_length(list(range(100, 120))) == before > 0
    kv.take_block_ops()
    kv.check(expect_empty=True)
