"""The vision side of Idefics3 and SmolVLM (Idefics3ForConditionalGeneration,
SmolVLMForConditionalGeneration): SigLIP over each crop of an image, then the connector: a
pixel shuffle that folds each scale x scale group of patches into one vector, and a linear
projection into the text model's hidden size. Their text model is Llama (models/llama.py).

An image is its processor's crops (a grid of crops and a global view, or the global view
alone); each crop gives (patches / scale^2) embeddings, and the prompt holds as many image
tokens per crop, crop after crop: `encode` returns them in that order, as transformers'
`get_image_features` flattens them.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn
from transformers import PretrainedConfig

from localpaged.models.vision import ImagePixels, split_crops
from localpaged.models.vision.siglip import SiglipVisionTransformer


class Idefics3SimpleMLP(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        size = config.vision_config.hidden_size * config.scale_factor ** 2
        self.proj = nn.Linear(size, config.text_config.hidden_size, bias=False)


class Idefics3Connector(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.scale_factor = config.scale_factor
        self.modality_projection = Idefics3SimpleMLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.modality_projection.proj(pixel_shuffle(x, self.scale_factor))


def pixel_shuffle(x: torch.Tensor, scale: int) -> torch.Tensor:
    """[N, h*w, D] patch states of square crops -> [N, h*w / scale^2, D * scale^2], each output
    row the scale x scale patches of a square of the grid, in transformers' element order."""
    n, seq, dim = x.shape
    side = int(seq ** 0.5)
    x = x.view(n, side, side // scale, dim * scale).permute(0, 2, 1, 3)
    x = x.reshape(n, side // scale, side // scale, dim * scale * scale).permute(0, 2, 1, 3)
    return x.reshape(n, seq // (scale * scale), dim * scale * scale)


class Idefics3Vision(nn.Module):
    """vision_model and connector, as transformers names them under `model.`."""

    # checkpoint name prefixes -> ours, for the tower and for the text model (runner/vision_loader.py)
    CHECKPOINT_NAMES = (("model.vision_model.", "vision_model."), ("model.connector.", "connector."))
    TEXT_NAMES = (("model.text_model.", "model."),)
    UNUSED: tuple[str, ...] = ()
    bidirectional = False            # the Llama text model is causal over image tokens too

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.vision_model = SiglipVisionTransformer(config.vision_config)
        self.connector = Idefics3Connector(config)
        self.image_token_id = int(config.image_token_id)
        vc = config.vision_config
        self.tokens_per_crop = (vc.image_size // vc.patch_size) ** 2 // config.scale_factor ** 2

    def num_embeddings(self, pixels: ImagePixels) -> int:
        return pixels.values.shape[0] * self.tokens_per_crop

    def split_pixels(self, batch: Mapping, counts: list[int]) -> list[ImagePixels]:
        """The processor's output for one prompt (pixel_values [1, crops of all images, C, H,
        W], padded with empty crops; pixel_attention_mask alike) cut into its images, whose
        placeholder counts are `counts`: image k has counts[k] / tokens_per_crop crops."""
        mask = batch.get("pixel_attention_mask")
        mask = mask[0].bool() if mask is not None else None
        return split_crops(batch["pixel_values"][0], mask, counts, self.tokens_per_crop)

    def encode(self, pixels: ImagePixels) -> torch.Tensor:
        values = pixels.values.to(self.connector.modality_projection.proj.weight.device)
        p = self.vision_model.config.patch_size
        if pixels.mask is None:           # every patch real, positioned as transformers' NaViT
            n, _, h, w = values.shape
            patch_mask = torch.ones(n, h // p, w // p, dtype=torch.bool, device=values.device)
        else:
            mask = pixels.mask.to(values.device)
            grid = mask.unfold(1, p, p).unfold(2, p, p)       # [N, H/p, W/p, p, p]
            patch_mask = grid.sum(dim=(-1, -2)) > 0
        states = self.vision_model(values, patch_mask)
        out = self.connector(states)
        return out.reshape(-1, out.shape[-1])
