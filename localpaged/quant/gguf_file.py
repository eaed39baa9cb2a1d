"""A GGUF file's tensor directory and its data, mapped: what the loader reads weights from.

GGUF (llama.cpp's format, little-endian): magic "GGUF", version, tensor count, metadata count; the
metadata (key, typed value) pairs; one info per tensor (name, dims innermost first, GGML type,
offset); then the tensor data, starting at the next multiple of `general.alignment` (32 by
default). Only the tensor directory and the alignment are kept here: the metadata's values (the
model's config and tokenizer) are read by runner/gguf_metadata.py.

The data is mapped copy-on-write (numpy memmap mode "c"): a tensor is a view of the file's pages,
read on first touch, shared with the page cache and never copied unless changed. Every tensor's
extent is checked against the file size when the directory is read, so a truncated or damaged
file is an error naming the tensor before any weight is used.

gguf-py's GGUFReader does the same and more, but builds a Python object per metadata item, which
for a large vocabulary takes many times as long as skipping the values (docs/benchmarks.md,
'Start-up', has the times).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass

import numpy as np

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


def type_name(type_id: int) -> str:
    """GGML's name for a tensor type id (e.g. 12 -> "Q4_K"), or "type <id>" for an unknown one."""
    import gguf
    try:
        return gguf.GGMLQuantizationType(type_id).name
    except ValueError:
        return f"type {type_id}"


def type_size(type_id: int) -> tuple[int, int] | None:
    """(elements, bytes) of one block of a GGML type; None for a type gguf-py does not know."""
    import gguf
    try:
        return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(type_id)]
    except (ValueError, KeyError):
        return None


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]     # outermost first, as torch has it: (rows, row length) for a matrix
    type_id: int
    offset: int                # from the start of the file
    n_bytes: int

    @property
    def kind(self) -> str:
        return type_name(self.type_id)

    def describe(self) -> str:
        return f"tensor {self.name} ({self.kind}, {'x'.join(map(str, self.shape))})"


class GgufFile:
    """The tensor directory of one GGUF file and a copy-on-write mapping of its bytes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._data = np.memmap(path, dtype=np.uint8, mode="c")
        self.tensors, self.alignment = _read_directory(self._data, path)

    def array(self, info: TensorInfo) -> np.ndarray:
        """The tensor's bytes, uint8, as rows (row bytes innermost) for a quantized matrix or the
        flat bytes otherwise; a view of the mapping (nothing is read until touched)."""
        flat = self._data[info.offset:info.offset + info.n_bytes]
        rows = int(np.prod(info.shape[:-1])) if len(info.shape) > 1 else 1
        return flat.reshape(rows, -1) if len(info.shape) > 1 else flat

    def drop_pages(self, info: TensorInfo) -> None:
        """Drop a tensor's pages from this process's resident set (after it was copied into the
        form kept): read-only so far, a later touch would read them again from the page cache,
        so only accounting and the peak change, never a value. No-op without madvise."""
        mm = getattr(self._data, "_mmap", None)
        if mm is None or not hasattr(mm, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
            return
        start = info.offset - info.offset % mmap.PAGESIZE
        mm.madvise(mmap.MADV_DONTNEED, start, info.offset + info.n_bytes - start)


class _Cursor:
    def __init__(self, buf: np.ndarray, path: str) -> None:
        self.buf, self.pos, self.path = memoryview(buf), 0, path

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise ValueError(f"{self.path}: truncated GGUF header (ends at byte {len(self.buf)})")
        value = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value[0] if len(value) == 1 else value

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise ValueError(f"{self.path}: truncated GGUF header (a string runs past the end)")
        text = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return text

    def _skip_strings(self, count: int) -> None:
        """Past `count` strings in a row (a vocabulary, its merges): one tight loop, the bulk of
        a large vocabulary's header."""
        buf, pos, end = self.buf, self.pos, len(self.buf)
        length = struct.Struct("<Q").unpack_from
        for _ in range(count):
            if pos + 8 > end:
                break
            pos += 8 + length(buf, pos)[0]
        else:
            if pos <= end:
                self.pos = pos
                return
        raise ValueError(f"{self.path}: truncated GGUF header (a string runs past the end)")

    def skip_value(self, vtype: int) -> None:
        if vtype == _STRING:
            n = self.take("<Q")     # (not `pos += take()`: that reads pos before take moves it)
            self.pos += n
        elif vtype == _ARRAY:
            etype, count = self.take("<I"), self.take("<Q")
            if etype in _SCALARS:
                size = struct.calcsize("<" + _SCALARS[etype]) * count
                self.pos += size
            elif etype == _STRING:
                self._skip_strings(count)
            else:
                for _ in range(count):
                    self.skip_value(etype)
        elif vtype in _SCALARS:
            self.pos += struct.calcsize("<" + _SCALARS[vtype])
        else:
            raise ValueError(f"{self.path}: not a GGUF file we can read (metadata value type {vtype})")


def _read_directory(data: np.ndarray, path: str) -> tuple[list[TensorInfo], int]:
    cur = _Cursor(data, path)
    if len(data) < 24 or bytes(data[:4]) != MAGIC:
        raise ValueError(f"{path} is not a GGUF file (no GGUF magic at its start)")
    cur.pos = 4
    version, n_tensors, n_kv = cur.take("<I"), cur.take("<Q"), cur.take("<Q")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
    alignment = DEFAULT_ALIGNMENT
    for _ in range(n_kv):
        key, vtype = cur.string(), cur.take("<I")
        if key == "general.alignment" and vtype == 4:
            alignment = cur.take("<I")
        else:
            cur.skip_value(vtype)
    raw = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = [cur.take("<Q") for _ in range(cur.take("<I"))]
        raw.append((name, tuple(reversed(dims)), cur.take("<I"), cur.take("<Q")))
    start = -(-cur.pos // alignment) * alignment
    tensors = [_info(name, shape, type_id, start + offset, path)
               for name, shape, type_id, offset in raw]
    _check_extents(tensors, len(data), path)
    return tensors, alignment


def _check_extents(tensors: list[TensorInfo], file_size: int, path: str) -> None:
    """Each tensor's bytes (as its shape and type say) lie inside the file and before the next
    tensor's: else its shape does not match its data, or the file was cut short."""
    ordered = sorted(tensors, key=lambda t: t.offset)
    for t, after in zip(ordered, ordered[1:] + [None]):
        end = t.offset + t.n_bytes
        if after is not None and end > after.offset:
            raise ValueError(f"{path}: {t.describe()} needs {t.n_bytes} bytes, but tensor "
                             f"{after.name} starts {after.offset - t.offset} bytes after it: its "
                             f"shape does not match its data (a damaged file)")
        if end > file_size:
            raise ValueError(f"{path}: {t.describe()} needs bytes {t.offset}..{end} but the file "
                             f"has {file_size}: the file is truncated or damaged")


def _info(name: str, shape: tuple[int, ...], type_id: int, offset: int, path: str) -> TensorInfo:
    size = type_size(type_id)
    elements = int(np.prod(shape)) if shape else 1
    if size is None:             # unknown type: the loader names it among the unsupported ones
        return TensorInfo(name, shape, type_id, offset, 0)
    block_elems, block_bytes = size
    if not shape or shape[-1] % block_elems:
        raise ValueError(f"{path}: tensor {name} ({type_name(type_id)}) has rows of {shape[-1:]} "
                         f"elements, not a multiple of its block of {block_elems}")
    return TensorInfo(name, shape, type_id, offset, elements // block_elems * block_bytes)
