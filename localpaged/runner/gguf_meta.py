"""A GGUF file's config and tokenizer, read from its metadata; and localpaged's cache folder.

    config_and_tokenizer(folder, gguf_file) -> (config, tokenizer)

The metadata is read once (runner/gguf_metadata.py). The config is transformers' config class
built from the fields transformers' GGUF conversion gives (gguf_metadata.config_dict); the
tokenizer is built with the tokenizers library (runner/gguf_tokenizer.py), equal to transformers'
conversion of the file. A file either module does not build (an architecture or a vocabulary
outside theirs) is converted by transformers instead, with a warning naming why: transformers
reads the whole metadata again through gguf-py, seconds to minutes for a large vocabulary.

The cache folder (the bundled models' joined files, runner/model_source.py bundled_gemma3_path):
$LOCALPAGED_CACHE_DIR, else $XDG_CACHE_HOME/localpaged, else ~/.cache/localpaged.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
from pathlib import Path

from transformers import AutoConfig, AutoTokenizer, PretrainedConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from localpaged.runner.gguf_metadata import config_dict, read_metadata
from localpaged.runner.gguf_tokenizer import UnsupportedVocabulary, tokenizer_from_metadata
from localpaged.runner.model_check import built_config

logger = logging.getLogger(__name__)

CACHE_ENV = "LOCALPAGED_CACHE_DIR"


def cache_root() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return default_cache_root()


def default_cache_root() -> Path:
    """The cache folder when $LOCALPAGED_CACHE_DIR is not set."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "localpaged"


def config_and_tokenizer(folder: str, gguf_file: str) -> tuple[PretrainedConfig, object]:
    """(config, tokenizer) of folder/gguf_file, from its metadata."""
    path = os.path.join(folder, gguf_file)
    with _no_gc():
        metadata, tensor_names = read_metadata(path)
    config = built_config(lambda: _config(metadata, tensor_names, folder, gguf_file), path)
    _llamacpp_defaults(config)
    try:
        with _no_gc():
            tokenizer = tokenizer_from_metadata(metadata)
    except UnsupportedVocabulary as exc:
        logger.warning("%s: %s; converting its tokenizer through transformers instead (slow "
                       "for a large vocabulary)", gguf_file, exc)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file,
                                                  trust_remote_code=False)
    return config, tokenizer


@contextlib.contextmanager
def _no_gc():
    """Python's cycle collector off while a vocabulary's hundreds of thousands of strings and
    merge pairs are made: they make no cycles, but their count sets off full collections, each
    a walk over every object of the process (torch's and transformers' included)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _config(metadata: dict, tensor_names: list[str], folder: str,
            gguf_file: str) -> PretrainedConfig:
    fields = config_dict(metadata, tensor_names)
    if fields is None or fields.get("model_type") not in CONFIG_MAPPING:
        logger.warning("%s: architecture %r is not read here; converting its config through "
                       "transformers instead", gguf_file, metadata.get("general.architecture"))
        return AutoConfig.from_pretrained(folder, gguf_file=gguf_file, trust_remote_code=False)
    config = CONFIG_MAPPING[fields["model_type"]].from_dict(fields)
    config._name_or_path = folder                 # as transformers names a GGUF's config
    return config


def _llamacpp_defaults(config: PretrainedConfig) -> None:
    """Fields a GGUF file does not hold, set as llama.cpp sets them for the file (where
    transformers' defaults differ): Gemma 3's attention scale is 1/sqrt(head_dim), and
    1/sqrt(hidden_size / heads) for the 62-layer 27B (llama.cpp's gemma3 f_attention_scale);
    transformers' default query_pre_attn_scalar 256 is head_dim only for most released sizes."""
    if config.model_type == "gemma3_text":
        big = config.num_hidden_layers == 62
        config.query_pre_attn_scalar = (config.hidden_size // config.num_attention_heads if big
                                        else config.head_dim)
