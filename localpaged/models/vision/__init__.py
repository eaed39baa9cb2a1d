"""Vision towers: from an image's pixels to the embeddings its placeholder tokens take in the
text model. One module per family (idefics3.py: SigLIP + pixel shuffle + linear, for Idefics3
and SmolVLM; gemma3.py: SigLIP + average pooling, RMSNorm and projection, for Gemma 3);
siglip.py is the encoder they share. Parameter names mirror transformers' so a checkpoint's
vision weights load as they are (runner/vision_loader.py maps each family's checkpoint names;
runner/mmproj.py a llama.cpp projector file's).

Every tower has the interface the runner uses (`VisionTower`): `encode(pixels)` returns one
row per placeholder token of the image, in the order the placeholders appear in the prompt.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class ImagePixels:
    """One image as its model's processor prepared it: `values` [crops, channels, H, W]
    (normalised), `mask` [crops, H, W] (true on real pixels, false on padding) or None."""
    values: torch.Tensor
    mask: torch.Tensor | None = None


class VisionTower(Protocol):
    image_token_id: int          # the placeholder token whose embeddings the tower gives
    # whether an image's placeholder tokens attend to each other both ways in the text model
    # (Gemma 3): its spans are then core.multimodal.ImageSpan.whole
    bidirectional: bool

    def encode(self, pixels: ImagePixels) -> torch.Tensor:
        """[placeholder tokens of the image, text hidden size], in prompt order."""
        ...

    def num_embeddings(self, pixels: ImagePixels) -> int:
        """The rows `encode(pixels)` returns, without running it."""
        ...

    def split_pixels(self, batch: Mapping, counts: list[int]) -> list[ImagePixels]:
        """The model's processor output for one prompt, cut into its images (`counts`: each
        image's placeholder tokens, in order)."""
        ...


def split_crops(values: torch.Tensor, mask: torch.Tensor | None, counts: list[int],
                tokens_per_crop: int) -> list[ImagePixels]:
    """A prompt's crops ([crops of all images, C, H, W], in image order; `mask` alike or None)
    cut into its images, image k taking counts[k] / tokens_per_crop of them; a ValueError where
    a count is not a whole number of crops or the crops run out."""
    out, start = [], 0
    for n in counts:
        crops = n // tokens_per_crop
        if crops * tokens_per_crop != n or start + crops > values.shape[0]:
            raise ValueError(f"an image with {n} placeholder tokens does not match the pixels "
                             f"({tokens_per_crop} tokens per crop)")
        out.append(ImagePixels(values[start:start + crops],
                               mask[start:start + crops] if mask is not None else None))
        start += crops
    return out
