"""Model loading: from a Hub repo id, a local directory, or a .gguf file, into our model class.

The name is resolved to its files first (runner/model_source.py: `resolve`, the order it tries,
ModelNotFoundError). A GGUF text model with a vision projector beside it (an `mmproj*.gguf`
file, llama.cpp's) loads that projector as its vision tower (runner/mmproj.py); the projector
alone is not a model.
`trust_remote_code` is never enabled: only architectures implemented in localpaged.models load.

Progress: a load inside `with reporting_progress(report):` reports as it goes
(runner/load_progress.py). Weights go into the meta-built model by runner/weight_placement.py.
"""

from __future__ import annotations

import copy
import functools
import glob
import logging
import os
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoTokenizer, GenerationConfig, PretrainedConfig

from localpaged.kernels import cpu_extension
from localpaged.models import Model, build_model
from localpaged.models.vision import VisionTower
from localpaged.quant.convert import fuse_biases, read_safetensors
from localpaged.quant.ggml import NativeKernel, cpu_native
from localpaged.quant.gguf import FLOAT_TYPES, read_gguf
from localpaged.quant.gguf_file import GgufFile
from localpaged.quant.gptq_awq import drop_unused_zero_biases, read_prequantized
from localpaged.quant.linear import weights_summary
from localpaged.quant.memory import trim_heap
from localpaged.runner import mmproj, vision_loader
from localpaged.runner.gguf_meta import config_and_tokenizer
from localpaged.runner.load_progress import progress_of, report
from localpaged.runner.startup_check import triton_ggml_native
from localpaged.runner.model_check import (
    built_config,
    check_config,
    check_shapes,
    gguf_shapes,
    raw_config,
    safetensors_shapes,
)
from localpaged.runner.model_source import ModelNotFoundError, ModelSource, resolve
from localpaged.runner.weight_placement import install_packed, load_weights

logger = logging.getLogger(__name__)

@dataclass
class LoadedModel:
    model: Model
    config: PretrainedConfig
    tokenizer: object
    eos_token_ids: set[int]
    source: ModelSource
    vision: VisionTower | None = None     # a vision-language model's tower (runner/vision_loader.py)
    processor: object = None              # and its transformers processor (images to pixels)


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {dtype!r}")
    if device.type == "cpu" and table[dtype] == torch.float16:
        raise ValueError("dtype float16 is not supported on CPU; use float32 or bfloat16")
    return table[dtype]


def load(name: str, device: torch.device, dtype: torch.dtype, revision: str | None = None,
         quantization: str = "auto") -> LoadedModel:
    """The model named `name` on `device`; `quantization` is one of config.QUANTIZATION, checked
    by EngineConfig (the engine's one way in)."""
    report("resolve", "finding the model files")
    source = resolve(name, revision)
    stamp = _file_stamp(source)
    report("config", "reading the config")
    config = copy.deepcopy(_config(source.path, source.gguf_file, stamp))    # each engine its own
    prequantized = getattr(config, "quantization_config", None)   # GPTQ / AWQ (quant/gptq_awq.py)
    whole = None                 # a vision-language model's config; `config` is its text model's
    if vision_loader.is_vision_language(config):
        whole, config = config, vision_loader.text_config(config, quantization, bool(prequantized))
    _check_model_files(source, config)   # before any kernel sees a size or any weight is read
    with torch.device("meta"):            # no memory, no random init: the weights come next
        model = build_model(config)      # refuses unsupported architectures before any weight I/O
    report("tokenizer", "building the tokenizer")
    tokenizer = _tokenizer(source.path, source.gguf_file, stamp)
    report("weights", "reading weights")
    packed: dict = {}
    if source.gguf_file:         # tensor by tensor; quantized types stay packed (quant/gguf.py)
        path = os.path.join(source.path, source.gguf_file)
        state, packed = read_gguf(path, config, quantization, _gguf_kernel(path, device, quantization),
                                  on_tensor=progress_of("weights", "reading tensors"))
    elif prequantized:
        qc = prequantized if isinstance(prequantized, dict) else prequantized.to_dict()
        state, packed = read_prequantized(source.path, qc, quantization, dtype)
        state = drop_unused_zero_biases(state, model)
    elif quantization in ("int8", "int4"):
        state, packed = read_safetensors(source.path, quantization)
    else:
        state = _safetensors_state_dict(source.path)
    tower = processor = None
    if whole is not None:
        state, vision = vision_loader.split_weights(whole, state)
        tower = vision_loader.build_tower(whole, vision, device, dtype)
        processor = vision_loader.load_processor(source.path, whole.model_type)
    elif source.gguf_file and (projectors := mmproj.mmproj_files(source.path)):
        logger.info("vision projector %s beside %s", os.path.basename(projectors[0]), source.gguf_file)
        _, tower, processor = mmproj.load_mmproj(projectors[0], config, tokenizer, device, dtype)
    report("install", "installing weights")
    if packed:
        install_packed(model, packed, device, dtype)     # consumes `packed`
        state = fuse_biases(state)
        logger.info("weights: %s", weights_summary(model)[1])
    load_weights(model, state, device, dtype)      # consumes `state`
    report("finish", "finishing")
    if device.type == "cpu":
        _use_cpu_kernels(model)
    eos = _eos_ids(source, config, tokenizer)
    trim_heap()            # the config/tokenizer parsing's and the weights' freed temporaries
    return LoadedModel(model, config, tokenizer, eos, source, tower, processor)


def _check_model_files(source: ModelSource, config: PretrainedConfig) -> None:
    """The config's sizes, then every weight's shape from the files' directories
    (runner/model_check.py): a ValueError naming the field or tensor and the file."""
    if source.gguf_file:
        path = os.path.join(source.path, source.gguf_file)
        check_config(config, path)
        shapes, file_names = gguf_shapes(path, config.model_type)
        check_shapes(shapes, config, path, file_names)
    else:
        check_config(config, os.path.join(source.path, "config.json"))
        check_shapes(safetensors_shapes(source.path), config, source.path)


def _gguf_kernel(path: str, device: torch.device, quantization: str) -> NativeKernel | None:
    """The kernel that multiplies a GGUF file's quantized blocks as the file stores them (quant/
    gguf.py keeps exactly its formats under "auto"). On CPU a file with quantized tensors always
    gets one: the CPU extension's, its first build waited for (reported as this step of the
    load), or the plain-torch reference where it cannot be built (quant/ggml.py: cpu_native), so
    a quantized file is never requantized unless `quantization` asks for it. None: a float file,
    or int8/int4/none asked for (every weight converted as asked)."""
    if quantization != "auto":
        return None
    if device.type != "cpu":
        return triton_ggml_native(device)
    if all(t.kind in FLOAT_TYPES for t in GgufFile(path).tensors):
        return None
    if not cpu_extension.BUILD.done.is_set():
        report("weights", "compiling the CPU kernels (once for this machine)")
    return cpu_native()


def _use_cpu_kernels(model: Model) -> None:
    """RMSNorm in the CPU extension where it is built (cached) now; chosen once per load, like the
    int4 form (quant/layout.py: PackedWeight.cpu_form), so a model never switches kernels while
    it serves."""
    module = cpu_extension.BUILD.module_if_cached()
    if module is not None:
        model.use_norm_kernel(module.rms_norm)


def _file_stamp(source: ModelSource) -> int:
    """Changes when the model's files do: part of the cache keys below."""
    name = source.gguf_file or "config.json"
    return os.stat(os.path.join(source.path, name)).st_mtime_ns


@functools.lru_cache(maxsize=4)
def _config(path: str, gguf_file: str | None, stamp: int) -> PretrainedConfig:
    """The model's config, parsed once per process (from a GGUF: runner/gguf_meta.py)."""
    if gguf_file:
        return _gguf_meta(path, gguf_file, stamp)[0]
    file = os.path.join(path, "config.json")
    check_config(raw_config(file), file)       # before transformers' validators divide by them
    return built_config(lambda: AutoConfig.from_pretrained(path, trust_remote_code=False), file)


@functools.lru_cache(maxsize=4)
def _tokenizer(path: str, gguf_file: str | None, stamp: int):
    """The model's tokenizer, built once per process (a model switch back, a second engine or a
    test loads the same one again; tokenizers are only read: encode, decode, chat template).
    From a GGUF: built from the file's metadata (runner/gguf_meta.py)."""
    if gguf_file:
        return _gguf_meta(path, gguf_file, stamp)[1]
    return AutoTokenizer.from_pretrained(path, trust_remote_code=False)


@functools.lru_cache(maxsize=4)
def _gguf_meta(path: str, gguf_file: str, stamp: int) -> tuple:
    return config_and_tokenizer(path, gguf_file)


def _safetensors_state_dict(path: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise ModelNotFoundError(f"no *.safetensors weights in {path}")
    state: dict[str, torch.Tensor] = {}
    for i, file in enumerate(tqdm(files, desc="loading weights", unit="shard", disable=len(files) < 2)):
        report("weights", "reading weight files", i, len(files))
        state.update(load_file(file))
    return state


def _eos_ids(source: ModelSource, config: PretrainedConfig, tokenizer) -> set[int]:
    ids: set[int] = set()
    try:
        kwargs = {"gguf_file": source.gguf_file} if source.gguf_file else {}
        gen = GenerationConfig.from_pretrained(source.path, **kwargs)
        ids |= _as_set(gen.eos_token_id)
    except (OSError, ValueError):
        pass
    ids |= _as_set(getattr(config, "eos_token_id", None))
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def _as_set(x) -> set[int]:
    if x is None:
        return set()
    return set(x) if isinstance(x, (list, tuple, set)) else {int(x)}
