"""A form model: reads a multipart/form-data request (fields and files), answers JSON.

Replace the body of ``handler`` with your model; load models and weights at import time, once.
"""


def handler(request, context):
    fields, files = {}, []
    for part in request["contents"]:
        data = part.read()
        if part["file_name"] is None:
            fields[part["form_name"]] = data.decode("utf-8")
        else:
            files.append(
                {"name": part["form_name"], "file_name": part["file_name"], "size": len(data)}
            )
    return {
        "status_code": 200,
        "content_type": "application/json",
        "content": {"fields": fields, "files": files},
    }
