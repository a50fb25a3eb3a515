"""Describe a multipart/form-data request: its text fields and its files.

Each part is a ``Content`` with ``form_name``, ``file_name``, ``content_type`` and ``read()``;
a part without a file name is a plain form field.
"""

import hashlib
import http


def handler(request, context):
    fields = {}
    files = []
    for part in request["contents"]:
        data = part.read()
        if part["file_name"] is None:
            fields[part["form_name"]] = data.decode("utf-8")
        else:
            files.append(
                {
                    "form_name": part["form_name"],
                    "file_name": part["file_name"],
                    "content_type": part["content_type"],
                    "size": len(data),
                    "sha256": hashlib.sha256(data).hexdigest(),
                }
            )
    if not files:
        return {
            "status_code": http.HTTPStatus.BAD_REQUEST,
            "content_type": "application/json",
            "content": {"message": "send at least one file, e.g. --input document=@report.txt"},
        }
    return {
        "status_code": http.HTTPStatus.OK,
        "content_type": "application/json",
        "content": {"fields": fields, "files": files},
    }
