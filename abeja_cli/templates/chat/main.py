"""A chat model served as OpenAI's API: ``/v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings`` and ``/v1/models``, for the ``openai`` client and every tool built on it.

``chat`` yields the answer's text piece by piece (each piece goes to a streaming client as it
comes); ``complete`` and ``embed`` are optional. The runtime checks the requests, applies
``stop``, ``max_tokens`` and ``n``, counts ``usage`` and writes OpenAI's answers.

The "model" here is a toy: a word chain learnt at import from ``CORPUS``. Replace it with yours:
load it at import time, once, and yield its tokens' text from ``chat``.
"""

import hashlib
import itertools
import math
import random

CORPUS = """
the runtime serves a model and the model answers the client . the client asks a question
and the model writes an answer word by word . a stream sends each word as it comes .
the model reads the messages and the runtime counts the tokens of every answer .
"""

WORDS = CORPUS.split()
FOLLOWERS = {}
for word, following in itertools.pairwise(WORDS):
    FOLLOWERS.setdefault(word, []).append(following)


def chat(request):
    """The answer to ``request.messages`` (OpenAI's messages: dicts with role and content)."""
    question = request.messages[-1].get("content") or ""
    yield from _generate(str(question), request.seed)


def complete(request):
    """The continuation of ``request.prompt``."""
    yield from _generate(request.prompt, request.seed)


def embed(request):
    """One vector per text of ``request.input``: its words hashed into 16 numbers."""
    return [_vector(text) for text in request.input]


def _generate(text, seed, limit=40):
    randomness = random.Random(seed)  # the request's seed: the same answer for the same seed
    known = [word for word in text.lower().split() if word in FOLLOWERS]
    word = known[-1] if known else "the"
    for _ in range(limit):
        word = randomness.choice(FOLLOWERS.get(word) or WORDS)
        yield word + " "
        if word == ".":
            return


def _vector(text, size=16):
    vector = [0.0] * size
    for word in text.lower().split():
        vector[hashlib.sha256(word.encode()).digest()[0] % size] += 1.0
    norm = math.sqrt(sum(value * value for value in vector)) or 1.0
    return [value / norm for value in vector]
