"""KVDiskStore: full KV blocks on disk, keyed by their chain hash, so a prefix outlives the app.

A block's chain hash (core.prefix_cache.hash_block) names its tokens and every token before
them; the same tokens under another model, weights file, dtype or layout must never hit, so the
store lives in a folder named by a fingerprint of all of those (`fingerprint`), under the data
directory: <root>/<fingerprint>/<first two hex digits>/<hash hex>.<group>.kv.

A block file: MAGIC, the payload's length, its BLAKE2b digest, then the payload (the block's
K/V bytes for every layer of its KV-cache group, as KVCache holds them). Invariants:
- a file is written to a temporary name and renamed, so a reader sees a whole file or none;
- a file whose magic, length or digest does not match is a miss (and is deleted), never data;
- `index` lists exactly the files of this fingerprint, least recently used first, and their
  sizes sum to `num_bytes` <= `max_bytes` after every write (older files are deleted first).
Writes run on one background thread behind a bounded queue: `put` never blocks the engine; a
full queue, a full disk or an unwritable folder drops the write with a warning (logged once per
cause), never an exception to the caller.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

MAGIC = b"LPKV\x01"
HEADER = struct.Struct("<5sQ16s")          # magic, payload length, BLAKE2b-128 of the payload
LAYOUT_VERSION = 1                         # bump when the payload layout changes


def fingerprint(**identity) -> str:
    """A folder name for everything that decides a block's bytes: the weights file (path, size,
    modification time), weights format, dtype, KV dtype, block size, layer shapes, groups."""
    blob = json.dumps({"layout": LAYOUT_VERSION, **identity}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def weights_identity(folder: str, gguf_file: str | None) -> list[tuple[str, int, int]]:
    """(path, size, modification time) of the model's weight files: the GGUF file, or every
    safetensors file of the folder. Other weights under the same name never hit."""
    names = [gguf_file] if gguf_file else sorted(n for n in os.listdir(folder) if n.endswith(".safetensors"))
    out = []
    for name in names:
        st = os.stat(os.path.join(folder, name))
        out.append((os.path.abspath(os.path.join(folder, name)), st.st_size, st.st_mtime_ns))
    return out


@dataclass(frozen=True)
class DiskStats:
    num_blocks: int
    num_bytes: int
    max_bytes: int
    hits: int                # blocks read back
    misses: int              # lookups that found no (valid) file
    writes: int
    dropped: int             # writes not done: queue full, disk full, folder unwritable


class KVDiskStore:
    def __init__(self, root: str, fingerprint: str, max_bytes: int, queue_blocks: int = 256) -> None:
        self.folder = os.path.join(root, fingerprint)
        self.max_bytes = max_bytes
        self.index: OrderedDict[str, int] = OrderedDict()     # file name -> bytes, LRU first
        self.num_bytes = 0
        self.hits = self.misses = self.writes = self.dropped = 0
        self._lock = threading.Lock()                         # index, num_bytes, counters
        self._warned: set[str] = set()
        self._queue: queue.Queue = queue.Queue(maxsize=queue_blocks)
        self.usable = self._open()
        self._writer = threading.Thread(target=self._write_loop, name="kv-disk-writer", daemon=True)
        if self.usable:
            self._writer.start()

    # ---- the engine's side ----------------------------------------------------------------------
    def contains(self, block_hash: bytes, group: int = 0) -> bool:
        with self._lock:
            return _name(block_hash, group) in self.index

    def put(self, block_hash: bytes, data: torch.Tensor, group: int = 0) -> None:
        """Queue a block's bytes (a CPU tensor the caller no longer writes) for writing."""
        if not self.usable or self.contains(block_hash, group):
            return
        try:
            self._queue.put_nowait((_name(block_hash, group), data))
        except queue.Full:
            self._drop("queue", "the disk writer is behind; a block was not written")

    def get(self, block_hash: bytes, like: torch.Tensor, group: int = 0) -> torch.Tensor | None:
        """The block's bytes as a tensor shaped and typed like `like`, or None (a miss)."""
        name = _name(block_hash, group)
        with self._lock:
            if name not in self.index:
                self.misses += 1
                return None
        payload = self._read(name, like.numel() * like.element_size())
        with self._lock:
            if payload is None:
                self.misses += 1
                self._forget(name)
                return None
            self.hits += 1
            self.index.move_to_end(name)
        return torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(like.dtype).view(like.shape)

    def flush(self) -> None:
        """Wait until every queued write is done (tests, shutdown)."""
        if self.usable:
            self._queue.join()

    def clear(self) -> None:
        """Delete every block file of this fingerprint."""
        self.flush()
        with self._lock:
            for name in list(self.index):
                self._forget(name)

    def stats(self) -> DiskStats:
        with self._lock:
            return DiskStats(len(self.index), self.num_bytes, self.max_bytes, self.hits,
                             self.misses, self.writes, self.dropped)

    # ---- files -----------------------------------------------------------------------------------
    def _open(self) -> bool:
        """Make the folder and index what is in it, oldest use first; False if unusable."""
        try:
            os.makedirs(self.folder, mode=0o700, exist_ok=True)
            found = []
            for sub in os.scandir(self.folder):
                if sub.is_dir():
                    found += [(e.stat().st_mtime, e.name, e.stat().st_size)
                              for e in os.scandir(sub.path) if e.name.endswith(".kv")]
        except OSError as e:
            logger.warning("KV disk tier off: %s is not usable (%s)", self.folder, e)
            return False
        for _mtime, name, size in sorted(found):
            self.index[name] = size
            self.num_bytes += size
        return True

    def _path(self, name: str) -> str:
        return os.path.join(self.folder, name[:2], name)

    def _read(self, name: str, expected: int) -> bytes | None:
        try:
            with open(self._path(name), "rb") as f:
                header = f.read(HEADER.size)
                payload = f.read(expected + 1)
            os.utime(self._path(name))                  # the LRU order survives a restart
        except OSError:
            return None
        if len(header) != HEADER.size:
            return None
        magic, length, digest = HEADER.unpack(header)
        if magic != MAGIC or length != expected or len(payload) != expected or digest != _digest(payload):
            logger.warning("KV disk tier: %s is damaged or of another layout; dropped", name)
            return None
        return payload

    def _write_loop(self) -> None:
        while True:
            name, data = self._queue.get()
            try:
                self._write(name, data)
            finally:
                self._queue.task_done()

    def _write(self, name: str, data: torch.Tensor) -> None:
        payload = data.contiguous().view(torch.uint8).numpy().tobytes()
        size = HEADER.size + len(payload)
        if size > self.max_bytes:
            return self._drop("size", "a block is larger than the disk tier's limit")
        path = self._path(name)
        tmp = f"{path}.{threading.get_ident()}.tmp"
        try:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(HEADER.pack(MAGIC, len(payload), _digest(payload)))
                f.write(payload)
            os.replace(tmp, path)
        except OSError as e:
            _remove(tmp)
            return self._drop(f"os:{e.errno}", f"writing {path} failed ({e})")
        with self._lock:
            self.writes += 1
            if name in self.index:
                self.num_bytes -= self.index.pop(name)
            self.index[name] = size
            self.num_bytes += size
            while self.num_bytes > self.max_bytes and len(self.index) > 1:
                self._forget(next(iter(self.index)))

    def _forget(self, name: str) -> None:
        """Drop a file from the index and the disk (the lock is held)."""
        self.num_bytes -= self.index.pop(name, 0)
        _remove(self._path(name))

    def _drop(self, cause: str, message: str) -> None:
        with self._lock:
            self.dropped += 1
            first = cause not in self._warned
            self._warned.add(cause)
        if first:
            logger.warning("KV disk tier: %s", message)


def _name(block_hash: bytes, group: int) -> str:
    return f"{block_hash.hex()}.{group}.kv"


def _digest(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=16).digest()


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


class KVDiskTier:
    """The block manager's disk tier (core.prefix_cache.DiskTier) over a KVDiskStore and
    the engine's KVCache: `save` copies a block out of the cache now (its last holder is
    freeing it, so nothing writes it before the copy) and queues the copy for writing; `load`
    reads a block's bytes back, shaped as KVCache.block, or None (a miss); `contains` says
    whether the store has a file for it (a read may still miss: a damaged file)."""

    def __init__(self, store: KVDiskStore, kv_cache) -> None:
        self.store = store
        self.kv_cache = kv_cache
        self._like = [kv_cache.block(g, 0) for g in range(len(kv_cache.group_blocks))]

    def contains(self, block_hash: bytes, group: int) -> bool:
        return self.store.contains(block_hash, group)

    def load(self, block_hash: bytes, group: int) -> torch.Tensor | None:
        return self.store.get(block_hash, self._like[group], group)

    def save(self, block_hash: bytes, group: int, block_id: int) -> None:
        if not self.store.contains(block_hash, group):
            self.store.put(block_hash, self.kv_cache.block(group, block_id).to("cpu", copy=True), group)
