"""Llama-family decoder (Llama, Mistral, Qwen2/2.5, Qwen3, SmolLM2) over a paged KV cache.

Parameter names mirror transformers' so a Hugging Face state dict loads as is. The model takes a
flat batch (all sequences' new tokens concatenated, [T]) with their positions and an
AttentionMetadata; it returns hidden states [T, hidden]. Differences between the family members:
qkv bias (Qwen2, `attention_bias`), per-head q/k RMSNorm (Qwen3), explicit head_dim, tied
embeddings, and the rope scaling variants transformers defines (computed by transformers itself).

On CPU `batch1_cpu.cpp` runs these layers' batch-1 decode op for op in C++ (int4 or float32
weights): keep the two in step (tests/kernels/test_batch1_cpu.py compares them).
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from localpaged.models.attention import AttentionMetadata, PagedAttention, layer_metadata
from localpaged.models.layer_types import kv_groups
from localpaged.models.linear import Linear

logger = logging.getLogger(__name__)

class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        # the CPU extension's one-pass RMSNorm (kernels/cpu_norm.cpp) for float32, set when the
        # model loads (LlamaForCausalLM.use_norm_kernel), else None
        self.kernel = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is not None and x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return self.kernel(x, self.weight, self.eps)
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            # torch's fused kernel: one op instead of six, bitwise equal to the formula below in
            # float32 (checked by tests/engine/test_latency_paths.py); in half precision it is not.
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Rotary(nn.Module):
    """cos/sin for arbitrary positions, computed exactly as transformers computes them.

    The values are kept in a table indexed by position (grown by doubling when a larger
    position shows up), so a step costs one index instead of recomputing cos/sin. A table row
    is [cos | signed sin]: the sin half for the first D/2 dims is negated so that rotate-half
    becomes a roll (see apply_rotary); (-a)*b == a*(-b) exactly, so outputs stay bitwise equal.
    """

    def __init__(self, config: PretrainedConfig, head_dim: int, layer_type: str | None = None) -> None:
        """`layer_type`: for configs whose rope_parameters are per layer type (Gemma 3:
        {"full_attention": {...}, "sliding_attention": {...}}), the type this table serves."""
        super().__init__()
        params = getattr(config, "rope_parameters", None) or {}
        if layer_type is not None:
            params = params[layer_type]
        rope_type = params.get("rope_type", "default")
        if rope_type == "default":
            base = params.get("rope_theta", 10000.0)
            # device="cpu" even inside the loader's meta-device context: a meta arange imports
            # torch._dynamo, a cost on every model load (docs/benchmarks.md, 'Start-up'); the
            # loader builds the real Rotary afterwards
            steps = torch.arange(0, head_dim, 2, dtype=torch.float, device="cpu")
            inv_freq = 1.0 / (base ** (steps / head_dim))
            self.scaling = 1.0
        else:
            kwargs = {} if layer_type is None else {"layer_type": layer_type}
            inv_freq, self.scaling = ROPE_INIT_FUNCTIONS[rope_type](config, None, **kwargs)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._tables: dict[tuple, torch.Tensor] = {}     # (dtype, device) -> [n, 2, D]

    def table(self, max_position: int, dtype: torch.dtype) -> torch.Tensor:
        """[n, 2, D] with n > max_position: row p holds (cos, signed sin) of position p."""
        key = (dtype, self.inv_freq.device)
        table = self._tables.get(key)
        if table is None or table.shape[0] <= max_position:
            n = max(256, 1 << max_position.bit_length())
            positions = torch.arange(n, device=self.inv_freq.device)
            cos, sin = self.compute(positions, dtype)
            half = sin.shape[-1] // 2
            sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
            table = self._tables[key] = torch.stack((cos, sin), dim=1)
        return table

    def compute(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[:, None].float() * self.inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.scaling).to(dtype), (emb.sin() * self.scaling).to(dtype)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype,
                max_position: int | None = None) -> torch.Tensor:
        """[T, 2, D] (cos, signed sin) rows of the given positions.

        `max_position` (an upper bound of positions, known to the caller) avoids reading the
        positions back from the device; a graph capture passes the table's bound.
        """
        if max_position is None:
            max_position = int(positions.max()) if positions.numel() else 0
        return self.table(max_position, dtype).index_select(0, positions)


def apply_rotary(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D]; rope [T, 2, D] from Rotary.forward.

    Equals transformers' x*cos + rotate_half(x)*sin: roll(x) = cat(x2, x1) and the sin row is
    (-s1, s2), so each element is the same product and the same sum.
    """
    return rotate(x, *split_rope(rope))


def split_rope(rope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """rope [T, 2, D] -> (cos, signed sin), each [T, 1, D]: views, taken once per step."""
    rope = rope[:, None]
    return rope[..., 0, :], rope[..., 1, :]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """apply_rotary on the split table (see there)."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


class Attention(nn.Module):
    def __init__(self, config: PretrainedConfig, head_dim: int) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = head_dim
        self.scale = head_dim ** -0.5
        bias = bool(getattr(config, "attention_bias", config.model_type == "qwen2"))
        hidden = config.hidden_size
        self.sizes = [self.num_heads * head_dim, self.num_kv_heads * head_dim, self.num_kv_heads * head_dim]
        self.qkv_proj = Linear(hidden, sum(self.sizes), bias=bias)   # q, k, v stacked: one matmul
        self.o_proj = Linear(self.num_heads * head_dim, hidden, bias=False)
        if config.model_type == "qwen3":
            self.q_norm = RMSNorm(head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(head_dim, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x, rope, kv_cache, meta: AttentionMetadata, backend: PagedAttention):
        T, H = x.shape[0], self.num_heads
        qkv = self.qkv_proj(x)
        v = qkv[:, self.sizes[0] + self.sizes[1]:].view(T, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k, _ = qkv.split(self.sizes, dim=-1)
            q = self.q_norm(q.view(T, H, self.head_dim))
            k = self.k_norm(k.view(T, self.num_kv_heads, self.head_dim))
            qk = torch.cat((q, k), dim=1)
        else:
            qk = qkv[:, :self.sizes[0] + self.sizes[1]].view(T, H + self.num_kv_heads, self.head_dim)
        qk = rotate(qk, *rope)              # q and k heads rotated together: one set of ops
        q, k = qk[:, :H], qk[:, H:]
        out = backend.forward(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale)
        return self.o_proj(out.reshape(T, self.num_heads * self.head_dim))


# On CPU a long prefill's MLP runs in passes of rows whose gate/up activations stay under this.
# glibc maps an allocation above its mmap threshold afresh and unmaps it when freed; the
# threshold follows the sizes freed up to 32 MB, and a thread other than the main one maps
# anything larger than its arena's 64 MB heap. A 1,000-token chunk's gate/up of a 1.5B model
# (72 MB) was thus page-faulted and zeroed by the kernel in every layer; passes under 32 MB come
# back from the heap (docs/benchmarks.md, "Activations in passes", has the cost). The weights
# are read once per pass; each row's result does not depend on the pass.
CPU_ACTIVATION_BYTES = 24 << 20


class MLP(nn.Module):
    """down(act(gate(x)) * up(x)), gate and up in one matmul; act is SiLU (SwiGLU)."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        bias = bool(getattr(config, "mlp_bias", False))
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, bias=bias)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=bias)
        self.act = F.silu
        self.gate_up_width = 2 * config.intermediate_size     # elements per row of gate/up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = max(1, CPU_ACTIVATION_BYTES // (self.gate_up_width * x.element_size()))
        if x.device.type != "cpu" or x.shape[0] <= rows:
            return self._pass(x)
        return torch.cat([self._pass(part) for part in x.split(rows)])

    def _pass(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        half = gate_up.shape[-1] // 2           # two slices: fewer ops per layer than chunk()
        hidden = self.act(gate_up[..., :half])
        return self.down_proj(hidden.mul_(gate_up[..., half:]))    # in place: one tensor fewer


class DecoderLayer(nn.Module):
    def __init__(self, config: PretrainedConfig, head_dim: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, head_dim)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, rope, kv_cache, meta, backend):
        x = x + self.self_attn(self.input_layernorm(x), rope, kv_cache, meta, backend)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderModel(nn.Module):
    """embed_tokens, layers, norm (transformers' names); `layer` and `norm` are the family's
    classes (Gemma 3 passes its own: models/gemma3.py)."""

    def __init__(self, config: PretrainedConfig, head_dim: int, layer: type[nn.Module] = DecoderLayer,
                 norm: type[nn.Module] = RMSNorm) -> None:
        super().__init__()
        # _weight: no random init (the loader fills it; on the meta device, init would import
        # torch._dynamo, a cost on every model load: docs/benchmarks.md, 'Start-up')
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size,
                                         _weight=torch.empty(config.vocab_size, config.hidden_size))
        self.layers = nn.ModuleList(layer(config, head_dim) for _ in range(config.num_hidden_layers))
        self.norm = norm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.config = config
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.model = DecoderModel(config, self.head_dim)
        self.kv_groups = kv_groups(config)      # which layers attend over which window
        self.rotary = Rotary(config, self.head_dim)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                meta: AttentionMetadata | list[AttentionMetadata],
                backend: PagedAttention, max_position: int | None = None,
                images: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """`meta`: one AttentionMetadata per KV-cache group, or one for all (layer_metadata).
        `images`: (rows, embeddings) that replace those rows' token embeddings (a vision
        tower's output at image placeholders: runner/image_batch.py)."""
        x = self.model.embed_tokens(input_ids)
        if images is not None:
            x = x.index_copy(0, images[0], images[1].to(x.dtype))
        rope = split_rope(self.rotary(positions, x.dtype, max_position))    # (cos, sin)
        metas = layer_metadata(meta, self.kv_groups.windows, self.kv_groups.layer_group)
        for layer, kv_cache, layer_meta in zip(self.model.layers, kv_caches, metas):
            x = layer(x, rope, kv_cache, layer_meta, backend)
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def use_norm_kernel(self, kernel) -> None:
        """Every RMSNorm runs `kernel(x, weight, eps)` on float32 from now on (chosen once)."""
        for module in self.modules():
            if isinstance(module, RMSNorm):
                module.kernel = kernel


FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
         "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}


def fuse_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' separate q/k/v and gate/up weights, stacked into our fused projections.

    Stacking rows does not change any output element: each is still one dot product over the
    same inputs (checked bitwise by the equality tests against transformers).
    """
    out = dict(state)
    layers = [k[:-len(".self_attn.q_proj.weight")] for k in state if k.endswith(".self_attn.q_proj.weight")]
    for prefix in layers:
        for fused, parts in FUSED.items():
            for kind in ("weight", "bias"):
                names = [f"{prefix}.{part}.{kind}" for part in parts]
                if all(n in out for n in names):
                    out[f"{prefix}.{fused}.{kind}"] = torch.cat([out.pop(n) for n in names])
    return out
