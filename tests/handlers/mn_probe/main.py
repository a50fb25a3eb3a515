"""Tells which function answered, how big the body was and whether it was spooled to disk."""


def _describe(request, which):
    contents = request["contents"]
    return {
        "content_type": "application/json",
        "content": {
            "which": which,
            "size": sum(len(content.read()) for content in contents),
            "spooled": any(isinstance(getattr(c["body"], "name", None), str) for c in contents),
        },
    }


def handler(request, context):
    return _describe(request, "handler")


def other(request, context):
    return _describe(request, "other")
