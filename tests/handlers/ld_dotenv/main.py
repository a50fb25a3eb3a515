"""Reports which function serves and what GREETING is; ``.env`` next to it sets both."""

import os


def _answer(name):
    content = {"handler": name, "greeting": os.environ.get("GREETING")}
    return {"content_type": "application/json", "content": content}


def handler(request, context):
    return _answer("handler")


def from_dotenv(request, context):
    return _answer("from_dotenv")
