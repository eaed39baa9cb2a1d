"""The route that serves stored images to the page: `/lp/image/{sha256}` answers the image's
own bytes under its stored mime type, `?thumb=1` a small PNG thumbnail made with Pillow. It
serves only images the store keeps, looked up by their sha256 (anything else is a 404: no
path, no URL, nothing but 64 hex digits is read), behind the app's guard (the host and origin
checks of every route: api/guard.py). Content-addressed, so a response never changes: the
browser may keep it.
"""

from __future__ import annotations

import io

from anyio import to_thread
from fastapi import APIRouter, Response
from PIL import Image

from ..controller import ChatController
from ..store.images import SHA256, decode
from .view import ROUTE, THUMB_PX

_HEADERS = {"Cache-Control": "private, max-age=31536000, immutable",
            "Content-Disposition": "inline"}


def thumbnail(data: bytes) -> bytes:
    """A PNG of the image scaled to fit THUMB_PX (never enlarged)."""
    image = decode(data)
    image.thumbnail((THUMB_PX, THUMB_PX), Image.Resampling.LANCZOS)
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()


def image_router(ctl: ChatController) -> APIRouter:
    router = APIRouter()

    @router.get(ROUTE + "/{sha256}", include_in_schema=False)
    async def stored_image(sha256: str, thumb: int = 0) -> Response:
        if not SHA256.match(sha256):
            return Response("no such image", status_code=404, media_type="text/plain")
        found = await to_thread.run_sync(ctl.store.image, sha256)
        if found is None:
            return Response("no such image", status_code=404, media_type="text/plain")
        if thumb:
            return Response(await to_thread.run_sync(thumbnail, found.data),
                            media_type="image/png", headers=_HEADERS)
        return Response(found.data, media_type=found.mime, headers=_HEADERS)

    return router
