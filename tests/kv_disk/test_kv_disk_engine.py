"""The disk tier in the engine (EngineConfig.kv_disk_dir): a prompt's full blocks outlive the
engine that computed them, and a new engine reads them back instead of recomputing, with
exactly the tokens of an engine without a disk tier; a damaged block file is a miss, never a
wrong token; the block invariants hold throughout (debug_checks)."""

from __future__ import annotations

import os

from helpers.engine_helpers import greedy, prompts

from localpaged import LLM


def disk_engine(path: str, folder, **kw) -> LLM:
    return LLM(path, num_kv_blocks=64, kv_disk_dir=str(folder), debug_checks=True, **kw)


def test_a_new_engine_reads_the_prefix_back_from_disk(tiny_llama, tmp_path):
    prompt = prompts(1, seed=21, lo=70, hi=71)[0]
    plain = LLM(tiny_llama, num_kv_blocks=64).generate([prompt], greedy(16))[0].outputs[0].token_ids
    first = disk_engine(tiny_llama, tmp_path)
    assert first.generate([prompt], greedy(16))[0].outputs[0].token_ids == plain
    first.engine.kv_disk.flush()
    assert first.stats().kv_disk.num_blocks == (70 + 16 - 1) // 16   # the full blocks computed
    second = disk_engine(tiny_llama, tmp_path)                      # "after a restart"
    out = second.generate([prompt], greedy(16))[0]
    assert out.outputs[0].token_ids == plain
    stats = second.stats()
    assert stats.prefix_cache_disk_hits == (70 - 1) // 16 * 16 == out.metrics.num_cached_tokens
    assert stats.kv_disk.hits == (70 - 1) // 16
    assert second.engine.num_tokens_computed < 70


def test_a_damaged_block_file_is_a_miss(tiny_llama, tmp_path):
    prompt = prompts(1, seed=22, lo=70, hi=71)[0]
    first = disk_engine(tiny_llama, tmp_path)
    want = first.generate([prompt], greedy(16))[0].outputs[0].token_ids
    first.engine.kv_disk.flush()
    folder = first.engine.kv_disk.folder
    for sub, _, files in os.walk(folder):
        for name in files:                       # every block file: one byte flipped
            path = os.path.join(sub, name)
            raw = bytearray(open(path, "rb").read())
            raw[-1] ^= 0xFF
            open(path, "wb").write(bytes(raw))
    second = disk_engine(tiny_llama, tmp_path)
    assert second.generate([prompt], greedy(16))[0].outputs[0].token_ids == want
    assert second.stats().prefix_cache_disk_hits == 0


def test_another_model_never_hits(tiny_root, tiny_llama, tmp_path):
    from helpers import tiny_models
    prompt = prompts(1, seed=23, lo=70, hi=71)[0]
    first = disk_engine(tiny_llama, tmp_path)
    first.generate([prompt], greedy(4))
    first.engine.kv_disk.flush()
    other = disk_engine(tiny_models.build("qwen2-bias", tiny_root), tmp_path)
    other.generate([prompt], greedy(4))
    assert other.stats().prefix_cache_disk_hits == 0
    again = disk_engine(tiny_llama, tmp_path, dtype="bfloat16")      # other bytes per block
    again.generate([prompt], greedy(4))
    assert again.stats().prefix_cache_disk_hits == 0
