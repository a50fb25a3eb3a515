"""A handler module whose import fails, as when a requirement is missing."""

import abeja_test_missing_module  # noqa: F401


def handler(request, context):
    return {"content": "never"}
