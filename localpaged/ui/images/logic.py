"""Images in a chat tab, in plain Python: how a user message's stored images become the image
parts of its chat message (chat/images.py: one part per image, before the text, its pixels
decoded only when a prompt is built), which attachments of a send are images, and what a
reply's footer says about them.

Where pixels come from (`ImageSource`): the store (`Store.image`), and for a message being
sent, its images before they are stored (`Pending`): a message and its images are written in
one transaction, after the request is known to fit, so a refused send stores nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ..store.images import ImageFile, decode, image_refs

CACHE_NOTE = "🖼 image from cache (encoder and prefill skipped)"
ENCODER_NOTE = "🖼 image from the encoder cache (encoder skipped)"


class ImageSource(Protocol):
    def image(self, sha256: str) -> ImageFile | None: ...


class Pending:
    """Images attached to a message not stored yet, in front of the store's."""

    def __init__(self, images: Sequence[ImageFile], store: ImageSource) -> None:
        self._images = {im.sha256: im for im in images}
        self._store = store

    def image(self, sha256: str) -> ImageFile | None:
        return self._images.get(sha256) or self._store.image(sha256)


def _pixels(source: ImageSource, sha256: str):
    """The picture stored under sha256, decoded (a zero-argument callable's body: decoded only
    when a prompt needs it)."""
    def load():
        found = source.image(sha256)
        if found is None:
            raise ValueError(f"an image of this conversation is missing from the store "
                             f"({sha256[:12]}…)")
        return decode(found.data)
    return load


def image_parts(extra: dict[str, Any], source: ImageSource | None) -> list[dict]:
    """The image parts of a user message whose `extra` names images ([] when none). Without a
    source the parts carry no pixels: counting or sending them is a ValueError (chat/images.py)."""
    return [{"type": "image", "sha256": ref["sha256"],
             "image": None if source is None else _pixels(source, ref["sha256"])}
            for ref in image_refs(extra)]


def split_attachments(attachments: list[dict] | None) -> tuple[list[dict], list[ImageFile]]:
    """(text attachments, images) of a send's attachments (tools/messages.py read_attachment:
    an image is {"kind": "image", "image": ImageFile})."""
    texts, images = [], []
    for att in attachments or []:
        if att.get("kind") == "image":
            images.append(att["image"])
        else:
            texts.append(att)
    return texts, images


def footer_note(stats: dict[str, Any]) -> str:
    """What a reply's footer says about its prompt's images ("" when it had none, or when the
    vision encoder ran for them)."""
    if stats.get("images_from_cache"):
        return CACHE_NOTE
    return ENCODER_NOTE if stats.get("image_tower_runs") == 0 else ""
