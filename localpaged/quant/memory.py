"""Memory the process gives back to the OS while loading weights (see loader.load), and
mappings of its own for weights kept as copies."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap

import torch


def trim_heap() -> None:
    """Return freed heap pages to the OS (glibc's malloc_trim; a no-op elsewhere). Loading frees
    many few-MB temporaries between long-lived weights; glibc raises its mmap threshold after the
    first large free, so later ones come from the heap and stay resident, fragmented, unless
    trimmed (docs/benchmarks.md, 'Quantized weights', has what it costs untrimmed)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):        # not glibc (musl, macOS): nothing to trim
        return None


def mapped_bytes(n: int) -> torch.Tensor:
    """uint8 [n] in an anonymous mapping of its own, unmapped when the tensor goes: long-lived
    weight copies made while loading never sit in malloc's heap, where a model let go would leave
    much of them resident, and the next load's peak on top. No huge pages asked for: with the
    kernel's defrag=madvise a fault compacts memory in line, which slows a second load, and decode
    does not gain from them (docs/benchmarks.md, 'Quantized weights' and 'Real models', have the
    figures)."""
    if n == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE), dtype=torch.uint8, count=n)
