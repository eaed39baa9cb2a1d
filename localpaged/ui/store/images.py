"""Images attached to user messages (part of `Store`): the `images` table, schema version 8,
and how an image file is read and checked before anything keeps it.

Content-addressed: a row is keyed by the sha256 of the file's bytes (hex), so the same picture
attached twice, forked or imported again is kept once. A message names its images in
`extra["images"]`: a list of {sha256, name, mime, width, height} (`ImageFile.ref`), in the
order they go before its text in the prompt. Invariant kept by the store: every image a
message names has its row (a message and its images are written in one transaction), and an
image no message names is deleted with the last message that named it (`_drop_unreferenced`,
run by every write that deletes messages).

Reading (`read_image`): chat/image_files.py's checks with PNG / JPEG / WebP / GIF (a GIF's first
frame is what a model sees), at most MAX_IMAGE_BYTES of file and MAX_IMAGE_PIXELS decoded pixels;
a truncated file is refused at attach time, not at send time. Every refusal is a ValueError
naming the file.
"""

from __future__ import annotations

import hashlib
import io
import re
from dataclasses import dataclass
from typing import Any

from PIL import Image

from localpaged.chat.image_files import ImageRefused, open_image

from .db import StoreBase, guarded

MAX_IMAGE_BYTES = 20_000_000          # one image file
MAX_IMAGE_PIXELS = 40_000_000         # width x height of one image
MAX_IMAGES = 8                        # images on one message
MIMES = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}
SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a")


@dataclass(frozen=True)
class ImageFile:
    """One image's bytes as attached, with what the store keeps beside them."""
    sha256: str           # hex sha256 of `data`
    name: str
    mime: str             # one of MIMES' values
    width: int
    height: int
    data: bytes

    def ref(self) -> dict[str, Any]:
        """How a message names it (`extra["images"]`)."""
        return {"sha256": self.sha256, "name": self.name, "mime": self.mime,
                "width": self.width, "height": self.height}


def looks_like_image(name: str, head: bytes) -> bool:
    """Whether a file is meant as an image: its suffix, or its first bytes."""
    return name.lower().endswith(SUFFIXES) or head.startswith(_MAGIC) or (
        head[:4] == b"RIFF" and head[8:12] == b"WEBP")


def read_image(data: bytes, name: str) -> ImageFile:
    """The ImageFile of an image file's bytes; ValueError naming `name` for a file too large,
    not an image of the kinds above, too many pixels, or truncated / damaged."""
    name = name[:200]
    if len(data) > MAX_IMAGE_BYTES:
        raise ValueError(f"{name} is {len(data):,} bytes; an image may have at most "
                         f"{MAX_IMAGE_BYTES:,}")
    try:
        image = open_image(data, MIMES, MAX_IMAGE_PIXELS)
    except ImageRefused as exc:
        raise ValueError(f"{name} {exc}") from None
    kind, (width, height) = image.format, image.size
    return ImageFile(hashlib.sha256(data).hexdigest(), name, MIMES[kind], width, height, data)


def decode(data: bytes) -> Image.Image:
    """A stored image as the RGB picture a model sees (a GIF's first frame)."""
    with Image.open(io.BytesIO(data)) as image:
        image.seek(0)
        return image.convert("RGB")


def image_refs(extra: dict[str, Any]) -> list[dict[str, Any]]:
    """The images a message's `extra` names (well-formed refs only, in order)."""
    refs = extra.get("images")
    if not isinstance(refs, list):
        return []
    return [r for r in refs if isinstance(r, dict) and isinstance(r.get("sha256"), str)]


# The sha256 of every image some message names (rows whose extra is not JSON are skipped).
_REFERENCED = """
    SELECT CASE WHEN i.type = 'object' THEN json_extract(i.value, '$.sha256') END AS sha
    FROM messages m, json_each(CASE WHEN json_valid(m.extra) THEN m.extra ELSE '{}' END,
                               '$.images') i"""


class StoredImages(StoreBase):

    def _put_images(self, images: list[ImageFile]) -> None:
        """Keep these images (inside the caller's transaction); one row per sha256."""
        for im in images:
            self.db.execute("INSERT OR IGNORE INTO images (sha256, mime, width, height, data)"
                            " VALUES (?, ?, ?, ?, ?)",
                            [im.sha256, im.mime, im.width, im.height, im.data])

    def _drop_unreferenced(self) -> None:
        """Delete the images no message names (inside the caller's transaction)."""
        if self.db.execute("SELECT 1 FROM images LIMIT 1").fetchone() is None:
            return                            # no image kept: no message to scan
        self.db.execute("DELETE FROM images WHERE sha256 NOT IN"
                        f" (SELECT sha FROM ({_REFERENCED}) WHERE sha IS NOT NULL)")

    @guarded
    def image(self, sha256: str) -> ImageFile | None:
        """The stored image with this sha256 (its name is the sha256); None when there is none."""
        row = self.db.execute("SELECT mime, width, height, data FROM images WHERE sha256 = ?",
                              [sha256]).fetchone()
        if row is None:
            return None
        return ImageFile(sha256, sha256, row[0], int(row[1]), int(row[2]), bytes(row[3]))

    @guarded
    def image_count(self) -> int:
        return self.db.execute("SELECT count(*) FROM images").fetchone()[0]

    def _images_of(self, shas: list[str]) -> dict[str, ImageFile]:
        out = {}
        for sha in dict.fromkeys(shas):
            im = self.image(sha)
            if im is not None:
                out[sha] = im
        return out
