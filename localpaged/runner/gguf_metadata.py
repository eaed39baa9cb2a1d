"""A GGUF file's metadata as Python values, and the model config transformers builds from it.

    metadata, tensor_names = read_metadata(path)     # {key: value}, every tensor's name
    config_dict(metadata, tensor_names)              # transformers' config fields, or None

The metadata is read straight from the mapped file: scalars as int, float, bool or str, arrays
as lists (a vocabulary of strings, its scores, its token types), one pass over the header. gguf-py's
GGUFReader, which transformers uses for the config of most architectures, builds several numpy
views per item of every array instead; that is most of the time a first open of a file took.

`config_dict` is the dict transformers' `load_gguf_checkpoint(path)["config"]` returns, made from
transformers' own key tables (GGUF_TO_TRANSFORMERS_MAPPING, GGUF_CONFIG_DEFAULTS_MAPPING) by the
same steps, for the architectures whose conversion is only those steps (FAST_ARCHITECTURES).
For any other it returns None and the caller asks transformers (runner/gguf_meta.py).
"""

from __future__ import annotations

import mmap
import struct

MAGIC = b"GGUF"
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9

# Architectures whose config transformers builds by the key tables alone (plus the renames
# below); the others have steps of their own in load_gguf_checkpoint, left to transformers.
FAST_ARCHITECTURES = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma3"})
_UNTIED_EXCEPTIONS = ("falcon", "bloom")       # transformers ties these whatever the tensors


def read_metadata(path: str) -> tuple[dict, list[str]]:
    """({key: value}, tensor names in file order) of the GGUF file at `path`; a ValueError for a
    file that is not GGUF or whose header is cut short."""
    with open(path, "rb") as f:
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:                       # an empty file cannot be mapped
            raise ValueError(f"{path} is not a GGUF file (it is empty)") from None
    try:
        return _Header(buf, path).read()
    finally:
        buf.close()


class _Header:
    def __init__(self, buf: mmap.mmap, path: str) -> None:
        self.buf, self.path, self.pos = buf, path, 0

    def read(self) -> tuple[dict, list[str]]:
        if self.buf[:4] != MAGIC:
            raise ValueError(f"{self.path} is not a GGUF file (no GGUF magic at its start)")
        try:
            version, n_tensors, n_kv = struct.unpack_from("<IQQ", self.buf, 4)
            if version not in (2, 3):
                raise ValueError(f"{self.path}: GGUF version {version} is not supported "
                                 f"(2 and 3 are)")
            self.pos = 24
            metadata = {}
            for _ in range(n_kv):
                key = self.string()
                metadata[key] = self.value(self.scalar("<I"))
            names = []
            for _ in range(n_tensors):
                names.append(self.string())
                dims = self.scalar("<I")
                self.pos += 8 * dims + 4 + 8             # dims, type, offset
            return metadata, names
        except (struct.error, UnicodeDecodeError, IndexError) as exc:
            raise ValueError(f"{self.path}: truncated or damaged GGUF header near byte "
                             f"{self.pos} ({exc})") from exc

    def scalar(self, fmt: str):
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        (n,) = struct.unpack_from("<Q", self.buf, self.pos)
        start = self.pos + 8
        if start + n > len(self.buf):
            raise ValueError(f"{self.path}: truncated GGUF header (a string runs past the end)")
        self.pos = start + n
        return str(self.buf[start:start + n], "utf-8")

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype != _ARRAY:
            raise ValueError(f"{self.path}: GGUF metadata value type {vtype} is not known")
        etype, count = struct.unpack_from("<IQ", self.buf, self.pos)
        self.pos += 12
        if etype in _SCALARS:
            fmt = _SCALARS[etype]
            values = struct.unpack_from(f"<{count}{fmt[1]}", self.buf, self.pos)
            self.pos += count * struct.calcsize(fmt)
            return list(values)
        if etype == _STRING:
            return self._strings(count)
        return [self.value(etype) for _ in range(count)]

    def _strings(self, count: int) -> list[str]:
        """`count` strings in a row: the hot loop of a vocabulary, kept to local names."""
        buf, pos, out = self.buf, self.pos, []
        unpack, end, append = struct.Struct("<Q").unpack_from, len(self.buf), out.append
        for _ in range(count):
            (n,) = unpack(buf, pos)
            pos += 8
            if pos + n > end:
                raise ValueError(f"{self.path}: truncated GGUF header (a string runs past the end)")
            append(str(buf[pos:pos + n], "utf-8"))
            pos += n
        self.pos = pos
        return out


def config_dict(metadata: dict, tensor_names: list[str]) -> dict | None:
    """The config fields transformers' GGUF conversion gives this file, or None where its
    architecture is not one of FAST_ARCHITECTURES."""
    from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_CONFIG_MAPPING

    architecture = metadata.get("general.architecture")
    if architecture not in FAST_ARCHITECTURES:
        return None
    # transformers compares the name list it reads, so only a file named exactly "mistral"
    # becomes one; and only the architecture's own keys are renamed.
    renamed = "mistral" if "llama" in architecture and metadata.get("general.name") == "mistral" \
        else architecture
    config: dict = {"tie_word_embeddings": all(name != "output.weight" for name in tensor_names)
                    or architecture in _UNTIED_EXCEPTIONS}
    defaults = GGUF_CONFIG_DEFAULTS_MAPPING.get(renamed,
                                                GGUF_CONFIG_DEFAULTS_MAPPING.get(architecture) or {})
    for key, value in defaults.items():
        config.setdefault(key, value)
    for key, value in metadata.items():
        prefix, _, field = key.replace(architecture, renamed).partition(".")
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        if isinstance(value, str) and architecture in value:
            value = value.replace(architecture, renamed)
        target = GGUF_CONFIG_MAPPING.get(prefix, {}).get(field, -1)
        if target is not None and target != -1:
            config[target] = value
    if config.get("model_type") == "gemma3":        # a GGUF holds the text model alone
        config["model_type"] = "gemma3_text"
    if "vocab_size" not in config and isinstance(metadata.get("tokenizer.ggml.tokens"), list):
        config["vocab_size"] = len(metadata["tokenizer.ggml.tokens"])
    return config
