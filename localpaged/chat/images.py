"""Chat messages that carry images, as the chat app sends them to a backend.

A user message with images has list content: one part {"type": "image", "sha256": hex,
"image": PIL image} per image, before its text part {"type": "text", "text": ...} (the order
transformers' processors' chat templates take). `sha256` names the image (the store's key);
`image` holds its pixels, or a zero-argument callable that returns them (decoded only when a
prompt is built). Every other message keeps its string content.

- `template_messages(messages)`: the messages as a processor's chat template takes them (every
  content a list of parts, image parts bare {"type": "image"}) and the images, in order.
- `ImageWindow`: the context window (chat/context_window.py) for a backend whose model may see
  images: a conversation with images is counted and sent as the model's processor makes its
  prompt (an engine ImagePrompt: the image placeholders expanded, so every image token counts);
  for a model that takes no images, such a conversation is a ValueError saying so. Conversations
  without images are counted as before.
- `images_from_cache(prompt, cached_tokens)`: whether a request's images needed neither the
  vision encoder nor their prefill: the prefix cache served every token up to the last image's
  end (the engine computes no image token it was given from the cache, so the encoder is not
  asked for them either).
- `REMOTE_REFUSAL`: why a remote backend refuses them (images the user attaches are never sent
  anywhere).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from localpaged.chat.context_window import ContextWindow
from localpaged.engine.multimodal import ImagePrompt

Messages = list[dict]
REMOTE_REFUSAL = ("This conversation has images, and images you attach are never sent to a "
                  "remote server: load a local vision-language model to ask about them.")
# What an ImageWindow keeps: the last ImagePrompts made (they hold the images' pixels, tens of
# MB for a large image: only the one a send counts, then submits), and many prompts' counts.
_PROMPTS_KEPT = 2
_COUNTS_KEPT = 256


def is_image(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "image"


def has_images(messages: Messages) -> bool:
    return any(isinstance(m.get("content"), list) and any(is_image(p) for p in m["content"])
               for m in messages)


def template_messages(messages: Messages) -> tuple[Messages, list]:
    """(messages whose content is a list of text / bare image parts, the images in order);
    ValueError for an image part without its pixels."""
    out, images = [], []
    for m in messages:
        content = m.get("content")
        parts = []
        for part in content if isinstance(content, list) else [content or ""]:
            if is_image(part):
                image = part.get("image")
                if image is None:
                    raise ValueError("an image of this conversation could not be read")
                images.append(image() if callable(image) else image)
                parts.append({"type": "image"})
            elif isinstance(part, dict):
                parts.append({"type": "text", "text": str(part.get("text", ""))})
            else:
                parts.append({"type": "text", "text": str(part)})
        out.append({**m, "content": parts})
    return out, images


def _key(messages: Messages, template_kwargs: dict) -> str:
    """What an image prompt depends on: the messages, each image by its sha256."""
    def part(p):
        if not is_image(p):
            return p
        sha = p.get("sha256") or hashlib.sha256(p["image"].tobytes()).hexdigest()
        return {"type": "image", "sha256": sha}
    plain = [{**m, "content": [part(p) for p in m["content"]]} if isinstance(m.get("content"), list)
             else m for m in messages]
    return json.dumps([plain, template_kwargs], sort_keys=True, default=str)


class ImageWindow(ContextWindow):
    """A ContextWindow that counts and builds prompts with images through `image_prompt`
    (AsyncEngine.image_prompt: messages with bare image parts, the images, template kwargs),
    or refuses them, naming `model`, where `image_prompt` is None."""

    def __init__(self, tokenizer, limit: int,
                 image_prompt: Callable[..., ImagePrompt] | None, model: str = "this model",
                 **kwargs) -> None:
        super().__init__(tokenizer, limit, **kwargs)
        self._image_prompt, self._model = image_prompt, model
        self._prompts: OrderedDict[str, ImagePrompt] = OrderedDict()   # LRU by _key
        self._counts: OrderedDict[str, int] = OrderedDict()            # LRU by _key
        self._prompts_lock = threading.Lock()

    def image_prompt(self, messages: Messages) -> ImagePrompt:
        """The engine prompt of a chat with images (with a generation prompt); ValueError for
        a model that takes no images or an image its processor cannot prepare."""
        if self._image_prompt is None:
            raise ValueError(f"{self._model} takes no images: load a vision-language model "
                             "(SmolVLM, Idefics3, Gemma 3) to send this conversation, or remove "
                             "its images")
        key = _key(messages, self.template_kwargs)
        with self._prompts_lock:
            if key in self._prompts:
                self._prompts.move_to_end(key)
                return self._prompts[key]
        msgs, images = template_messages(messages)
        prompt = self._image_prompt(msgs, images, **self.template_kwargs)
        with self._prompts_lock:
            _keep(self._prompts, key, prompt, _PROMPTS_KEPT)
            _keep(self._counts, key, len(prompt.token_ids), _COUNTS_KEPT)
        return prompt

    def token_ids(self, messages: Messages, add_generation_prompt: bool = True,
                  continue_final_message: bool = False) -> list[int]:
        if not has_images(messages):
            return super().token_ids(messages, add_generation_prompt, continue_final_message)
        if continue_final_message or not add_generation_prompt:
            raise ValueError("a conversation with images is sent only as a new reply's prompt")
        return list(self.image_prompt(messages).token_ids)

    def count_tokens(self, messages: Messages, draft: str | None = None,
                     add_generation_prompt: bool = True,
                     continue_final_message: bool = False) -> int:
        if not has_images(messages):
            return super().count_tokens(messages, draft, add_generation_prompt,
                                        continue_final_message)
        if draft:
            messages = [*messages, {"role": "user", "content": draft}]
        if continue_final_message or not add_generation_prompt:
            return len(self.token_ids(messages, add_generation_prompt, continue_final_message))
        if self._image_prompt is not None:
            key = _key(messages, self.template_kwargs)
            with self._prompts_lock:
                if key in self._counts:
                    self._counts.move_to_end(key)
                    return self._counts[key]
        return len(self.image_prompt(messages).token_ids)


def _keep(lru: OrderedDict, key: str, value, size: int) -> None:
    lru[key] = value
    lru.move_to_end(key)
    while len(lru) > size:
        lru.popitem(last=False)


def images_from_cache(prompt: ImagePrompt | None, cached_tokens: int | None) -> bool | None:
    """True when the prefix cache served every image of the prompt (None: no images, or the
    count is unknown)."""
    if prompt is None or not prompt.images or cached_tokens is None:
        return None
    return cached_tokens >= max(span.end for span in prompt.images)
