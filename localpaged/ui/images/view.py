"""What a user message's images look like in the chat: a row of thumbnails, each a link that
opens the full image in a new tab. The markup is the app's own, built from the message's
`extra["images"]` (never from its text, whose Markdown stays image-free: markdown.py): the
sha256 (checked to be 64 hex digits), the name and size escaped. Both the thumbnail and the
full image come from the app's own route (events.py), so the page loads no image from
anywhere else (the Content-Security-Policy's img-src 'self').
"""

from __future__ import annotations

import html
from typing import Any

from ..store.images import SHA256, image_refs

ROUTE = "/lp/image"          # ROUTE/{sha256}: the image; ROUTE/{sha256}?thumb=1: its thumbnail
THUMB_PX = 160               # a thumbnail's longest side


def image_url(sha256: str, thumb: bool = False) -> str:
    return f"{ROUTE}/{sha256}" + ("?thumb=1" if thumb else "")


def thumbnails(extra: dict[str, Any]) -> str:
    """The thumbnails of a user message's images ("" without any)."""
    cells = []
    for ref in image_refs(extra):
        sha = ref["sha256"]
        if not SHA256.match(sha):
            continue
        name = html.escape(str(ref.get("name") or "image")[:80])
        size = f"{int(ref.get('width') or 0)}×{int(ref.get('height') or 0)}"
        cells.append(f'<a class="lp-thumb" href="{image_url(sha)}" target="_blank" '
                     f'rel="noopener noreferrer" title="{name} ({size}): open the full image">'
                     f'<img src="{image_url(sha, thumb=True)}" alt="{name}" loading="lazy"></a>')
    return f'<div class="lp-images">{"".join(cells)}</div>' if cells else ""
