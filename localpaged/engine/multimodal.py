"""Prompts with images: what the engine takes (ImagePrompt) and how one is made from text and
images by the model's own transformers processor (ImagePreprocessor).

An ImagePrompt is the prompt's token ids, each image's placeholder tokens already in place
(as the processor expands them: Idefics3 writes a grid of crops, each its row/column tag and
its image tokens, then the global view), and one core.multimodal.ImageSpan per image: where
its placeholders lie, its content hash and its pixels (models.vision.ImagePixels). The content
hash is the sha256 of the normalised pixels (dtype, shape and values, and the padding mask):
two uploads of the same picture share KV blocks and encoder-cache entries; a picture resized
otherwise is another image.

The processor is transformers' own, so the pixels and the number of image tokens equal what
transformers feeds its model (tests/models/test_vision_models.py checks both).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from localpaged.core.multimodal import ImageSpan, check_spans
from localpaged.models.vision import ImagePixels, VisionTower


@dataclass(frozen=True)
class ImagePrompt:
    """A prompt with images, as LLMEngine.add_request takes it."""
    token_ids: list[int]
    images: tuple[ImageSpan, ...]
    text: str | None = None          # the text it came from (image markers not expanded)


def content_hash(pixels: ImagePixels) -> bytes:
    """sha256 over the normalised pixels and their padding mask (dtype and shape included)."""
    h = hashlib.sha256()
    for t in (pixels.values, pixels.mask):
        if t is None:
            h.update(b"-")
            continue
        t = t.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.dtype != torch.bool
                 else t.numpy().tobytes())
    return h.digest()


class ImagePreprocessor:
    """A vision-language model's processor and tower: text with image markers and images to
    an ImagePrompt. Bad input (a marker count unlike the image count, an unreadable image) is
    a ValueError."""

    def __init__(self, processor, tower: VisionTower) -> None:
        self.processor = processor
        self.tower = tower
        self.image_token: str = processor.image_token          # the marker in text ("<image>")
        self.image_token_id = tower.image_token_id
        self.whole = tower.bidirectional

    def prompt(self, text: str, images: Sequence, add_special_tokens: bool = True) -> ImagePrompt:
        """`text` holds `image_token` once per image (in order); `images` are PIL images;
        `add_special_tokens`: the tokenizer's own (BOS) added, as the processor does by default."""
        try:
            out = self.processor(text=[text], images=[list(images)] if images else None,
                                 return_tensors="pt", return_text_replacement_offsets=True,
                                 add_special_tokens=add_special_tokens)
        except (ValueError, TypeError, OSError) as exc:
            raise ValueError(f"the images could not be prepared: {exc}") from exc
        ids = out["input_ids"][0].tolist()
        replaced = out.get("text_replacement_offsets", [[]])[0] if images else []
        expanded, spans = _expand(text, replaced)
        offsets = self.processor.tokenizer(expanded, add_special_tokens=add_special_tokens,
                                           return_offsets_mapping=True)["offset_mapping"]
        if len(offsets) != len(ids):
            raise ValueError("the processor's tokens do not follow its text")   # not for this processor
        counts, places = [], []
        for lo, hi in spans:
            inside = [i for i, (a, b) in enumerate(offsets) if lo <= a and b <= hi and b > a]
            first, last = inside[0], inside[-1] + 1
            places.append((first, last))
            counts.append(sum(1 for t in ids[first:last] if t == self.image_token_id))
        pixels = self.tower.split_pixels(out, counts) if images else []
        found = sum(1 for t in ids if t == self.image_token_id)
        if found != sum(counts):
            raise ValueError(f"the prompt holds {found} image tokens outside its images' "
                             f"placeholders ({sum(counts)})")
        result = tuple(ImageSpan(first, last - first, content_hash(p), n, self.whole, p)
                       for (first, last), n, p in zip(places, counts, pixels))
        check_spans(result, len(ids))
        return ImagePrompt(ids, result, text)

    def chat(self, messages: list[dict], images: Sequence, **template_kwargs) -> ImagePrompt:
        """Messages whose content parts include {"type": "image"} (one per image, in order),
        rendered by the processor's chat template with a generation prompt. A template that
        writes the BOS itself (Gemma 3's) gets no second one, as transformers' tokenized
        apply_chat_template decides."""
        text = self.processor.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=True, **template_kwargs)
        bos = self.processor.tokenizer.bos_token
        return self.prompt(text, images, add_special_tokens=not (bos and text.startswith(bos)))


def _expand(text: str, replaced: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """The processor's expanded text (each image marker replaced as it reports) and each
    image's character span in it."""
    out, spans, pos = [], [], 0
    for r in replaced:
        lo, hi = r["span"]
        out.append(text[pos:lo])
        start = sum(len(s) for s in out)
        out.append(r["replacement"])
        spans.append((start, start + len(r["replacement"])))
        pos = hi
    out.append(text[pos:])
    return "".join(out), spans


def prompt_images(prompt: object, ids: list[int], tower: VisionTower | None) -> tuple[ImageSpan, ...]:
    """The images of a prompt for LLMEngine.make_group (() for text or token ids), checked
    against the model: a ValueError for images given to a model without a vision tower, for
    spans outside the prompt, and for image placeholder tokens that no image fills."""
    images = prompt.images if isinstance(prompt, ImagePrompt) else ()
    if images and tower is None:
        raise ValueError("this model takes no images (it has no vision tower)")
    if tower is None:
        return ()
    check_spans(images, len(ids))
    for i, span in enumerate(images):
        inside = sum(1 for t in ids[span.offset:span.end] if t == tower.image_token_id)
        if inside != span.num_embeddings or not isinstance(span.pixels, ImagePixels) \
                or tower.num_embeddings(span.pixels) != inside:
            raise ValueError(f"image {i}: its span holds {inside} image tokens, its pixels give "
                             f"{span.num_embeddings}")
    outside = sum(1 for t in ids if t == tower.image_token_id) - sum(s.num_embeddings for s in images)
    if outside:
        raise ValueError(f"the prompt holds {outside} image placeholder tokens that no image fills")
    return tuple(images)


def ids_and_images(prompt: list[int] | ImagePrompt) -> tuple[list[int], tuple]:
    """A preview's prompt as the block manager takes it: token ids and the images' spans."""
    if isinstance(prompt, ImagePrompt):
        return list(prompt.token_ids), tuple(prompt.images)
    return list(prompt), ()
