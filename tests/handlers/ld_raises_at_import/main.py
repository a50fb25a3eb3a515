"""Fails while importing, as a model whose weights file is missing."""

raise RuntimeError("weights file model.bin is missing")


def handler(request, context):
    return {}
