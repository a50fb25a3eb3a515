"""The OpenAI style, called as its users call it: the official ``openai`` client, pointed at a
real runtime serving a module's ``chat``, ``complete`` and ``embed`` functions (async ones in
``oa_async``, plain ones and a token counter of their own in ``oa_sync``)."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from helpers.servers import RunningServer, ServerFactory
from helpers.waiting import wait_until

MODEL = "toy-1"
KEY = "sk-test-5be1"
ENV = {"HANDLER": "main", "ABEJA_RUNTIME_SERVED_MODEL_NAME": MODEL}
HELLO = [{"role": "user", "content": "one two three four"}]
REVERSED = "four three two one "


def client(server: RunningServer, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"http://127.0.0.1:{server.port}/v1", api_key=key, max_retries=0, timeout=30
    )


@pytest.fixture(scope="module")
def served(make_module_server: ServerFactory) -> RunningServer:
    return make_module_server("oa_async", env=ENV)


@pytest.fixture(scope="module")
def api(served: RunningServer) -> Iterator[openai.OpenAI]:
    with client(served) as opened:  # its connections closed after the module's tests
        yield opened


@pytest.fixture(scope="module")
def plain(make_module_server: ServerFactory) -> Iterator[openai.OpenAI]:
    with client(make_module_server("oa_sync", env=ENV)) as opened:
        yield opened


def streamed_text(stream: Any) -> tuple[str, list[Any]]:
    chunks = list(stream)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    return text, chunks


# The model list


def test_the_model_list_names_the_served_model(api: openai.OpenAI) -> None:
    models = api.models.list()
    assert [model.id for model in models.data] == [MODEL]
    assert models.data[0].owned_by == "abeja-runtime"


def test_a_model_is_retrieved_by_its_id(api: openai.OpenAI) -> None:
    model = api.models.retrieve(MODEL)
    assert (model.id, model.object) == (MODEL, "model")
    assert isinstance(model.created, int)


def test_an_unknown_model_id_is_not_found(api: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        api.models.retrieve("gpt-9")
    assert raised.value.code == "model_not_found"


# Chat, whole


def test_a_chat_completion_has_the_whole_text(api: openai.OpenAI) -> None:
    answer = api.chat.completions.create(model=MODEL, messages=HELLO)
    assert answer.object == "chat.completion"
    assert answer.id.startswith("chatcmpl-")
    assert answer.model == MODEL
    assert isinstance(answer.created, int)
    (choice,) = answer.choices
    assert (choice.index, choice.finish_reason) == (0, "stop")
    assert (choice.message.role, choice.message.content) == ("assistant", REVERSED)


def test_a_chat_completion_counts_its_usage(api: openai.OpenAI) -> None:
    usage = api.chat.completions.create(model=MODEL, messages=HELLO).usage
    assert usage is not None
    # Words of the prompt; one token per piece yielded.
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (4, 4, 8)


def test_usage_reported_by_the_model_wins(api: openai.OpenAI) -> None:
    answer = api.chat.completions.create(
        model=MODEL,
        messages=HELLO,
        extra_body={"usage": {"prompt_tokens": 11, "completion_tokens": 7}},
    )
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (11, 7)
    assert answer.usage.total_tokens == 18


def test_a_stop_sequence_ends_the_text_where_it_begins(api: openai.OpenAI) -> None:
    answer = api.chat.completions.create(model=MODEL, messages=HELLO, stop="two")
    assert answer.choices[0].message.content == "four three "
    assert answer.choices[0].finish_reason == "stop"


def test_the_first_of_several_stop_sequences_ends_the_text(api: openai.OpenAI) -> None:
    answer = api.chat.completions.create(
        model=MODEL, messages=HELLO, stop=["one", "three", "nothing"]
    )
    assert answer.choices[0].message.content == "four "


def test_max_tokens_ends_the_text_with_length(api: openai.OpenAI) -> None:
    answer = api.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
    assert answer.choices[0].message.content == "four three "
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage is not None and answer.usage.completion_tokens == 2


def test_a_text_that_ends_at_max_tokens_ends_with_stop(api: openai.OpenAI) -> None:
    answer = api.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4)
    assert answer.choices[0].message.content == REVERSED
    assert answer.choices[0].finish_reason == "stop"


def test_a_returned_text_is_cut_to_max_tokens(api: openai.OpenAI) -> None:
    answer = api.completions.create(model=MODEL, prompt="one two three four five", max_tokens=2)
    assert answer.choices[0].text == "five four"
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage is not None and answer.usage.completion_tokens == 2


def test_n_choices_are_each_a_call(api: openai.OpenAI) -> None:
    answer = api.chat.completions.create(model=MODEL, messages=HELLO, n=3)
    assert [choice.index for choice in answer.choices] == [0, 1, 2]
    assert {choice.message.content for choice in answer.choices} == {REVERSED}
    assert answer.usage is not None and answer.usage.completion_tokens == 12


# Chat, streamed


def test_a_streamed_chat_sends_each_piece_as_it_comes(api: openai.OpenAI) -> None:
    text, chunks = streamed_text(
        api.chat.completions.create(model=MODEL, messages=HELLO, stream=True)
    )
    assert text == REVERSED
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [chunk.choices[0].delta.content for chunk in chunks[1:-1]]
    assert pieces == ["four ", "three ", "two ", "one "]
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert {chunk.id for chunk in chunks} == {chunks[0].id}
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert all(chunk.usage is None for chunk in chunks)


def test_a_streamed_chat_ends_with_its_usage_when_asked(api: openai.OpenAI) -> None:
    _text, chunks = streamed_text(
        api.chat.completions.create(
            model=MODEL, messages=HELLO, stream=True, stream_options={"include_usage": True}
        )
    )
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (4, 4)
    assert all(chunk.usage is None for chunk in chunks[:-1])


def test_a_stop_sequence_across_pieces_is_cut_in_a_stream(api: openai.OpenAI) -> None:
    text, chunks = streamed_text(
        api.chat.completions.create(
            model=MODEL,
            messages=HELLO,
            stream=True,
            stop="cd",
            extra_body={"pieces": ["ab", "c", "de", "fg"]},
        )
    )
    assert text == "ab"
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_stream_stopped_at_max_tokens_ends_with_length(api: openai.OpenAI) -> None:
    text, chunks = streamed_text(
        api.chat.completions.create(model=MODEL, messages=HELLO, stream=True, max_tokens=3)
    )
    assert text == "four three two "
    assert chunks[-1].choices[0].finish_reason == "length"


def test_n_streamed_choices_carry_their_index(api: openai.OpenAI) -> None:
    chunks = list(api.chat.completions.create(model=MODEL, messages=HELLO, stream=True, n=2))
    texts = {0: "", 1: ""}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == {0: REVERSED, 1: REVERSED}


def test_the_stream_is_server_sent_events_ending_with_done(served: RunningServer) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    try:
        body = {"model": MODEL, "messages": HELLO, "stream": True}
        connection.request("POST", "/v1/chat/completions", json.dumps(body))
        answer = connection.getresponse()
        assert answer.status == 200
        assert answer.headers["Content-Type"] == "text/event-stream"
        events = answer.read().decode().split("\n\n")
    finally:
        connection.close()
    assert events[-2:] == ["data: [DONE]", ""]
    assert all(event.startswith("data: {") for event in events[:-2])


def test_many_streams_at_once_each_get_their_whole_text(served: RunningServer) -> None:
    async def one(api: openai.AsyncOpenAI, index: int) -> str:
        words = [f"w{index}-{n}" for n in range(10)]
        stream = await api.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": " ".join(words)}], stream=True
        )
        return "".join([chunk.choices[0].delta.content or "" async for chunk in stream])

    async def all_of_them() -> list[str]:
        api = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{served.port}/v1", api_key="x", max_retries=0
        )
        async with api:
            return await asyncio.gather(*(one(api, index) for index in range(32)))

    texts = asyncio.run(all_of_them())
    for index, text in enumerate(texts):
        assert text == "".join(f"w{index}-{n} " for n in reversed(range(10)))


# Completions


def test_a_completion_has_the_whole_text(api: openai.OpenAI) -> None:
    answer = api.completions.create(model=MODEL, prompt="alpha beta")
    assert answer.object == "text_completion"
    assert answer.id.startswith("cmpl-")
    assert answer.choices[0].text == "beta alpha "
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage is not None and answer.usage.prompt_tokens == 2


def test_a_completion_echoes_its_prompt_when_asked(api: openai.OpenAI) -> None:
    answer = api.completions.create(model=MODEL, prompt="alpha beta", echo=True)
    assert answer.choices[0].text == "alpha betabeta alpha "
    chunks = list(api.completions.create(model=MODEL, prompt="alpha beta", echo=True, stream=True))
    assert "".join(chunk.choices[0].text for chunk in chunks) == "alpha betabeta alpha "


def test_a_list_of_prompts_gets_a_choice_each(api: openai.OpenAI) -> None:
    answer = api.completions.create(model=MODEL, prompt=["a b", "c d"], n=2)
    assert [choice.text for choice in answer.choices] == ["b a ", "b a ", "d c ", "d c "]
    assert [choice.index for choice in answer.choices] == [0, 1, 2, 3]


def test_a_streamed_completion_from_plain_functions(plain: openai.OpenAI) -> None:
    chunks = list(plain.completions.create(model=MODEL, prompt="p", stream=True, max_tokens=40))
    text = "".join(chunk.choices[0].text for chunk in chunks)
    assert text.startswith("p-0 p-1 ")
    assert chunks[-1].choices[0].finish_reason == "length"  # 40 characters: the module's count


def test_a_plain_function_may_return_an_async_iterator(plain: openai.OpenAI) -> None:
    assert plain.completions.create(model=MODEL, prompt="aiter").choices[0].text == "abc"
    chunks = plain.completions.create(model=MODEL, prompt="aiter", stream=True)
    assert "".join(chunk.choices[0].text for chunk in chunks) == "abc"


def test_a_completion_stops_at_16_tokens_by_default_as_openai_does(plain: openai.OpenAI) -> None:
    answer = plain.completions.create(model=MODEL, prompt="p")
    assert answer.choices[0].finish_reason == "length"
    assert answer.choices[0].text == "p-0 p-1 p-2 p-3 "  # 4 characters each: the module's count
    assert answer.usage is not None and answer.usage.completion_tokens == 16


# Embeddings


def test_embeddings_as_floats(api: openai.OpenAI) -> None:
    answer = api.embeddings.create(model=MODEL, input=["abc", "de"], encoding_format="float")
    assert [item.embedding for item in answer.data] == [
        [3.0, 0.0, 0.5, -1.25],
        [2.0, 1.0, 0.5, -1.25],
    ]
    assert [item.index for item in answer.data] == [0, 1]
    assert answer.usage.prompt_tokens == 2


def test_embeddings_in_base64_as_the_client_asks_by_default(api: openai.OpenAI) -> None:
    raw = api.embeddings.with_raw_response.create(model=MODEL, input="abcd")
    sent = json.loads(raw.content)["data"][0]["embedding"]
    assert base64.b64decode(sent) == struct.pack("<4f", 4.0, 0.0, 0.5, -1.25)
    assert raw.parse().data[0].embedding == [4.0, 0.0, 0.5, -1.25]


def test_embeddings_cut_to_the_dimensions_asked(api: openai.OpenAI) -> None:
    answer = api.embeddings.create(model=MODEL, input="ab", dimensions=2, encoding_format="float")
    assert answer.data[0].embedding == [2.0, 0.0]


def test_embeddings_from_a_plain_function(plain: openai.OpenAI) -> None:
    answer = plain.embeddings.create(model=MODEL, input=["x", "y", "z"])
    assert [item.embedding for item in answer.data] == [[1.0, 2.0]] * 3
    assert answer.usage.prompt_tokens == 3  # the module counts characters


# Errors


def test_an_empty_chat_is_a_bad_request_naming_the_param(api: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        api.chat.completions.create(model=MODEL, messages=[])
    assert raised.value.param == "messages"
    assert raised.value.type == "invalid_request_error"


def test_a_temperature_out_of_range_is_a_bad_request(api: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        api.chat.completions.create(model=MODEL, messages=HELLO, temperature=3)
    assert raised.value.param == "temperature"
    assert "from 0 to 2" in raised.value.message


def test_stream_options_without_stream_is_a_bad_request(api: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        api.chat.completions.create(
            model=MODEL, messages=HELLO, stream_options={"include_usage": True}
        )
    assert raised.value.param == "stream_options"


def test_a_prompt_of_token_ids_is_refused_clearly(api: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        api.completions.create(model=MODEL, prompt=[[1, 2, 3]])
    assert "send the text" in raised.value.message


def test_more_than_four_stop_sequences_are_refused(api: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        api.chat.completions.create(model=MODEL, messages=HELLO, stop=list("abcde"))
    assert raised.value.param == "stop"


def test_an_unknown_model_is_not_found(api: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        api.chat.completions.create(model="gpt-9", messages=HELLO)
    assert raised.value.code == "model_not_found"
    assert "gpt-9" in raised.value.message


PART = "messages.[0].content.[0]"


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"model": 5}, "model"),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, PART),
        ({"messages": [{"role": "user", "content": ["hello"]}]}, PART),
        ({"stream": True, "stream_options": {"include_usage": "yes"}}, "include_usage"),
    ],
    ids=["model-a-number", "text-part-without-text", "part-a-string", "include-usage-a-string"],
)
def test_a_field_of_the_wrong_shape_is_a_bad_request_naming_it(
    served: RunningServer, change: dict[str, object], param: str
) -> None:
    body = json.dumps({"model": MODEL, "messages": HELLO, **change}).encode()
    answer = served.request("POST", "/v1/chat/completions", body)
    assert answer.status == 400, answer.body
    assert json.loads(answer.body)["error"]["param"] == param


def test_a_null_model_is_served_as_one_not_named(served: RunningServer) -> None:
    body = json.dumps({"model": None, "messages": HELLO}).encode()
    answer = served.request("POST", "/v1/chat/completions", body)
    assert answer.status == 200, answer.body
    assert json.loads(answer.body)["model"] == MODEL


def test_a_model_that_raises_before_answering_is_a_server_error(
    api: openai.OpenAI, served: RunningServer
) -> None:
    with pytest.raises(openai.InternalServerError) as raised:
        api.chat.completions.create(model=MODEL, messages=HELLO, extra_body={"fail": "before"})
    assert "out of memory" in raised.value.message
    with pytest.raises(openai.InternalServerError) as raised:
        api.completions.create(model=MODEL, prompt="x", extra_body={"fail": "before"})
    assert raised.value.type == "server_error"
    assert "ValueError: no prompt today" in raised.value.message
    assert served.request("GET", "/v1/models").status == 200  # served on


def test_a_stream_that_fails_before_its_first_piece_is_a_server_error(api: openai.OpenAI) -> None:
    with pytest.raises(openai.InternalServerError) as raised:
        api.chat.completions.create(
            model=MODEL, messages=HELLO, stream=True, extra_body={"fail": "before"}
        )
    assert "out of memory" in raised.value.message


def test_a_stream_that_fails_midway_ends_with_an_error_event(api: openai.OpenAI) -> None:
    stream = api.chat.completions.create(
        model=MODEL, messages=HELLO, stream=True, extra_body={"fail": "during"}
    )
    received = []
    with pytest.raises(openai.APIError) as raised:
        for chunk in stream:
            received.append(chunk.choices[0].delta.content or "")
    assert "lost its GPU" in raised.value.message
    assert "".join(received) == "four three "


def test_an_unknown_route_is_not_found(served: RunningServer) -> None:
    for method in ("GET", "POST"):
        answer = served.request(method, "/v1/nothing", b"{}" if method == "POST" else None)
        assert answer.status == 404, method
        assert json.loads(answer.body)["error"]["code"] == "unknown_url"


def test_an_embed_that_raises_is_a_server_error(api: openai.OpenAI) -> None:
    with pytest.raises(openai.InternalServerError) as raised:
        api.embeddings.create(model=MODEL, input="x", extra_body={"fail": "before"})
    assert "the embedder is broken" in raised.value.message


def test_a_wrong_route_method_is_refused_in_openai_shape(served: RunningServer) -> None:
    answer = served.request("GET", "/v1/chat/completions")
    assert answer.status == 405
    assert answer.headers["Allow"] == "POST"
    assert json.loads(answer.body)["error"]["code"] == "method_not_allowed"


@pytest.mark.parametrize(
    "body",
    [b"{not json", b"[" * 2000 + b"]" * 2000, b'{"n": ' + b"9" * 5000 + b"}"],
    ids=["broken", "nested-too-deeply", "a-5000-digit-number"],
)
def test_a_body_that_is_not_json_is_a_bad_request(served: RunningServer, body: bytes) -> None:
    """Also one that Python's parser refuses for its depth or a number's size (it was a 500
    that blamed the model)."""
    answer = served.request("POST", "/v1/chat/completions", body)
    assert answer.status == 400
    assert json.loads(answer.body)["error"]["message"].startswith(
        "The request body is not valid JSON"
    )


# A client that leaves


def test_a_client_that_leaves_closes_the_generator(api: openai.OpenAI, tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    stream = api.chat.completions.create(
        model=MODEL,
        messages=HELLO,
        stream=True,
        extra_body={"forever": True, "closed": str(closed)},
    )
    seen = []
    for chunk in stream:
        seen.append(chunk.choices[0].delta.content)
        if len(seen) == 4:
            break
    stream.close()
    wait_until(closed.exists, 30, "the generator closed after its client left")
    assert seen[1:] == ["tick0 ", "tick1 ", "tick2 "]


# Keys


@pytest.fixture(scope="module")
def keyed(make_module_server: ServerFactory) -> RunningServer:
    return make_module_server("oa_async", env={**ENV, "ABEJA_RUNTIME_API_KEYS": KEY})


def test_a_wrong_key_is_refused_and_the_right_one_served(keyed: RunningServer) -> None:
    with pytest.raises(openai.AuthenticationError) as raised, client(keyed, "sk-wrong") as wrong:
        wrong.chat.completions.create(model=MODEL, messages=HELLO)
    assert raised.value.code == "invalid_api_key"
    assert raised.value.message.endswith(
        "the API key sent is not one this model accepts; check the key"
    )
    with client(keyed, KEY) as right:
        answer = right.chat.completions.create(model=MODEL, messages=HELLO)
    assert answer.choices[0].message.content == REVERSED
    assert all(KEY not in line for line in keyed.lines)


def test_a_call_without_a_key_is_refused_in_openai_shape(keyed: RunningServer) -> None:
    answer = keyed.request("GET", "/v1/models")
    assert answer.status == 401
    error = json.loads(answer.body)["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_api_key")
    assert error["message"].startswith("this model asks for an API key")
    assert keyed.request("GET", "/health_check").status == 200
