"""Return the posted image mirrored left to right, as JPEG (the ABEJA docs' image example).

The docs used OpenCV for the flip; Pillow alone does it, so requirements.txt needs only Pillow.
"""

import http
from io import BytesIO

from PIL import Image


def handler(request, context):
    image = Image.open(BytesIO(request.read()))
    flipped = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    out = BytesIO()
    flipped.convert("RGB").save(out, format="JPEG", quality=95)
    out.seek(0)
    return {
        "status_code": http.HTTPStatus.OK,
        "content_type": "image/jpeg",
        "content": out,
    }
