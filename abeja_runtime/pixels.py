"""The pixel limit of decoded images: a few KiB of PNG must not take gigabytes to decode.

A 136 KiB PNG of 12000 x 12000 pixels decodes to 432 MB of RGB (and more on the way). Pillow
checks an image's size when it opens it, before decoding: above ``MAX_IMAGE_PIXELS`` it warns
(``DecompressionBombWarning``), above twice that it raises ``DecompressionBombError``. A process
that serves handlers sets the limit to ``--max-image-pixels`` and makes the warning an error,
so that the runtime's own decoding (the v1 style), the samples and the templates, and any
handler that opens images with Pillow, stop at the limit as written; ``calls.py`` answers
either exception with ``413``.
"""

from __future__ import annotations

import importlib.util
import warnings
from typing import Final

__all__ = ["DEFAULT_MAX_IMAGE_PIXELS", "is_image_bomb", "limit_image_pixels"]

#: Pillow's own threshold for its warning (about 89 M pixels: a 9459 x 9459 image).
DEFAULT_MAX_IMAGE_PIXELS: Final = 89_478_485
_BOMBS: Final = frozenset({"DecompressionBombError", "DecompressionBombWarning"})


def limit_image_pixels(limit: int) -> None:
    """Images above ``limit`` pixels fail to open (0: Pillow checks nothing); nothing to do
    where Pillow is not installed. Pillow is imported here, when it is: about 8 ms."""
    if importlib.util.find_spec("PIL") is None:
        return
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = limit or None
    if limit:
        warnings.simplefilter("error", Image.DecompressionBombWarning)


def is_image_bomb(exc: BaseException) -> bool:
    """Whether ``exc`` is Pillow's refusal of an image above the limit (no Pillow import)."""
    kind = type(exc)
    return kind.__name__ in _BOMBS and kind.__module__ == "PIL.Image"
