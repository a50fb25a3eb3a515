"""Imports Pillow only inside its first call, as a handler with a heavy optional path might:
the pixel limit must hold there too. Says whether Pillow was loaded before that call."""

import io
import sys

LOADED_AT_IMPORT = "PIL.Image" in sys.modules


def handler(request, context):
    from PIL import Image

    image = Image.open(io.BytesIO(request.read()))
    return {
        "content_type": "application/json",
        "content": {"size": list(image.size), "pillow_loaded_at_import": LOADED_AT_IMPORT},
    }
