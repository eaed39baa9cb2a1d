"""The models on this machine, read without loading any: the Hugging Face cache (through
huggingface_hub's `scan_cache_dir`) and the GGUF files under folders the user watches.

Each `ModelEntry` says what to type to load it (`name`: a Hub id the loader finds in the cache,
or a path), where it was found, its files' size on disk, its weights format, its parameter count
and what a context of L tokens costs in KV bytes. Everything comes from file headers: a GGUF's
tensor directory (quant/gguf_file.py), safetensors headers, config.json; no weight is read.

Memory at context L (`ModelEntry.memory_at`): the weights' bytes on disk plus the KV cache of
one sequence of L tokens in the cache's element size (float32 on CPU by default), each layer
holding min(L, its window) tokens. For a GGUF the windows are not read (its metadata is not
parsed here), so every layer counts as full attention: an upper bound for sliding-window models.

A file that cannot be read is listed with what is known (its size) and the reason, never
dropped silently and never an exception out of `scan`.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

GGUF_SUFFIX = ".gguf"
MAX_DEPTH = 4                       # folder levels searched under a watched folder
KV_ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class KVShape:
    """Per layer: K (= V) values a token stores (kv heads x head dim) and the window the layer
    attends over (0: every earlier token)."""
    widths: tuple[int, ...]
    windows: tuple[int, ...]

    def bytes_at(self, context: int, element_bytes: int = 4) -> int:
        """KV bytes of one sequence of `context` tokens: K and V of every layer."""
        return sum(2 * w * element_bytes * (min(context, win) if win else context)
                   for w, win in zip(self.widths, self.windows))


@dataclass(frozen=True)
class ModelEntry:
    name: str                        # what the loader takes: a Hub id (cached) or a file path
    source: str                      # "hub cache" or the watched folder it was found under
    path: str                        # the snapshot folder or the .gguf file
    size_bytes: int                  # on disk: the snapshot's files, or the GGUF file
    format: str = "?"                # e.g. "GGUF Q4_1", "safetensors BF16", "GPTQ 4-bit"
    parameters: int | None = None
    kv: KVShape | None = None
    error: str | None = None         # why part of it could not be read
    weights_bytes: int = field(default=0)   # the files holding weights (0: size_bytes)

    def memory_at(self, context: int, element_bytes: int = 4) -> int | None:
        """Weights plus one sequence's KV cache at `context` tokens; None when the KV shape
        is unknown."""
        if self.kv is None:
            return None
        return (self.weights_bytes or self.size_bytes) + self.kv.bytes_at(context, element_bytes)


def scan(folders: list[str], cache_dir: str | None = None) -> list[ModelEntry]:
    """Every model in the HF cache (`cache_dir`, default HF_HUB_CACHE) and every GGUF under
    `folders`, Hub ids first, then by name; a path found twice is listed once."""
    entries = scan_hub_cache(cache_dir)
    seen = {os.path.realpath(e.path) for e in entries}
    for folder in folders:
        for entry in scan_folder(folder):
            if os.path.realpath(entry.path) not in seen:
                seen.add(os.path.realpath(entry.path))
                entries.append(entry)
    return entries


def scan_hub_cache(cache_dir: str | None = None) -> list[ModelEntry]:
    """The cache's model repos: one entry per repo with a config.json and safetensors (loaded
    by its Hub id), one per .gguf file in a snapshot (loaded by path). Newest revision only."""
    from huggingface_hub import CacheNotFound, scan_cache_dir
    try:
        info = scan_cache_dir(cache_dir)
    except (CacheNotFound, ValueError, OSError) as exc:
        log.info("no Hugging Face cache to scan: %s", exc)
        return []
    entries: list[ModelEntry] = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id.lower()):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        rev = max(repo.revisions, key=lambda r: r.last_modified)
        names = {f.file_name for f in rev.files}
        folder = str(rev.snapshot_path)
        if "config.json" in names and any(n.endswith(".safetensors") for n in names):
            entries.append(_hf_entry(repo.repo_id, folder, rev.size_on_disk))
        for f in sorted(rev.files, key=lambda f: f.file_name):
            if f.file_name.endswith(GGUF_SUFFIX):
                entries.append(gguf_entry(str(f.file_path), "hub cache"))
    return entries


def scan_folder(folder: str) -> list[ModelEntry]:
    """The .gguf files under `folder` (MAX_DEPTH levels), by path; [] for a missing folder."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        return []
    found: list[Path] = []
    for here, dirs, files in os.walk(root):
        depth = len(Path(here).relative_to(root).parts)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if depth < MAX_DEPTH else []
        found += [Path(here) / f for f in files if f.endswith(GGUF_SUFFIX)]
    return [gguf_entry(str(p), str(root)) for p in sorted(found)]


def gguf_entry(path: str, source: str) -> ModelEntry:
    """A GGUF file from its tensor directory: parameters, the weights' types, the KV widths
    (rows of each layer's attn_k)."""
    from localpaged.quant.gguf_file import GgufFile
    size = os.path.getsize(path)
    try:
        tensors = GgufFile(path).tensors
    except (ValueError, OSError) as exc:
        return ModelEntry(path, source, path, size, "GGUF (unreadable)", error=str(exc))
    params = sum(_elements(t.shape) for t in tensors)
    by_bytes: Counter[str] = Counter()
    for t in tensors:
        if len(t.shape) == 2:
            by_bytes[t.kind] += t.n_bytes
    widths = tuple(t.shape[0] for t in sorted(
        (t for t in tensors if t.name.startswith("blk.") and t.name.endswith(".attn_k.weight")),
        key=lambda t: int(t.name.split(".")[1])))
    kv = KVShape(widths, (0,) * len(widths)) if widths else None
    return ModelEntry(path, source, path, size, "GGUF " + _kinds(by_bytes), params, kv)


def _hf_entry(repo_id: str, folder: str, size: int) -> ModelEntry:
    """A safetensors snapshot: format and parameters from the headers, KV from config.json."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
        params, dtypes, weights = _safetensors_summary(folder)
        fmt = _prequantized(config) or "safetensors " + _kinds(dtypes)
        return ModelEntry(repo_id, "hub cache", folder, size, fmt, params, _config_kv(config),
                          weights_bytes=weights)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return ModelEntry(repo_id, "hub cache", folder, size, "safetensors", error=str(exc))


def _safetensors_summary(folder: str) -> tuple[int, Counter[str], int]:
    """(parameters, bytes by dtype, bytes of the weight files) from the headers alone."""
    from safetensors import safe_open
    params, dtypes, weights = 0, Counter(), 0
    for file in sorted(Path(folder).glob("*.safetensors")):
        weights += file.stat().st_size
        with safe_open(str(file), "np") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                piece = f.get_slice(key)
                n = _elements(piece.get_shape())
                params += n
                dtypes[piece.get_dtype()] += n
    return params, dtypes, weights


def _config_kv(config: dict) -> KVShape | None:
    """Per-layer KV widths and windows from a raw config.json (text models: `text_config`
    when nested), as models/layer_types.py reads them."""
    c = config.get("text_config") or config
    layers, heads = c.get("num_hidden_layers"), c.get("num_attention_heads")
    if not layers or not heads:
        return None
    kv_heads = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or c["hidden_size"] // heads
    window = c.get("sliding_window") or 0
    types = c.get("layer_types")
    if isinstance(types, list) and len(types) == layers:
        windows = tuple(window if t == "sliding_attention" else 0 for t in types)
    else:
        windows = (window,) * layers if c.get("use_sliding_window", True) else (0,) * layers
    return KVShape((kv_heads * head_dim,) * layers, windows)


def _prequantized(config: dict) -> str | None:
    qc = config.get("quantization_config")
    if not isinstance(qc, dict):
        return None
    method = str(qc.get("quant_method", "quantized")).upper()
    return f"{method} {qc['bits']}-bit" if qc.get("bits") else method


def _kinds(weights: Counter[str]) -> str:
    """The formats holding most of the weights: "Q4_1", "Q4_K/Q6_K" (the two biggest)."""
    top = [k for k, _ in weights.most_common(2)]
    return "/".join(top) if top else "?"


def _elements(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def human_bytes(n: int | None) -> str:
    """1,536 -> "1.5 KB" (powers of 1000, as file managers and the Hub show sizes)."""
    if n is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def human_count(n: int | None) -> str:
    """134,515,008 -> "135M"."""
    if n is None:
        return "?"
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}" if n < 10 * scale else f"{n / scale:.0f}{unit}"
    return str(n)
