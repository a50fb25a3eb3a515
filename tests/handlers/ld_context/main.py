"""Mutates the context it gets; the next call must not see the change."""


def handler(request, context):
    context.setdefault("calls", []).append("called")
    context["model"] = "mutated-by-handler"
    snapshot = {key: value for key, value in context.items()}
    return {"content_type": "application/json", "content": snapshot}
