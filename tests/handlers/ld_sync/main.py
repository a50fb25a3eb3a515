"""A plain ``def`` handler."""


def handler(request, context):
    return {"content_type": "application/json", "content": {"kind": "sync"}}
