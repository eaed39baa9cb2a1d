"""Model loading: from a Hub repo id, a local directory, or a .gguf file, into our model class.

The name is resolved to its files first (runner/model_source.py: `resolve`, the order it tries,
ModelNotFoundError). A GGUF text model with a vision projector beside it (an `mmproj*.gguf`
file, llama.cpp's) loads that projector as its vision tower (runner/mmproj.py); the projector
alone is not a model.
`trust_remote_code` is never enabled: only architectures implemented in localpaged.models load.

Progress: inside `with reporting_progress(report):`, a load in that context (the thread that
calls it: LLM(...) loads in its caller's thread) calls `report(fraction, what)` as it goes:
fraction 0..1 of the load (LOAD_STEPS: files found, config and tokenizer, weights read tensor
by tensor or file by file, packed weights installed and float weights placed layer by layer;
the fractions never decrease), `what` a short phrase. It never
reaches 1.0 here: the engine still sizes its KV cache after the loader returns, so the
caller says when the model is ready. Outside such a block nothing is reported.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import glob
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoTokenizer, GenerationConfig, PretrainedConfig

from localpaged.kernels import cpu_extension
from localpaged.models import Gemma3ForCausalLM, LlamaForCausalLM, build_model
from localpaged.models.llama import fuse_state_dict
from localpaged.models.vision import VisionTower
from localpaged.quant.convert import fuse_biases, fuse_packed, read_safetensors
from localpaged.quant.ggml import NativeKernel, cpu_native
from localpaged.quant.gguf import FLOAT_TYPES, read_gguf
from localpaged.quant.gguf_file import GgufFile
from localpaged.quant.gptq_awq import drop_unused_zero_biases, read_prequantized
from localpaged.quant.linear import QuantLinear, install, weights_summary
from localpaged.quant.memory import trim_heap
from localpaged.runner import mmproj, vision_loader
from localpaged.runner.gguf_meta import config_and_tokenizer
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

logger = logging.getLogger(__name__)

Model = LlamaForCausalLM | Gemma3ForCausalLM       # what build_model makes (models/__init__.py)

LoadProgress = Callable[[float, str], None]         # (fraction of the load done, what it does)
# Where each part of a load starts, as a fraction of the whole; reading the weights is most of it.
LOAD_STEPS = {"resolve": 0.0, "config": 0.03, "tokenizer": 0.06, "weights": 0.10,
              "install": 0.85, "place": 0.91, "finish": 0.97}
_PROGRESS: contextvars.ContextVar[LoadProgress | None] = contextvars.ContextVar(
    "localpaged_load_progress", default=None)


@contextlib.contextmanager
def reporting_progress(report: LoadProgress):
    """Loads in this context report to `report` (see the module doc); nested blocks: the inner."""
    token = _PROGRESS.set(report)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def _report(step: str, what: str, done: int = 0, total: int = 0) -> None:
    """Progress at `step`, `done` of `total` units into it (the span up to the next step)."""
    report = _PROGRESS.get()
    if report is None:
        return
    steps = list(LOAD_STEPS)
    start = LOAD_STEPS[step]
    end = LOAD_STEPS[steps[steps.index(step) + 1]] if step != steps[-1] else 1.0
    fraction = start + (end - start) * (done / total if total else 0.0)
    report(round(fraction, 4), f"{what} ({done}/{total})" if total else what)


def _progress_of(step: str, what: str) -> Callable[[int, int], None]:
    return lambda done, total: _report(step, what, done, total)


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
    _report("resolve", "finding the model files")
    source = resolve(name, revision)
    stamp = _file_stamp(source)
    _report("config", "reading the config")
    config = copy.deepcopy(_config(source.path, source.gguf_file, stamp))    # each engine its own
    prequantized = getattr(config, "quantization_config", None)   # GPTQ / AWQ (quant/gptq_awq.py)
    whole = None                 # a vision-language model's config; `config` is its text model's
    if vision_loader.is_vision_language(config):
        whole, config = config, vision_loader.text_config(config, quantization, bool(prequantized))
    _check_model_files(source, config)   # before any kernel sees a size or any weight is read
    with torch.device("meta"):            # no memory, no random init: the weights come next
        model = build_model(config)      # refuses unsupported architectures before any weight I/O
    _report("tokenizer", "building the tokenizer")
    tokenizer = _tokenizer(source.path, source.gguf_file, stamp)
    _report("weights", "reading weights")
    packed: dict = {}
    if source.gguf_file:         # tensor by tensor; quantized types stay packed (quant/gguf.py)
        path = os.path.join(source.path, source.gguf_file)
        state, packed = read_gguf(path, config, quantization, _gguf_kernel(path, device, quantization),
                                  on_tensor=_progress_of("weights", "reading tensors"))
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
    _report("install", "installing weights")
    if packed:
        _install_packed(model, packed, device, dtype)     # consumes `packed`
        state = fuse_biases(state)
        logger.info("weights: %s", weights_summary(model)[1])
    _load_weights(model, state, device, dtype)      # consumes `state`
    _report("finish", "finishing")
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
        _report("weights", "compiling the CPU kernels (once for this machine)")
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
        _report("weights", "reading weight files", i, len(files))
        state.update(load_file(file))
    return state


def _load_weights(model: Model, state: dict, device: torch.device, dtype: torch.dtype) -> None:
    """The float weights into the model: `state` is consumed (emptied) layer by layer, so each
    source tensor is freed once its final form exists. On CPU the final tensors become the
    parameters (assign=True; to_empty's pages were never touched, so never resident): no second
    copy of the model. On a GPU to_empty's memory is real, so the weights are copied into it."""
    _empty_on(model, device, dtype)           # quantized modules hold no parameters: untouched
    assign = device.type == "cpu"
    final = _final_tensors(state, device, dtype, assign)
    _check_shapes(model, final)
    missing, unexpected = model.load_state_dict(final, strict=False, assign=assign)
    tied = model.config.tie_word_embeddings
    if tied and not isinstance(model.lm_head, QuantLinear):
        model.lm_head.weight = model.model.embed_tokens.weight
    missing = [k for k in missing if not (k == "lm_head.weight" and tied)]
    unexpected = [k for k in unexpected if "rotary_emb" not in k]
    if missing or unexpected:
        raise ValueError(f"weights do not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    # rebuilt off the meta device, in fp32 as in transformers (Rotary, or Gemma's LayerRotaries)
    model.rotary = type(model.rotary)(model.config, model.head_dim).to(device)
    model.eval().requires_grad_(False)


def _empty_on(model: Model, device: torch.device, dtype: torch.dtype) -> None:
    """model.to_empty(device).to(dtype) for the meta model, parameter by parameter: to_empty's
    empty_like on meta tensors goes through torch._refs, whose first use imports torch's
    symbolic-shapes machinery, a cost on every model load (docs/benchmarks.md, 'Start-up')."""
    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, t in table.items():
                if t is not None and t.is_meta:
                    new = torch.empty(t.shape, dtype=dtype if t.is_floating_point() else t.dtype,
                                      device=device)
                    table[name] = nn.Parameter(new, requires_grad=False) if table is module._parameters else new


def _check_shapes(model: Model, weights: dict[str, torch.Tensor]) -> None:
    """A weight of another shape than the model's (a damaged or mislabelled file): an error
    naming it, before torch's own."""
    expected = model.state_dict(keep_vars=True)
    for name, w in weights.items():
        want = expected.get(name)
        if want is not None and tuple(w.shape) != tuple(want.shape):
            raise ValueError(f"{name}: shape {'x'.join(map(str, w.shape))} does not match the "
                             f"model's {'x'.join(map(str, want.shape))}")


def _by_layer(weights: dict) -> list[list[str]]:
    """Weight names grouped by decoder layer (fusion never crosses one); the embedding's group
    last, so install() ties lm_head to the installed embedding once, after everything else."""
    groups: dict[str, list[str]] = {}
    for key in weights:
        prefix = ".".join(key.split(".")[:3]) if key.startswith("model.layers.") else key
        groups.setdefault(prefix, []).append(key)
    return sorted(groups.values(), key=lambda keys: keys[0].startswith("model.embed_tokens."))


def _install_packed(model: Model, packed: dict, device: torch.device,
                    dtype: torch.dtype) -> None:
    """Packed weights fused and installed layer by layer, popping `packed`: the unfused, fused
    and device (CPU int4) forms of one layer coexist, never those of the whole model."""
    groups = _by_layer(packed)
    for i, keys in enumerate(groups):
        _report("install", "installing layers", i, len(groups))
        part = fuse_packed({k: packed.pop(k) for k in keys})
        install(model, {k: v.to(device) for k, v in part.items()}, dtype)
        del part
        trim_heap()                    # the layer's unfused forms: freed, back to the OS


def _final_tensors(state: dict, device: torch.device, dtype: torch.dtype, cast: bool) -> dict:
    """Fused tensors (layer by layer, see fuse_state_dict), cast to (device, dtype) if `cast`;
    pops `state` as it goes."""
    out: dict[str, torch.Tensor] = {}
    groups = _by_layer(state)
    for i, keys in enumerate(groups):
        _report("place", "placing layers", i, len(groups))
        part = fuse_state_dict({k: state.pop(k) for k in keys})
        out.update({k: v.to(device=device, dtype=dtype) if cast else v for k, v in part.items()})
    return out


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
