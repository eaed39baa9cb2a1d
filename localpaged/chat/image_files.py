"""Image files as the chat and the API take them, read and checked in one place: Pillow, a set
of formats, a pixel cap checked before decoding (a decompression bomb is refused, never
decoded), then the first frame decoded whole, so a truncated or damaged file is refused here
and not when a model needs it. The chat's attachments (ui/store/images.py) and the API's image
parts (api/images.py) both read through `open_image` and say whose file it was.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Collection

from PIL import Image, UnidentifiedImageError

NAMES = {"PNG": "PNG", "JPEG": "JPEG", "WEBP": "WebP", "GIF": "GIF"}


class ImageRefused(ValueError):
    """Why an image is refused, as a predicate ("is not an image ..."): the caller names the
    file or the request part before it. `code`: the API's error code for it."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code              # "unsupported_image" | "image_too_large" | "invalid_image"


def open_image(data: bytes, formats: Collection[str], max_pixels: int) -> Image.Image:
    """The image in `data` (its first frame decoded, `.format` one of `formats`: Pillow's
    names, e.g. "PNG", "WEBP"), or ImageRefused."""
    kinds = [NAMES.get(f, f) for f in formats]
    allowed = ", ".join(kinds[:-1]) + " or " + kinds[-1] if len(kinds) > 1 else kinds[0]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            if image.format not in formats:
                raise ImageRefused(f"is a {image.format or 'unknown'} image; {allowed} can be "
                                   "read", "unsupported_image")
            width, height = image.size
            if width * height > max_pixels:
                raise ImageRefused(f"is {width}x{height} pixels; an image may have at most "
                                   f"{max_pixels:,} pixels", "image_too_large")
            image.load()
    except ImageRefused:
        raise
    except UnidentifiedImageError:
        raise ImageRefused(f"is not an image Pillow can read ({allowed} can be read)",
                           "invalid_image") from None
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:
        raise ImageRefused(f"is refused as a decompression bomb: {exc}",
                           "image_too_large") from None
    except (OSError, SyntaxError, EOFError, ValueError) as exc:    # truncated or damaged
        raise ImageRefused(f"could not be read as an image (truncated or damaged: {exc})",
                           "invalid_image") from None
    return image
