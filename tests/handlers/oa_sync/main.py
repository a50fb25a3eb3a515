"""The OpenAI style's plain functions, and a token counter of its own (characters)."""


def count_tokens(text):
    return len(text)


def chat(request):
    for word in reversed(request.messages[-1]["content"].split()):
        yield word + " "


def complete(request):
    yield from (f"{request.prompt}-{index} " for index in range(20))


def embed(request):
    return [[1.0, 2.0] for _ in request.input]
