"""A handler whose behaviour the query chooses, for error-path tests."""

import os


def handler(request, context):
    mode = request.query.get("mode", "ok")
    spooled = any(hasattr(content["body"], "name") for content in request["contents"])
    size = sum(len(content.read()) for content in request["contents"])
    if mode == "raise":
        raise RuntimeError("boom")
    if mode == "bad_status":
        return {"status_code": 1000}
    if mode == "status":
        return {"status_code": int(request.query["code"])}
    if mode == "not_dict":
        return "just a string"
    if mode == "stream":
        return {"content": (f"line {index}\n".encode() for index in range(3))}
    if mode == "stream_fails":

        def chunks():
            yield b"first"
            raise ValueError("broken stream")

        return {"content": chunks()}
    if mode == "stream_dies":

        def last_words():
            yield b"first"
            os._exit(3)  # the worker dies after its first chunk

        return {"content": last_words()}
    content = {"size": size, "spooled": spooled, "pid": os.getpid()}
    return {"content_type": "application/json", "content": content}
