"""A callable object as the handler, e.g. a model class with ``__call__``."""


class Model:
    def __init__(self):
        self.kind = "callable"

    def __call__(self, request, context):
        return {"content_type": "application/json", "content": {"kind": self.kind}}


handler = Model()
