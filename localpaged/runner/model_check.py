"""A model's config and its weights' shapes checked at load, before a weight is read or a kernel
runs: a damaged or mislabelled model is refused with a ValueError naming the field or the
tensor and the file, instead of failing inside an engine step (or, for a zero size, crashing the
process in a kernel's division).

    check_config(config, where)                  # architecture, sizes, heads, eps, rope
    built_config(build, where)                   # transformers' own refusals as a ValueError
    check_shapes(shapes, config, where)          # {parameter name: shape} of a file's tensors
    gguf_shapes(path), safetensors_shapes(folder)   # those directories, without reading weights

Shapes are those of transformers' (unfused) parameters, [out, in] for a matrix, as both a
safetensors file and a GGUF directory (quant/gguf_file.py) list them. Only the tensors a file
has are compared here; a missing or unexpected one is named by the loader's state-dict check.
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
from collections.abc import Callable, Mapping

from transformers import PretrainedConfig

from localpaged.models import check_architecture

# Far above every released model (Llama 3.1 405B: hidden 16384, 126 layers, 128 heads; vocabularies
# to 256k; contexts to 10M positions), far below what would exhaust memory before an error.
SIZE_LIMITS = {
    "hidden_size": 1 << 17, "intermediate_size": 1 << 20, "vocab_size": 1 << 22,
    "num_hidden_layers": 1024, "num_attention_heads": 1024, "num_key_value_heads": 1024,
    "head_dim": 4096, "max_position_embeddings": 1 << 26,
}
OPTIONAL = ("head_dim",)          # absent: hidden_size / num_attention_heads
LAYER = re.compile(r"model\.layers\.(\d+)\.")


def check_config(config: PretrainedConfig | Mapping, where: str) -> None:
    """A supported architecture, every size positive and within SIZE_LIMITS, heads that divide
    as attention needs, a finite positive rms_norm_eps and rope_theta; else a ValueError naming
    the field and `where`.
    `config` may be a config.json's raw fields, checked before transformers builds the config
    (whose own checks divide by some of them): a field it leaves out is checked once built."""
    raw = isinstance(config, Mapping)
    get = config.get if raw else (lambda name: getattr(config, name, None))
    check_architecture(get("model_type"), get("architectures"))   # other families: other fields
    for name, top in SIZE_LIMITS.items():
        value = get(name)
        if value is None and (raw or name in OPTIONAL):
            continue
        if not _is_int(value) or not 0 < value <= top:
            _refuse(name, value, f"must be a positive integer (at most {top})", where)
    _check_heads(get, where)
    positions = get("max_position_embeddings")
    if positions is not None and positions < 2:
        _refuse("max_position_embeddings", positions, "must be at least 2 (a prompt and a "
                "reply)", where)
    eps = get("rms_norm_eps")
    if eps is not None or not raw:
        _check_positive_number("rms_norm_eps", eps, where)
    for name, value in _rope_thetas(get):
        _check_positive_number(name, value, where)
    if get("query_pre_attn_scalar") is not None:       # Gemma: the attention scale's base
        _check_positive_number("query_pre_attn_scalar", get("query_pre_attn_scalar"), where)


def _check_heads(get, where: str) -> None:
    """Query heads in whole groups per KV head; a whole, even per-head size."""
    hidden, heads = get("hidden_size"), get("num_attention_heads")
    kv = get("num_key_value_heads") or heads
    if heads and kv and heads % kv:
        _refuse("num_key_value_heads", kv, f"must divide num_attention_heads ({heads})", where)
    dim = get("head_dim")
    if dim is None and hidden and heads:
        if hidden % heads:
            _refuse("hidden_size", hidden, f"must be a multiple of num_attention_heads "
                    f"({heads}) when the config gives no head_dim", where)
        dim = hidden // heads
    if dim and dim % 2:
        _refuse("head_dim", dim, "must be even (rotary embeddings rotate pairs)", where)


def built_config(build: Callable[[], PretrainedConfig], where: str) -> PretrainedConfig:
    """build(), with transformers' own refusal of a config (any error but a missing or unreadable
    file) raised as a ValueError naming `where`."""
    try:
        return build()
    except OSError:
        raise
    except Exception as exc:          # its validators raise ZeroDivisionError and others
        raise ValueError(f"invalid model config in {where}: {type(exc).__name__}: {exc}") from exc


def raw_config(file: str) -> dict:
    """A config.json's fields as written, for check_config before transformers reads them."""
    with open(file, encoding="utf-8") as f:
        try:
            fields = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{file} is not valid JSON: {exc}") from exc
    if not isinstance(fields, dict):
        # a bad file, not a bad argument: ValueError as for every other refusal here
        raise ValueError(f"{file} must hold a JSON object, got {type(fields).__name__}")  # noqa: TRY004
    return fields


def head_dim(config: PretrainedConfig) -> int:
    """The per-head size attention uses (as LlamaForCausalLM computes it)."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def expected_shapes(config: PretrainedConfig) -> dict[str, tuple[tuple[int, ...], str]]:
    """{parameter name: (shape, how the config gives it)} for every weight and bias the family
    may have (a bias is compared only where the file holds one)."""
    H, V, I = config.hidden_size, config.vocab_size, config.intermediate_size
    D, nq, nkv = head_dim(config), config.num_attention_heads, config.num_key_value_heads
    q = (nq * D, f"num_attention_heads*head_dim ({nq}*{D})")
    kv = (nkv * D, f"num_key_value_heads*head_dim ({nkv}*{D})")
    hidden, inter = (H, f"hidden_size ({H})"), (I, f"intermediate_size ({I})")
    layer = {"self_attn.q_proj": (q, hidden), "self_attn.k_proj": (kv, hidden),
             "self_attn.v_proj": (kv, hidden), "self_attn.o_proj": (hidden, q),
             "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden),
             "mlp.down_proj": (hidden, inter)}
    out = {"model.embed_tokens.weight": _shape((V, f"vocab_size ({V})"), hidden),
           "lm_head.weight": _shape((V, f"vocab_size ({V})"), hidden),
           "model.norm.weight": _shape(hidden)}
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        for module, (rows, cols) in layer.items():
            out[f"{p}{module}.weight"] = _shape(rows, cols)
            out[f"{p}{module}.bias"] = _shape(rows)
        for norm in ("input_layernorm", "post_attention_layernorm",       # Gemma 3: all four
                     "pre_feedforward_layernorm", "post_feedforward_layernorm"):
            out[f"{p}{norm}.weight"] = _shape(hidden)
        for norm in ("self_attn.q_norm", "self_attn.k_norm"):
            out[f"{p}{norm}.weight"] = _shape((D, f"head_dim ({D})"))
    return out


def check_shapes(shapes: dict[str, tuple[int, ...]], config: PretrainedConfig, where: str,
                 file_names: dict[str, str] | None = None) -> None:
    """Each tensor of `shapes` (by parameter name) has the shape the config gives it, and no
    tensor belongs to a layer the config does not have; `file_names`: the names the file uses,
    where they differ (GGUF)."""
    expected, layers = expected_shapes(config), config.num_hidden_layers
    for name, shape in shapes.items():
        origin = f"tensor {(file_names or {}).get(name, name)} of {where}"
        m = LAYER.match(name)
        if m and int(m.group(1)) >= layers:
            raise ValueError(f"{name}: layer {m.group(1)}, but the config has "
                             f"num_hidden_layers={layers} ({origin})")
        want = expected.get(name)
        if want is not None and tuple(shape) != want[0]:
            raise ValueError(f"{name}: shape {_dims(shape)} does not match the model's "
                             f"{_dims(want[0])} = {want[1]} ({origin})")


def gguf_shapes(path: str, model_type: str | None = None
                ) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """({parameter name: shape}, {parameter name: its GGUF name}) of a GGUF file's tensors,
    from its directory alone; `model_type` (the config's) names the family's tensors."""
    from localpaged.quant.gguf import hf_name
    from localpaged.quant.gguf_file import GgufFile
    shapes, names = {}, {}
    for t in GgufFile(path).tensors:
        name = hf_name(t.name, model_type)
        if name is not None:
            shapes[name], names[name] = tuple(t.shape), t.name
    return shapes, names


def safetensors_shapes(folder: str) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} over a folder's *.safetensors files, from their headers alone."""
    from safetensors import safe_open
    shapes = {}
    for file in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        with safe_open(file, "pt") as f:
            shapes.update({k: tuple(f.get_slice(k).get_shape()) for k in f.keys()})  # noqa: SIM118
    return shapes


def _rope_thetas(get) -> list[tuple[str, object]]:
    """(field, value) of the rope base wherever the config holds one."""
    found = []
    params = get("rope_parameters")
    if isinstance(params, Mapping) and "rope_theta" in params:
        found.append(("rope_parameters.rope_theta", params["rope_theta"]))
    elif isinstance(params, Mapping):        # per layer type (Gemma 3: full / sliding attention)
        found += [(f"rope_parameters.{kind}.rope_theta", p["rope_theta"])
                  for kind, p in params.items() if isinstance(p, Mapping) and "rope_theta" in p]
    if get("rope_theta") is not None:
        found.append(("rope_theta", get("rope_theta")))
    return found


def _check_positive_number(name: str, value: object, where: str) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (ok and math.isfinite(value) and value > 0):
        _refuse(name, value, "must be a finite number > 0", where)


def _shape(*dims: tuple[int, str]) -> tuple[tuple[int, ...], str]:
    return tuple(d for d, _ in dims), " x ".join(why for _, why in dims)


def _dims(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape)) or "a scalar"


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _refuse(name: str, value: object, rule: str, where: str) -> None:
    raise ValueError(f"{name} {rule}, got {value!r} (in {where})")
