"""Describes the request it receives, so that tests can check what a handler sees."""

import base64
import json


def handler(request, context):
    contents = [
        {
            "content_type": content["content_type"],
            "file_name": content["file_name"],
            "form_name": content["form_name"],
            "metadata": content["metadata"],
            "body": base64.b64encode(content.read()).decode(),
            "spooled_to_disk": hasattr(content["body"], "name"),
        }
        for content in request["contents"]
    ]
    return {
        "content_type": "application/json",
        "content": {
            "keys": list(request.keys()),
            "len": len(request),
            "metadata_in": "metadata" in request,
            "http_method_in": "http_method" in request,
            "http_method": request["http_method"],
            "content_type": request["content_type"],
            "headers": request["headers"],
            "http_headers": [list(pair) for pair in request["http_headers"]],
            "accept_encoding": request["http_headers"]["Accept-Encoding"],
            "missing_header": request["http_headers"]["x-not-sent"],
            "contents": contents,
            "path": request.path,
            "request_id": request.request_id,
            "query": {key: request.query.getall(key) for key in request.query},
            "query_string": request.query_string,
        },
    }


def read_json(request, context):
    """The docs' way: json.load(request)."""
    return {"content_type": "application/json", "content": json.load(request)}


def read_chunks(request, context):
    """Reads the body in small chunks, as a handler for large uploads would."""
    total = 0
    while chunk := request.read(65536):
        total += len(chunk)
    return {"content_type": "application/json", "content": {"size": total}}


def lazy_body(request, context):
    """Returns the request's own file object: encoding must happen before bodies are closed."""
    return {"content_type": "application/octet-stream", "content": request["contents"][0]["body"]}
