"""Batch1Decoder: a decode-only step on CPU, the loop over the layers in C++.

A step is one new token of each decoding sequence, or, under speculative decoding, the 1 + d
rows that verify a draft of d tokens (the same loop over several rows: each linear a matmul of
R rows, row j attending over its own block table and length, as the Python decode rows do).
Named for the case it was built for, one conversation; a batch of chats (each row one
sequence's token) takes it as well: the interpreter's share of a step is the same per step.

At batch 1 a step of a small model spends much of its time in the interpreter between ~40 small
ATen calls per layer. The loop over the decoder layers (kernels/batch1_cpu.cpp) makes the same
ATen calls, in the same order, with the same arguments as the Python path, so its tokens and
logprobs are bitwise the Python path's (docs/benchmarks.md, 'The CPU paths, piece by piece',
has the measured gain). The embedding, rotary table, final norm and logits stay in Python.

The loop is part of the CPU extension (kernels/cpu_extension.py), built once per machine in
the background: steps decode in Python until it is ready, so the first reply never waits for it.
`EngineConfig.enforce_eager` (`--eager`) turns the loop off.

Used when: CPU, the `cpu` attention backend (kernels/cpu_ops.py: the loop calls the same decode
kernel), float32 activations, a KV cache the decode kernel reads (float32, bfloat16, float16 or
int8: the loop writes K/V through kv_rows, the same ATen calls as kernels/kv_quant.py's store), every decoder linear int4 (quant/cpu.py:
CpuInt4Weight, quant/cpu_tiles.py: CpuInt4Tiles), GGML blocks on the extension's kernel
(quant/ggml.py: GgmlWeight, or a PartsWeight of them), with or without a bias, or float32
(models/linear.py: Linear, threaded split included) without bias; no q/k norms; a Llama-family
model (models/llama.py: LlamaForCausalLM; Gemma 3's layers compute otherwise). Anything else
decodes in Python.
"""

from __future__ import annotations

import torch

from localpaged.kernels import cpu_extension, cpu_ops
from localpaged.models.attention import AttentionMetadata, PagedAttention
from localpaged.models.linear import Linear
from localpaged.models.llama import LlamaForCausalLM, split_rope
from localpaged.quant.linear import QuantLinear
from localpaged.quant.weight import BIAS, Batch1Code, Batch1Layout


def _linears(layer) -> tuple:
    return (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
            layer.mlp.down_proj)


def _supported(linear) -> bool:
    """A quantized weight the loop computes (its batch1_layout), with or without a (float32)
    bias, or a float32 Linear without one."""
    if isinstance(linear, QuantLinear):
        return linear.packed.batch1_layout() is not None and (
            linear.bias is None or linear.bias.dtype == torch.float32)
    return isinstance(linear, Linear) and linear.bias is None and linear.weight.dtype == torch.float32


def _layout(linear, threads: int) -> Batch1Layout:
    """How the Python module computes one row, as batch1_cpu.cpp's code (see `linear` there):
    (code, parameter) and the tensors that code reads."""
    if isinstance(linear, QuantLinear):
        (code, parameter), tensors = linear.packed.batch1_layout()
        if linear.bias is not None:
            return [code | BIAS, parameter], [*tensors, linear.bias]
        return [code, parameter], tensors
    blocks = linear.split_blocks(threads) if threads >= 2 else None
    if blocks is None:
        return [Batch1Code.LINEAR, 0], [linear.weight]
    return [Batch1Code.SPLIT, threads], [blocks, linear.weight]


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

    @classmethod
    def create(cls, model, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
               backend: PagedAttention) -> Batch1Decoder | None:
        """A decoder for this model, or None where the conditions above do not hold."""
        if not isinstance(model, LlamaForCausalLM):       # the loop computes Llama's layers
            return None
        layers = model.model.layers
        attn = layers[0].self_attn
        if backend.name != "cpu" or not cpu_ops.supports(attn.head_dim, kv_caches[0][0].dtype):
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
        return cpu_extension.BUILD.wait(timeout)

    def can_run(self, meta: AttentionMetadata) -> bool:
        """A decode-only step (each row a sequence's token, or a sequence's 1 + d rows
        verifying a draft of d: every row attends over its own table and length), once the
        build is ready, for a model whose layers all attend fully (the C++ loop takes no
        window)."""
        return (meta.num_decode_tokens == meta.slot_mapping.shape[0]
                and not self.model.kv_groups.has_window and cpu_extension.BUILD.module is not None)

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
            max_position: int) -> torch.Tensor:
        """Hidden states [R, hidden] after the final norm, as LlamaForCausalLM.forward's."""
        model = self.model.model
        x = model.embed_tokens(input_ids)
        cos, sin = split_rope(self.model.rotary(positions, x.dtype, max_position))
        weights, kinds = self.layout(torch.get_num_threads())
        x = cpu_extension.BUILD.module.decode_layers(
            x, weights, kinds, cos, sin, self.k_caches, self.v_caches, meta.slot_mapping,
            meta.decode_block_tables, meta.decode_seq_lens, *self.shape, self.eps, self.scale,
            model.layers[0].input_layernorm.kernel is not None)
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
                kinds += q + o + g + d
            layout = self._layouts[threads] = (weights, kinds)
        return layout
