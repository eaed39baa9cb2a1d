"""The route that serves stored images to the page, and pasting images into the message box.

`/lp/image/{sha256}` answers the image's own bytes under its stored mime type, `?thumb=1` a
small PNG thumbnail made with Pillow. It serves only images the store keeps, looked up by their
sha256 (anything else is a 404: no path, no URL, nothing but 64 hex digits is read), behind the
app's guard (the host and origin checks of every route: api/guard.py). Content-addressed, so a
response never changes: the browser may keep it.

PASTE_JS: an image pasted into a tab's message box (`#msg{i}`) is handed to that tab's
📎 Attach button's file input (`#attachbtn{i}`), so it joins the attached files exactly as a
picked file does (read and checked on send). Each pasted image is named pasted-<time>.<ext>:
the attached list keeps one file per name.
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


PASTE_JS = """() => {
  document.addEventListener('paste', (e) => {
    const box = e.target.closest && e.target.closest("[id^='msg'] textarea");
    const files = [...((e.clipboardData && e.clipboardData.files) || [])]
      .filter((f) => f.type.startsWith('image/'));
    if (!box || !files.length) return;
    const i = box.closest("[id^='msg']").id.slice(3);
    const input = document.querySelector(`#attachbtn${i}`)?.parentElement
      ?.querySelector('input[type=file]');
    if (!input) return;
    e.preventDefault();
    const dt = new DataTransfer();
    files.forEach((f, k) => dt.items.add(new File([f],
      `pasted-${Date.now()}${k ? '-' + k : ''}.${(f.type.split('/')[1] || 'png').replace('jpeg', 'jpg')}`,
      {type: f.type})));
    input.files = dt.files;
    input.dispatchEvent(new Event('change', {bubbles: true}));
  }, true);
}"""


def wire_paste(loaded) -> None:
    """After the page loads: images pasted into a message box are attached (PASTE_JS)."""
    loaded.then(None, None, None, js=PASTE_JS)


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
