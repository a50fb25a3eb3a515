"""An image model: reads an image (JPEG, PNG, ...), answers a JPEG (here, a grayscale copy).

Replace the body of ``handler`` with your model; load models and weights at import time, once.
"""

import io

from PIL import Image


def handler(request, context):
    image = Image.open(io.BytesIO(request.read()))
    result = image.convert("L")
    out = io.BytesIO()
    result.save(out, format="JPEG")
    return {"status_code": 200, "content_type": "image/jpeg", "content": out.getvalue()}
