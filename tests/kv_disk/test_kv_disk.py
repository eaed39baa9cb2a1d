"""The KV disk tier's store (runner/kv_disk.py): blocks written and read back by hash across a
restart, and every way a file can be wrong is a miss, never data or an exception: damaged,
truncated, another fingerprint, another layout, a full disk, an unwritable folder; the size
limit holds, least recently used first."""

from __future__ import annotations

import errno
import logging
import os

import pytest
import torch

from localpaged.runner import kv_disk
from localpaged.runner.kv_disk import KVDiskStore, fingerprint

SHAPE = (3, 2, 4, 2, 8)          # layers, K/V, block size, KV heads, head dim
FP = fingerprint(model="tiny", dtype="float32", block_size=4)


def block(seed: int, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(SHAPE, generator=torch.Generator().manual_seed(seed)).to(dtype)


def h(i: int) -> bytes:
    return bytes([i]) * 32


def written(store: KVDiskStore, *pairs) -> KVDiskStore:
    for key, data in pairs:
        store.put(key, data)
    store.flush()
    return store


def files(store: KVDiskStore) -> list[str]:
    return [os.path.join(d, f) for d, _, fs in os.walk(store.folder) for f in fs]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8], ids=str)
def test_blocks_come_back_after_a_restart(tmp_path, dtype):
    data = block(1, dtype) if dtype != torch.int8 else torch.randint(-128, 127, SHAPE, dtype=dtype)
    written(KVDiskStore(str(tmp_path), FP, 1 << 20), (h(1), data))
    again = KVDiskStore(str(tmp_path), FP, 1 << 20)        # a new process: the index is rebuilt
    assert again.contains(h(1)) and not again.contains(h(2))
    assert torch.equal(again.get(h(1), data), data)
    assert again.get(h(2), data) is None
    assert (again.stats().hits, again.stats().misses) == (1, 1)


def test_groups_are_separate_keys(tmp_path):
    store = written(KVDiskStore(str(tmp_path), FP, 1 << 20), (h(1), block(1)))
    assert store.get(h(1), block(0), group=1) is None
    store.put(h(1), block(2), group=1)
    store.flush()
    assert torch.equal(store.get(h(1), block(0), group=1), block(2))
    assert torch.equal(store.get(h(1), block(0)), block(1))


@pytest.mark.parametrize("damage", ["flipped byte", "truncated", "empty", "bad magic"])
def test_a_damaged_file_is_a_miss_and_is_dropped(tmp_path, damage, caplog):
    store = written(KVDiskStore(str(tmp_path), FP, 1 << 20), (h(1), block(1)))
    [path] = files(store)
    raw = bytearray(open(path, "rb").read())
    raw = {"flipped byte": lambda r: r[:-5] + bytes([r[-5] ^ 1]) + r[-4:],
           "truncated": lambda r: r[:len(r) // 2], "empty": lambda r: b"",
           "bad magic": lambda r: b"XXXX" + r[4:]}[damage](raw)
    open(path, "wb").write(raw)
    again = KVDiskStore(str(tmp_path), FP, 1 << 20)
    with caplog.at_level(logging.WARNING, logger=kv_disk.__name__):
        assert again.get(h(1), block(0)) is None
    assert not os.path.exists(path) and not again.contains(h(1))
    assert again.stats().num_bytes == 0


def test_another_fingerprint_or_layout_never_hits(tmp_path):
    written(KVDiskStore(str(tmp_path), FP, 1 << 20), (h(1), block(1)))
    other = KVDiskStore(str(tmp_path), fingerprint(model="tiny", dtype="bfloat16", block_size=4), 1 << 20)
    assert not other.contains(h(1)) and other.get(h(1), block(0)) is None
    same = KVDiskStore(str(tmp_path), FP, 1 << 20)
    assert same.get(h(1), torch.zeros(3, 2, 4, 2, 16)) is None      # the length tells


def test_the_size_limit_drops_the_least_recently_used(tmp_path):
    one = kv_disk.HEADER.size + block(0).numel() * 4
    store = KVDiskStore(str(tmp_path), FP, 3 * one)
    written(store, *[(h(i), block(i)) for i in range(3)])
    assert store.get(h(0), block(0)) is not None            # h(0) is now the most recent
    written(store, (h(3), block(3)), (h(4), block(4)))
    assert [store.contains(h(i)) for i in range(5)] == [True, False, False, True, True]
    assert store.stats().num_bytes == 3 * one == sum(os.path.getsize(f) for f in files(store))


def test_an_unwritable_folder_turns_the_tier_off(tmp_path, caplog):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with caplog.at_level(logging.WARNING, logger=kv_disk.__name__):
        store = KVDiskStore(str(not_a_dir), FP, 1 << 20)
    assert not store.usable and "KV disk tier off" in caplog.text
    store.put(h(1), block(1))
    store.flush()
    assert store.get(h(1), block(0)) is None and store.stats().writes == 0


def test_a_full_disk_drops_writes_with_one_warning(tmp_path, monkeypatch, caplog):
    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")
    store = KVDiskStore(str(tmp_path), FP, 1 << 20)
    monkeypatch.setattr(kv_disk.os, "replace", full)
    with caplog.at_level(logging.WARNING, logger=kv_disk.__name__):
        written(store, (h(1), block(1)), (h(2), block(2)))
    assert store.stats().dropped == 2 and store.stats().writes == 0
    assert caplog.text.count("No space left") == 1
    assert files(store) == []                                 # no temporary file left behind
    monkeypatch.undo()
    written(store, (h(3), block(3)))                          # the tier goes on once there is room
    assert torch.equal(store.get(h(3), block(0)), block(3))


def test_clear_deletes_every_block(tmp_path):
    store = written(KVDiskStore(str(tmp_path), FP, 1 << 20), (h(1), block(1)), (h(2), block(2)))
    store.clear()
    assert files(store) == [] and store.stats().num_blocks == 0
    assert KVDiskStore(str(tmp_path), FP, 1 << 20).stats().num_blocks == 0
