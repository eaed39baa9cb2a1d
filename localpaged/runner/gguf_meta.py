"""A GGUF file's config and tokenizer: converted by transformers once, then kept on disk.

transformers builds both from the file's metadata with gguf-py's reader, which makes a Python
object per metadata item, for the config and again for the tokenizer: several times the whole
weight load (a mapping, quant/gguf_file.py; docs/benchmarks.md, 'Start-up', has the times). The
converted pair is saved (save_pretrained: config.json, tokenizer.json, the chat template) under
the cache folder, keyed by the file's path, size and modification time and the transformers
version, so a second load of the same file reads two small JSON files instead.

The cache folder: $LOCALPAGED_CACHE_DIR, else $XDG_CACHE_HOME/localpaged, else ~/.cache/localpaged.
A folder that cannot be written (or a damaged entry) costs only the conversion, with a warning.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

import transformers
from transformers import AutoConfig, AutoTokenizer, PretrainedConfig

from localpaged.runner.model_check import built_config

logger = logging.getLogger(__name__)

CACHE_ENV = "LOCALPAGED_CACHE_DIR"
ENTRY_VERSION = 2               # bump when what an entry holds changes
DONE = "complete"               # written last: an entry without it is ignored and rebuilt


def cache_root() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return default_cache_root()


def default_cache_root() -> Path:
    """The cache folder when $LOCALPAGED_CACHE_DIR is not set."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "localpaged"


def entry_folder(gguf_path: str) -> Path:
    """Where this version of this file's converted config and tokenizer live."""
    st = os.stat(gguf_path)
    key = f"{os.path.realpath(gguf_path)}|{st.st_size}|{st.st_mtime_ns}|{transformers.__version__}|{ENTRY_VERSION}"
    return cache_root() / "gguf" / hashlib.sha1(key.encode()).hexdigest()[:20]


def config_and_tokenizer(folder: str, gguf_file: str) -> tuple[PretrainedConfig, object]:
    """(config, tokenizer) of folder/gguf_file: from the cache where it holds them, else
    converted by transformers and stored for next time."""
    entry = entry_folder(os.path.join(folder, gguf_file))
    if (entry / DONE).exists():
        try:
            return _from_folder(entry)
        except Exception as exc:          # a damaged entry: convert again, replace it
            logger.warning("cached config/tokenizer of %s unreadable (%s): converting again",
                           gguf_file, exc)
    logger.info("reading the config and tokenizer of %s (once per file)", gguf_file)
    config = built_config(lambda: AutoConfig.from_pretrained(folder, gguf_file=gguf_file,
                                                             trust_remote_code=False),
                          os.path.join(folder, gguf_file))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file, trust_remote_code=False)
    _llamacpp_defaults(config)
    _store(entry, config, tokenizer)
    return config, tokenizer


def _llamacpp_defaults(config: PretrainedConfig) -> None:
    """Fields a GGUF file does not hold, set as llama.cpp sets them for the file (where
    transformers' defaults differ): Gemma 3's attention scale is 1/sqrt(head_dim), and
    1/sqrt(hidden_size / heads) for the 62-layer 27B (llama.cpp's gemma3 f_attention_scale);
    transformers' default query_pre_attn_scalar 256 is head_dim only for most released sizes."""
    if config.model_type == "gemma3_text":
        big = config.num_hidden_layers == 62
        config.query_pre_attn_scalar = (config.hidden_size // config.num_attention_heads if big
                                        else config.head_dim)


def _from_folder(entry: Path) -> tuple[PretrainedConfig, object]:
    config = AutoConfig.from_pretrained(entry, trust_remote_code=False)
    tokenizer = AutoTokenizer.from_pretrained(entry, trust_remote_code=False)
    return config, tokenizer


def _store(entry: Path, config: PretrainedConfig, tokenizer) -> None:
    """Written to a temporary folder beside the entry, then renamed into place: a reader never
    sees half an entry, and two processes converting the same file both end with a whole one."""
    tmp = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=entry.name + ".", dir=entry.parent))
        config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / DONE).touch()
        shutil.rmtree(entry, ignore_errors=True)
        os.replace(tmp, entry)
    except OSError as exc:
        logger.warning("could not cache the config and tokenizer under %s (%s): the next load "
                       "converts them again", entry.parent, exc)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
