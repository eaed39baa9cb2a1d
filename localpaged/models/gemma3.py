"""Gemma 3's text decoder (transformers' Gemma3ForCausalLM, model_type "gemma3_text") over a paged
KV cache.

Parameter names mirror transformers' so its state dict loads as is (q/k/v and gate/up fused by
models.llama.fuse_state_dict, as for Llama). What differs from the Llama family, each computed
as transformers computes it (models/gemma3/modeling_gemma3.py):
- the embedding is multiplied by sqrt(hidden_size), a float32 scalar cast to the model dtype
  (Gemma3TextScaledWordEmbedding); applied here after the lookup, so a quantized embedding
  (quant/linear.py: QuantEmbedding) is scaled the same way;
- RMSNorm scales by (1 + weight), in float32 before the cast back (Gemma3RMSNorm); the file
  stores `weight`, the (1 + weight) table is made once per weight;
- four norms per layer (input, post_attention, pre_feedforward, post_feedforward): the norm of
  each block's output is taken before it joins the residual stream; q/k norms on every layer;
- GeGLU MLP (`hidden_activation`, gelu_pytorch_tanh for released models);
- attention scale query_pre_attn_scalar ** -0.5 instead of head_dim ** -0.5;
- local (sliding-window) and global layers rotate with their own rope base: one
  models.llama.Rotary per layer type (`LayerRotaries`);
- optional final logit softcapping (None for Gemma 3). Attention logit softcapping (Gemma 2)
  is refused: the paged kernels do not apply it.
The sliding-window layers attend over their window through their KV-cache group's metadata
(models/layer_types.py, models/attention.py: layer_metadata), as every model does.

The C++ batch-1 decode loop (runner/batch1_cpu.py) is Llama-only: it never runs for this class.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig
from transformers.activations import ACT2FN

from localpaged.models.attention import AttentionMetadata, PagedAttention, layer_metadata
from localpaged.models.layer_types import kv_groups
from localpaged.models.linear import Linear
from localpaged.models.llama import MLP, Attention, DecoderModel, Rotary, split_rope


class GemmaRMSNorm(nn.Module):
    """x / rms(x) * (1 + weight), in float32, cast back to x's dtype (Gemma3RMSNorm).

    (1 + weight) is computed as transformers does (`1.0 + weight.float()`) and kept: the product
    of the normalized row and it is one multiplication either way, so F.rms_norm with it as the
    weight gives transformers' values (bitwise in float32, as for models/llama.py RMSNorm); the
    CPU extension's kernel, once the loader chooses it, rounds the sum its own way, as for
    Llama (tests/kernels/test_cpu_norm.py)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps
        self.kernel = None          # set by Gemma3ForCausalLM.use_norm_kernel (float32 only)
        self._scale: tuple[tuple, torch.Tensor] | None = None    # (weight's identity, 1 + weight)

    def scale(self) -> torch.Tensor:
        """1 + weight in float32, remade whenever the weight is replaced or written."""
        w = self.weight
        key = (w.data_ptr(), w._version, w.device)
        if self._scale is None or self._scale[0] != key:
            self._scale = (key, 1.0 + w.detach().float())
        return self._scale[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.scale()
        if self.kernel is not None and x.dtype == torch.float32:
            return self.kernel(x, scale, self.eps)
        out = F.rms_norm(x.float(), scale.shape, scale, self.eps)
        return out if x.dtype == torch.float32 else out.to(x.dtype)


class GemmaAttention(Attention):
    """Llama's attention (fused qkv, q/k norms, rotary, paged backend) with Gemma's scale, norms
    and output bias."""

    def __init__(self, config: PretrainedConfig, head_dim: int) -> None:
        super().__init__(config, head_dim)
        self.scale = config.query_pre_attn_scalar ** -0.5
        self.q_norm = GemmaRMSNorm(head_dim, config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(head_dim, config.rms_norm_eps)
        if config.attention_bias:          # transformers gives o_proj the same bias setting
            self.o_proj = Linear(self.num_heads * head_dim, config.hidden_size, bias=True)


class GemmaMLP(MLP):
    """down(act(gate(x)) * up(x)) with the config's activation (GeGLU)."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__(config)
        self.act = ACT2FN[config.hidden_activation]


class GemmaDecoderLayer(nn.Module):
    def __init__(self, config: PretrainedConfig, head_dim: int) -> None:
        super().__init__()
        self.self_attn = GemmaAttention(config, head_dim)
        self.mlp = GemmaMLP(config)
        H, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(H, eps)
        self.post_attention_layernorm = GemmaRMSNorm(H, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(H, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(H, eps)

    def forward(self, x, rope, kv_cache, meta, backend):
        attn = self.self_attn(self.input_layernorm(x), rope, kv_cache, meta, backend)
        x = x + self.post_attention_layernorm(attn)
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class LayerRotaries(nn.Module):
    """One Rotary per layer type of the config (Gemma 3: full attention with base 1e6, sliding
    with 1e4), as transformers' Gemma3RotaryEmbedding keeps one inv_freq per type."""

    def __init__(self, config: PretrainedConfig, head_dim: int) -> None:
        super().__init__()
        self.by_type = nn.ModuleDict({t: Rotary(config, head_dim, t)
                                      for t in sorted(set(config.layer_types))})

    def table(self, max_position: int, dtype: torch.dtype) -> None:
        """Every type's table built up to max_position (before a graph capture)."""
        for rotary in self.by_type.values():
            rotary.table(max_position, dtype)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype,
                max_position: int | None = None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """{layer type: (cos, signed sin)} of the positions (models.llama.split_rope)."""
        if max_position is None:
            max_position = int(positions.max()) if positions.numel() else 0
        return {t: split_rope(r(positions, dtype, max_position)) for t, r in self.by_type.items()}


def check_config(config: PretrainedConfig) -> None:
    """What this class cannot compute, refused by name before any weight is read."""
    if getattr(config, "attn_logit_softcapping", None) is not None:
        raise ValueError(f"attn_logit_softcapping={config.attn_logit_softcapping} is not "
                         f"supported (the paged attention kernels do not cap logits)")
    if getattr(config, "use_bidirectional_attention", False):
        raise ValueError("use_bidirectional_attention is not supported (a causal decoder only)")


class Gemma3ForCausalLM(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        check_config(config)
        self.config = config
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        # a plain lookup: the sqrt(hidden) scale is applied by embed()
        self.model = DecoderModel(config, self.head_dim, GemmaDecoderLayer, GemmaRMSNorm)
        self.kv_groups = kv_groups(config)      # which layers attend over which window
        self.layer_types = tuple(config.layer_types)
        self.rotary = LayerRotaries(config, self.head_dim)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.softcap = getattr(config, "final_logit_softcapping", None)
        self._embed_scales: dict[torch.dtype, torch.Tensor] = {}

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The scaled embedding: lookup * sqrt(hidden_size), the scale a float32 scalar cast to
        the model dtype first (in bfloat16 sqrt(640) = 25.298 becomes 25.25, sqrt(3072) 55.5)."""
        x = self.model.embed_tokens(input_ids)
        scale = self._embed_scales.get(x.dtype)
        if scale is None:
            scale = self._embed_scales[x.dtype] = torch.tensor(self.config.hidden_size ** 0.5).to(x.dtype)
        return x * scale

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                meta: AttentionMetadata | list[AttentionMetadata],
                backend: PagedAttention, max_position: int | None = None,
                images: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """`meta`: one AttentionMetadata per KV-cache group, or one for all (layer_metadata).
        `images`: (rows, embeddings) that replace those rows' scaled token embeddings (the
        vision tower's output is not scaled, as in transformers' Gemma3Model)."""
        x = self.embed(input_ids)
        if images is not None:
            x = x.index_copy(0, images[0], images[1].to(x.dtype))
        ropes = self.rotary(positions, x.dtype, max_position)      # {layer type: (cos, sin)}
        metas = layer_metadata(meta, self.kv_groups.windows, self.kv_groups.layer_group)
        for layer, kind, kv_cache, layer_meta in zip(self.model.layers, self.layer_types,
                                                     kv_caches, metas):
            x = layer(x, ropes[kind], kv_cache, layer_meta, backend)
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        if self.softcap is not None:          # in the model dtype, as transformers
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits.float()

    def use_norm_kernel(self, kernel) -> None:
        """Every RMSNorm runs `kernel(x, 1 + weight, eps)` on float32 from now on (chosen once)."""
        for module in self.modules():
            if isinstance(module, GemmaRMSNorm):
                module.kernel = kernel
