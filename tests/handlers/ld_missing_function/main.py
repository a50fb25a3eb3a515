"""Defines functions, but none named ``handler``."""

from json import dumps


class Model:
    pass


def handler_v2(request, context):
    return {"content": dumps({"ok": True})}


def preprocess(data):
    return data


def _private_helper():
    return None
