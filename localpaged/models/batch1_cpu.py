"""Batch1Decoder: one conversation's decode step on CPU, the loop over the layers in C++.

At batch 1 an int4 step of a small model is mostly Python: ~40 small ATen calls per layer and the
interpreter between them, against ~3.7 ms of weight reads (SmolLM2-135M, 2 cores). The loop over
the decoder layers (`batch1_cpu.cpp`) makes the same ATen calls, in the same order, with the same
arguments as the Python path, so its output is bitwise the Python path's; measured on SmolLM2 on
this project's 2-core machine, side by side: int4 128-131 -> 165-188 tok/s, float32 41 -> 44-47,
the same tokens and logprobs. The embedding, rotary table, final norm and logits stay in Python.

The extension is compiled once per machine by torch.utils.cpp_extension (g++ and ninja; ~20 s,
then cached under ~/.cache/torch_extensions) in a background thread: steps decode in Python
until it is ready, so the first reply never waits for it. A build that fails logs one line and
leaves Python decoding. `EngineConfig.enforce_eager` (`--eager`) turns it off.

Used when: CPU, the torch attention backend (kernels/reference.py), float32 activations and KV
cache, every decoder linear int4 (quant/cpu.py: CpuInt4Weight) or float32 (models/linear.py:
Linear, threaded split included) without bias, no q/k norms. Anything else decodes in Python.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import torch

from localpaged.attention import AttentionMetadata, PagedAttention
from localpaged.kernels.reference import back_to_back
from localpaged.models.linear import Linear
from localpaged.models.llama import split_rope
from localpaged.quant.cpu import CpuInt4Weight
from localpaged.quant.linear import QuantLinear

logger = logging.getLogger(__name__)

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "batch1_cpu.cpp")


class _Build:
    """The compiled extension, built at most once per process (every engine shares it)."""

    def __init__(self) -> None:
        self.module = None
        self.done = threading.Event()
        self._started = False
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if not self._started:
                self._started = True
                threading.Thread(target=self._run, name="batch1-cpu-build", daemon=True).start()

    def _run(self) -> None:
        start = time.monotonic()
        try:
            from torch.utils.cpp_extension import load
            self.module = load("localpaged_batch1_cpu", [SOURCE], extra_cflags=["-O2"], verbose=False)
            logger.info("batch-1 CPU decode loop ready (%.1f s)", time.monotonic() - start)
        except Exception as exc:                     # no compiler, no ninja, a build error
            why = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            logger.warning("batch-1 CPU decode loop not built (%s): decoding in Python", why)
        finally:
            self.done.set()


BUILD = _Build()


def _linears(layer) -> tuple:
    return (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
            layer.mlp.down_proj)


def _supported(linear) -> bool:
    """int4 (CpuInt4Weight) or float32 Linear, without bias."""
    if isinstance(linear, QuantLinear):
        return isinstance(linear.packed, CpuInt4Weight) and linear.bias is None
    return isinstance(linear, Linear) and linear.bias is None and linear.weight.dtype == torch.float32


def _layout(linear, threads: int) -> tuple[int, list[torch.Tensor]]:
    """How the Python module computes one row, as batch1_cpu.cpp's code (see `linear` there),
    and the tensors that code reads."""
    if isinstance(linear, QuantLinear):
        return -linear.packed.group_size, [linear.packed.packed, linear.packed.scales_zeros]
    blocks = linear.split_blocks(threads) if threads >= 2 else None
    return (0, [linear.weight]) if blocks is None else (threads, [blocks])


class Batch1Decoder:
    def __init__(self, model, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.model = model
        self.k_caches = [k for k, _ in kv_caches]
        self.v_caches = [v for _, v in kv_caches]
        # torch threads -> (tensors in batch1_cpu.cpp's order, four linear codes per layer)
        self._layouts: dict[int, tuple[list[torch.Tensor], list[int]]] = {}
        attn = model.model.layers[0].self_attn
        self.shape = (attn.num_heads, attn.num_kv_heads, attn.head_dim)
        self.eps, self.scale = model.model.layers[0].input_layernorm.eps, attn.scale
        BUILD.start()

    @classmethod
    def create(cls, model, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
               backend: PagedAttention) -> Batch1Decoder | None:
        """A decoder for this model, or None where the conditions above do not hold."""
        layers = model.model.layers
        if backend.name != "torch" or kv_caches[0][0].device.type != "cpu":
            return None
        if any(k.dtype != torch.float32 or not back_to_back(k) or not back_to_back(v)
               for k, v in kv_caches):
            return None
        if not all(_supported(m) for layer in layers for m in _linears(layer)):
            return None
        norms = [n for layer in layers for n in (layer.input_layernorm, layer.post_attention_layernorm)]
        if any(layer.self_attn.q_norm is not None for layer in layers) or any(
                n.weight.dtype != torch.float32 for n in norms):
            return None
        return cls(model, kv_caches)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the build; whether the C++ loop is in use."""
        BUILD.done.wait(timeout)
        return BUILD.module is not None

    def can_run(self, meta: AttentionMetadata) -> bool:
        """A batch-1 decode step (the runner computed its runs), once the build is ready."""
        return meta.decode_runs is not None and BUILD.module is not None

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
            max_position: int) -> torch.Tensor:
        """Hidden states [1, hidden] after the final norm, as LlamaForCausalLM.forward's."""
        model = self.model.model
        x = model.embed_tokens(input_ids)
        cos, sin = split_rope(self.model.rotary(positions, x.dtype, max_position))
        firsts, lengths = zip(*meta.decode_runs)
        weights, kinds = self.layout(torch.get_num_threads())
        x = BUILD.module.decode_layers(x, weights, kinds, cos, sin, self.k_caches, self.v_caches,
                                       meta.slot_mapping, list(firsts), list(lengths),
                                       *self.shape, self.eps, self.scale)
        return model.norm(x)

    def layout(self, threads: int) -> tuple[list[torch.Tensor], list[int]]:
        """Per layer: input norm, qkv, o, post-attention norm, gate_up, down (see the .cpp)."""
        layout = self._layouts.get(threads)
        if layout is None:
            weights, kinds = [], []
            for layer in self.model.model.layers:
                (q, qt), (o, ot), (g, gt), (d, dt) = (_layout(m, threads) for m in _linears(layer))
                weights += [layer.input_layernorm.weight, *qt, *ot,
                            layer.post_attention_layernorm.weight, *gt, *dt]
                kinds += [q, o, g, d]
            layout = self._layouts[threads] = (weights, kinds)
        return layout
