"""Weights into a model built on the meta device (runner.loader builds it): the float weights
fused and placed layer by layer (`load_weights`), the packed (quantized) weights fused and
installed layer by layer (`install_packed`).

Invariants: the source dicts are consumed as the weights are placed, so at most one layer's
source, fused and final forms coexist, never those of the whole model; a weight whose shape is
not the model's is an error naming it before torch's own.
"""

from __future__ import annotations

import torch
from torch import nn

from localpaged.models import Model
from localpaged.models.llama import fuse_state_dict
from localpaged.quant.convert import fuse_packed
from localpaged.quant.linear import QuantLinear, install
from localpaged.quant.memory import trim_heap
from localpaged.runner.load_progress import report


def load_weights(model: Model, state: dict, device: torch.device, dtype: torch.dtype) -> None:
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


def install_packed(model: Model, packed: dict, device: torch.device,
                    dtype: torch.dtype) -> None:
    """Packed weights fused and installed layer by layer, popping `packed`: the unfused, fused
    and device (CPU int4) forms of one layer coexist, never those of the whole model."""
    groups = _by_layer(packed)
    for i, keys in enumerate(groups):
        report("install", "installing layers", i, len(groups))
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
        report("place", "placing layers", i, len(groups))
        part = fuse_state_dict({k: state.pop(k) for k in keys})
        out.update({k: v.to(device=device, dtype=dtype) if cast else v for k, v in part.items()})
    return out
