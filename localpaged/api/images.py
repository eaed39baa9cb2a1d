"""Images in chat requests: OpenAI `image_url` content parts read into PIL images under the
server's ImagePolicy, and the messages rewritten for the model's processor (each image part
becomes {"type": "image"}, read in order).

Where an image may come from (ImagePolicy, set by the server's options; the defaults read
nothing outside the request):
- `data:` URLs with base64 PNG, JPEG or WebP bytes: always;
- a local file (`file:///path` or an absolute path): only inside a folder the server was
  started with (--allow-image-dir), symlinks resolved before the check;
- `http(s)://` URLs: only when the server fetches them (--fetch-image-urls), at most
  `max_bytes`, with a timeout.
Every refusal is an APIError (400) naming the part (`messages[i].content[j]`): an unreadable
or unsupported image, a source the policy refuses, more than `max_images` images, a file
too large. Decoding is bounded (`max_pixels`; Pillow's decompression-bomb check as an error).
"""

from __future__ import annotations

import base64
import binascii
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from localpaged.api.errors import APIError
from localpaged.chat.image_files import ImageRefused, open_image

FORMATS = {"PNG", "JPEG", "WEBP"}
DATA_TYPES = {"image/png", "image/jpeg", "image/jpg", "image/webp"}
FETCH_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ImagePolicy:
    allowed_dirs: tuple[Path, ...] = ()     # local folders whose files a request may name
    fetch_remote: bool = False              # http(s) URLs fetched by the server
    max_bytes: int = 20 * 2**20             # one image's encoded bytes
    max_images: int = 8                     # images in one request
    max_pixels: int = 40_000_000            # one decoded image

    @classmethod
    def of(cls, allowed_dirs: list[str] | None = None, fetch_remote: bool = False,
           max_mb: float | None = None) -> "ImagePolicy":
        dirs = tuple(Path(d).resolve() for d in allowed_dirs or ())
        for d in dirs:
            if not d.is_dir():
                raise ValueError(f"--allow-image-dir {d}: not a folder")
        extra = {} if max_mb is None else {"max_bytes": int(max_mb * 2**20)}
        return cls(dirs, fetch_remote, **extra)


class RequestImages:
    """A request's images, read in order under `policy` (`read_image`), at most its
    `max_images`: the OpenAI parts here and the Anthropic blocks (anthropic/convert.py)."""

    def __init__(self, policy: ImagePolicy) -> None:
        self.policy = policy
        self.images: list[Image.Image] = []

    def read(self, url: str, param: str) -> None:
        if len(self.images) == self.policy.max_images:
            raise APIError(f"Too many images: at most {self.policy.max_images} in a request.",
                           param=param, code="too_many_images")
        self.images.append(read_image(url, self.policy, param))


def chat_images(messages, policy: ImagePolicy) -> tuple[list[dict], list[Image.Image]]:
    """(messages with content parts {"type": "text", "text"} / {"type": "image"} and the
    roles the template knows, the images in order) for a request whose messages hold
    image_url parts (protocol.ChatMessage)."""
    out: list[dict] = []
    images = RequestImages(policy)
    for i, m in enumerate(messages):
        role = "system" if m.role == "developer" else m.role
        if not isinstance(m.content, list):
            out.append({"role": role, "content": [{"type": "text", "text": m.text()}]})
            continue
        parts = []
        for j, part in enumerate(m.content):
            param = f"messages[{i}].content[{j}]"
            if part.type == "text":
                parts.append({"type": "text", "text": part.text})
            elif part.type == "image_url":
                images.read(part.image_url.url, param)
                parts.append({"type": "image"})
            else:
                raise APIError(f"Content parts of type {part.type!r} are not supported.",
                               param=param, code="unsupported_content")
        out.append({"role": role, "content": parts})
    return out, images.images


def read_image(url: str, policy: ImagePolicy, param: str) -> Image.Image:
    """The image at `url` as RGB, or an APIError naming `param`."""
    if url.startswith("data:"):
        data = _data_url(url, param)
    elif url.startswith(("http://", "https://")):
        if not policy.fetch_remote:
            raise APIError("Remote image URLs are not fetched by this server (start it with "
                           "--fetch-image-urls to allow it).", param=param,
                           code="image_url_not_allowed")
        data = _fetch(url, policy.max_bytes, param)
    elif url.startswith("file://") or os.path.isabs(url):
        data = _local_file(url.removeprefix("file://"), policy, param)
    else:
        raise APIError("An image URL must be a data: URL, an http(s) URL or a local file path.",
                       param=param, code="invalid_image_url")
    if len(data) > policy.max_bytes:
        raise APIError(f"The image is {len(data)} bytes; at most {policy.max_bytes}.",
                       param=param, code="image_too_large")
    return _decode(data, policy.max_pixels, param)


def _data_url(url: str, param: str) -> bytes:
    head, sep, payload = url.partition(",")
    kind = head[len("data:"):].split(";")[0].lower()
    if not sep or not head.endswith(";base64") or kind not in DATA_TYPES:
        raise APIError("A data: URL image must be base64 PNG, JPEG or WebP "
                       "(data:image/png;base64,...).", param=param, code="invalid_image_url")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise APIError(f"The data: URL is not valid base64: {exc}", param=param,
                       code="invalid_image_url") from exc


def _local_file(path: str, policy: ImagePolicy, param: str) -> bytes:
    real = Path(path).resolve()
    if not any(real.is_relative_to(d) for d in policy.allowed_dirs):
        raise APIError("Local image files are read only from folders the server allows "
                       "(--allow-image-dir); this path is not in one.", param=param,
                       code="image_url_not_allowed")
    try:
        size = real.stat().st_size
        if size > policy.max_bytes:
            raise APIError(f"The image file is {size} bytes; at most {policy.max_bytes}.",
                           param=param, code="image_too_large")
        return real.read_bytes()
    except OSError as exc:
        raise APIError(f"The image file could not be read: {exc.strerror}", param=param,
                       code="invalid_image_url") from exc


def _fetch(url: str, max_bytes: int, param: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:   # noqa: S310
            data = response.read(max_bytes + 1)
    except (OSError, ValueError) as exc:
        raise APIError(f"The image URL could not be fetched: {exc}", param=param,
                       code="invalid_image_url") from exc
    if len(data) > max_bytes:
        raise APIError(f"The image at the URL is over {max_bytes} bytes.", param=param,
                       code="image_too_large")
    return data


def _decode(data: bytes, max_pixels: int, param: str) -> Image.Image:
    try:
        return open_image(data, FORMATS, max_pixels).convert("RGB")
    except ImageRefused as exc:
        raise APIError(f"The image {exc}.", param=param, code=exc.code) from None


def add_image_options(parser) -> None:
    """The image policy's command-line options (the app's and the API server's)."""
    parser.add_argument("--allow-image-dir", action="append", default=[], metavar="DIR",
                        help="a folder whose image files chat requests may name by path "
                             "(repeatable; default: none)")
    parser.add_argument("--fetch-image-urls", action="store_true",
                        help="fetch http(s) image URLs in chat requests (default: refused)")
    parser.add_argument("--max-image-mb", type=float, default=None, metavar="MB",
                        help="the largest image a request may send or name (default 20)")


def policy_from_args(args) -> ImagePolicy:
    return ImagePolicy.of(args.allow_image_dir, args.fetch_image_urls, args.max_image_mb)
