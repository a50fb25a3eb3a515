"""The OpenAI style's stream events, as bytes: a piece's event, made from the bytes around its
text, is exactly the whole document's ``json.dumps``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from abeja_runtime.styles.openai.adapter import _Answer
from abeja_runtime.styles.openai.protocol import chat_request, completion_requests, count_words

TEXTS = [
    "hello ",
    "",
    "naïve ☃ 😀 漢字",
    'a "quote", a \\ backslash, a / slash',
    "\x00\x01\x1f\n\r\t\b\f",
    "\u2028\u2029\x7f",
    "\ud800 a lone surrogate",
    "\x00piece\x00",  # the mark the events are cut around
]


def _answer(endpoint: str, include_usage: bool) -> _Answer:
    body: dict[str, Any] = {"model": "toy", "stream": True}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    if endpoint == "chat":
        requests = [chat_request({**body, "messages": [{"role": "user", "content": "hi"}]}, "toy")]
    else:
        requests = list(completion_requests({**body, "prompt": "hi"}, "toy"))
    return _Answer(endpoint, "toy", requests, lambda request: "", count_words)


@pytest.mark.parametrize("endpoint", ["chat", "complete"])
@pytest.mark.parametrize("include_usage", [False, True])
def test_a_piece_s_event_is_the_document_s_json(endpoint: str, include_usage: bool) -> None:
    answer = _answer(endpoint, include_usage)
    for index in (0, 2):
        for text in TEXTS:
            event = answer._piece(index, text)
            assert event == answer._event(index, text)
            assert event.startswith(b"data: ") and event.endswith(b"\n\n")
            document = json.loads(event[len(b"data: ") :])
            (choice,) = document["choices"]
            assert choice["index"] == index
            assert (choice["delta"]["content"] if endpoint == "chat" else choice["text"]) == text
            assert ("usage" in document) is include_usage
