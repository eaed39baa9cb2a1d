"""The vision side of Gemma 3 (Gemma3ForConditionalGeneration): SigLIP over each image at a fixed
size (no crops of its own; pan and scan adds whole-image crops), then Gemma3MultiModalProjector:
average pooling of the patch grid down to mm_tokens_per_image, Gemma's RMSNorm and a
projection into the text model's hidden size. Its text model is models/gemma3.py.

An image (or each of its pan-and-scan crops) gives mm_tokens_per_image embeddings; the prompt
holds as many image tokens per crop between <start_of_image> and <end_of_image>, crop after
crop, as transformers' `get_image_features` flattens them. Gemma 3 lets an image's tokens
attend to each other both ways (`bidirectional`): its spans are `ImageSpan.whole`, what is
left of one computed in one prefill step with the attention opened over each run of image
tokens (models/attention.py).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from localpaged.models.gemma3 import GemmaRMSNorm
from localpaged.models.vision import ImagePixels, split_crops
from localpaged.models.vision.siglip import SiglipVisionTransformer


class Gemma3MultiModalProjector(nn.Module):
    """[N, patches, vision hidden] -> [N, mm_tokens_per_image, text hidden] (transformers'
    Gemma3MultiModalProjector: avg pool, mm_soft_emb_norm, x @ mm_input_projection_weight)."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        vc = config.vision_config
        self.mm_input_projection_weight = nn.Parameter(
            torch.zeros(vc.hidden_size, config.text_config.hidden_size))
        self.mm_soft_emb_norm = GemmaRMSNorm(vc.hidden_size, vc.layer_norm_eps)
        self.patches_per_side = vc.image_size // vc.patch_size
        tokens_per_side = int(config.mm_tokens_per_image ** 0.5)
        if tokens_per_side ** 2 != config.mm_tokens_per_image \
                or self.patches_per_side % tokens_per_side:
            raise ValueError(f"mm_tokens_per_image={config.mm_tokens_per_image} must be a square "
                             f"whose side divides the {self.patches_per_side} patches per side")
        self.kernel = self.patches_per_side // tokens_per_side

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        n, _, dim = states.shape
        side = self.patches_per_side
        grid = states.transpose(1, 2).reshape(n, dim, side, side).contiguous()
        pooled = F.avg_pool2d(grid, self.kernel, self.kernel).flatten(2).transpose(1, 2)
        return torch.matmul(self.mm_soft_emb_norm(pooled), self.mm_input_projection_weight).type_as(states)


class Gemma3Vision(nn.Module):
    """vision_tower (SigLIP) and multi_modal_projector, as transformers names them under `model.`."""

    bidirectional = True             # an image's tokens attend to each other both ways
    # checkpoint name prefixes -> ours (runner/vision_loader.py): Google's files nest the tower
    # as vision_tower.vision_model.*, transformers 5 saves vision_tower.*; the SigLIP pooling
    # head (vision_tower.head.*, where a file has it) is not used by Gemma 3
    CHECKPOINT_NAMES = (("model.vision_tower.vision_model.", "vision_tower."),
                        ("vision_tower.vision_model.", "vision_tower."),
                        ("model.vision_tower.", "vision_tower."), ("vision_tower.", "vision_tower."),
                        ("model.multi_modal_projector.", "multi_modal_projector."),
                        ("multi_modal_projector.", "multi_modal_projector."))
    TEXT_NAMES = (("model.language_model.", "model."), ("language_model.model.", "model."),
                  ("language_model.lm_head.", "lm_head."))
    UNUSED = ("vision_tower.head.",)

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.vision_tower = SiglipVisionTransformer(config.vision_config)
        self.multi_modal_projector = Gemma3MultiModalProjector(config)
        self.image_token_id = int(config.image_token_id)
        self.tokens_per_crop = int(config.mm_tokens_per_image)

    def num_embeddings(self, pixels: ImagePixels) -> int:
        return pixels.values.shape[0] * self.tokens_per_crop

    def split_pixels(self, batch: Mapping, counts: list[int]) -> list[ImagePixels]:
        """The processor's output for one prompt (pixel_values [crops of all images, C, H, W],
        each image followed by its pan-and-scan crops) cut into its images: image k has
        counts[k] / mm_tokens_per_image of them."""
        return split_crops(batch["pixel_values"], None, counts, self.tokens_per_crop)

    def encode(self, pixels: ImagePixels) -> torch.Tensor:
        weight = self.multi_modal_projector.mm_input_projection_weight
        states = self.vision_tower(pixels.values.to(weight.device))
        out = self.multi_modal_projector(states)
        return out.reshape(-1, out.shape[-1])
