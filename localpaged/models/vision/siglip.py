"""SigLIP vision encoder (the tower of Idefics3, SmolVLM and Gemma 3), in transformers' names.

A batch of crops [N, C, H, W] becomes patch states [N, patches, hidden]: a strided convolution
per patch, a learned position embedding, pre-norm encoder layers with bidirectional attention
over all patches of a crop, a final LayerNorm. Position ids follow Idefics3's NaViT variant
(`patch_positions`) where a patch mask is given (Idefics3 always gives one): a crop with padding
takes positions spread over the grid of a full crop, as transformers computes them. Without a
mask (Gemma 3) every patch is real and takes positions 0 .. patches-1, plain SigLIP's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig
from transformers.activations import ACT2FN


class SiglipEmbeddings(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.patch_size = config.patch_size
        self.patch_embedding = nn.Conv2d(config.num_channels, config.hidden_size,
                                         kernel_size=config.patch_size, stride=config.patch_size)
        self.num_patches_per_side = config.image_size // config.patch_size
        self.position_embedding = nn.Embedding(self.num_patches_per_side ** 2, config.hidden_size)

    def forward(self, pixel_values: torch.Tensor, patch_mask: torch.Tensor | None) -> torch.Tensor:
        """pixel_values [N, C, H, W], patch_mask [N, H/p, W/p] (bool; None: plain SigLIP, every
        patch real, positions 0 .. patches-1) -> [N, patches, hidden]."""
        x = self.patch_embedding(pixel_values.to(self.patch_embedding.weight.dtype))
        x = x.flatten(2).transpose(1, 2)
        if patch_mask is None:
            return x + self.position_embedding.weight[:x.shape[1]]
        return x + self.position_embedding(patch_positions(patch_mask, self.num_patches_per_side))


def patch_positions(patch_mask: torch.Tensor, per_side: int) -> torch.Tensor:
    """Position ids [N, h*w] of each crop's patches: a crop whose real patches form an a x b
    grid maps them onto the per_side x per_side grid of positions by bucketing their
    fractional coordinates (transformers' Idefics3VisionEmbeddings); padded patches take 0."""
    n, h, w = patch_mask.shape
    device = patch_mask.device
    boundaries = torch.arange(1 / per_side, 1.0, 1 / per_side, device=device)
    rows = patch_mask[:, :, 0].sum(dim=1)
    cols = patch_mask[:, 0, :].sum(dim=1)
    frac_h = torch.arange(h, device=device, dtype=torch.float32)[None, :] * (1.0 / rows)[:, None]
    frac_w = torch.arange(w, device=device, dtype=torch.float32)[None, :] * (1.0 / cols)[:, None]
    bucket_h = torch.bucketize(frac_h.clamp(max=1.0 - 1e-6), boundaries, right=True)
    bucket_w = torch.bucketize(frac_w.clamp(max=1.0 - 1e-6), boundaries, right=True)
    ids = (bucket_h[:, :, None] * per_side + bucket_w[:, None, :]).reshape(n, -1)
    return torch.where(patch_mask.view(n, -1), ids, torch.zeros_like(ids))


class SiglipAttention(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        dim = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = dim // self.num_heads
        self.scale = self.head_dim ** -0.5
        self.q_proj, self.k_proj = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.v_proj, self.out_proj = nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """x [N, S, D]; mask [N, 1, 1, S] (true: a key to attend to) or None (all)."""
        n, s, _ = x.shape
        q, k, v = (proj(x).view(n, s, self.num_heads, self.head_dim).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        return self.out_proj(out.transpose(1, 2).reshape(n, s, -1))


class SiglipMLP(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.act = ACT2FN[config.hidden_act]
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class SiglipEncoderLayer(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.self_attn = SiglipAttention(config)
        self.layer_norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = SiglipMLP(config)
        self.layer_norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x), mask)
        return x + self.mlp(self.layer_norm2(x))


class SiglipEncoder(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(SiglipEncoderLayer(config) for _ in range(config.num_hidden_layers))


class SiglipVisionTransformer(nn.Module):
    """embeddings, encoder.layers, post_layernorm (transformers' names)."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = SiglipEmbeddings(config)
        self.encoder = SiglipEncoder(config)
        self.post_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, pixel_values: torch.Tensor, patch_mask: torch.Tensor | None = None) -> torch.Tensor:
        """[N, C, H, W] crops -> [N, patches, hidden]; `patch_mask` [N, H/p, W/p] marks real
        patches, positioned as Idefics3 does (None: plain SigLIP, all are real)."""
        x = self.embeddings(pixel_values, patch_mask)
        mask = None
        if patch_mask is not None:
            flat = patch_mask.view(patch_mask.shape[0], -1)
            mask = None if bool(flat.all()) else flat[:, None, None, :]
        for layer in self.encoder.layers:
            x = layer(x, mask)
        return self.post_layernorm(x)
