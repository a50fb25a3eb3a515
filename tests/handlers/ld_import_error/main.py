"""Imports a package that is not installed (a missing requirements.txt entry)."""

import abeja_missing_dependency  # noqa: F401


def handler(request, context):
    return {}
