"""Like ``tensorflow_model.py`` doing ``import tensorflow``: the missing package's name is a
prefix of this module's name."""

import abeja_missing_dependency  # noqa: F401


def handler(request, context):
    return {}
