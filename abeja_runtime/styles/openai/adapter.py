"""The OpenAI routes over the author's ``chat``, ``complete`` and ``embed`` functions.

* ``GET /v1/models``, ``GET /v1/models/{id}``: the one model served (``--served-model-name``).
* ``POST /v1/chat/completions``, ``POST /v1/completions``: the function's pieces, each choice
  of ``n`` a call of its own (one after the other); ``stop`` sequences cut the text where they
  begin, also across pieces (the function is closed there, ``finish_reason`` ``stop``);
  ``max_tokens`` closes it once that many tokens came (``length``). With ``stream: true``, each
  piece is a Server-Sent Event as it comes, ending with ``data: [DONE]``; a function that raises
  mid-stream ends it with an error event. A client that leaves closes the function's generator.
* ``POST /v1/embeddings``: the function's vectors, as floats or base64 (float32, little-endian).
* ``POST /`` (``abeja model run-local``): chat for a body with ``messages``, completion for
  ``prompt``, embeddings for ``input``.

Tokens are counted with the module's ``count_tokens(text)`` when it defines one, else as words;
a completion's tokens are its pieces when the function yields them (one token each), unless the
function reports its own counts (``request.report_usage``). The logic is written once, as
coroutines: a ``def`` module's calls run it to the end at once (nothing waits there).
"""

from __future__ import annotations

import base64
import dataclasses
import inspect
import json
import logging
import re
import struct
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from types import ModuleType
from typing import Any, Final

from abeja_runtime.config import Config
from abeja_runtime.encode import EncodedResponse
from abeja_runtime.styles import LoadedHandler
from abeja_runtime.styles._common import BodyNotJson, json_result, parse_json, read_body
from abeja_runtime.styles.openai import ENDPOINTS, OpenaiOptions, endpoint_functions
from abeja_runtime.styles.openai.protocol import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    OpenaiError,
    TokenCounter,
    Usage,
    chat_request,
    completion_requests,
    count_words,
    embedding_request,
)
from abeja_runtime.worker.invoke import finish, loop_steps, settled
from abeja_runtime.worker.request import Request

__all__ = ["adapt"]

_log = logging.getLogger("abeja_runtime")
_MODEL_PATH: Final = re.compile(r"^/v1/models/(?P<id>.+)$")
_SSE: Final = (("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache"))
_DONE: Final = b"data: [DONE]\n\n"
#: A chat choice's first delta.
_ROLE: Final = {"role": "assistant", "content": ""}
_GENERATION_PATHS: Final = {ENDPOINTS["chat"]: "chat", ENDPOINTS["complete"]: "complete"}

Generation = ChatRequest | CompletionRequest


def adapt(module: ModuleType, *, config: Config, options: OpenaiOptions) -> LoadedHandler:
    """The routes over ``module``'s functions; async when one of them is."""
    functions = endpoint_functions(module)
    count = getattr(module, "count_tokens", None)
    server = _Server(functions, options.served_model_name, count or count_words)
    if any(
        inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f) for f in functions.values()
    ):
        return LoadedHandler(server.handle, True, config.handler, style="openai")

    def handle(request: Request, context: dict[str, Any]) -> EncodedResponse:
        reply: EncodedResponse = finish(server.handle(request, context))
        if isinstance(reply.body, AsyncIterator):  # a stream: stepped on this thread too
            return EncodedResponse(reply.status, reply.headers, _stepped(reply.body))
        return reply

    return LoadedHandler(handle, False, config.handler, style="openai")


def _stepped(events: AsyncIterator[bytes]) -> Iterator[bytes]:
    """``events`` as a plain iterator: a ``def`` module's stream never waits."""
    try:
        while True:
            try:
                yield finish(events.__anext__())  # type: ignore[arg-type]
            except StopAsyncIteration:
                return
    finally:
        finish(events.aclose())  # type: ignore[attr-defined]


class _Server:
    """OpenAI's routes for one served model."""

    def __init__(self, functions: dict[str, Any], model: str, count: TokenCounter) -> None:
        self._functions = functions
        self._model = model
        self._count = count
        self._created = int(time.time())

    async def handle(self, request: Request, context: dict[str, Any]) -> EncodedResponse:
        method, path = request["http_method"], request.path
        try:
            match = _MODEL_PATH.match(path)
            if path == "/v1/models" or match:
                _only(method, "GET")
                return self._models(match["id"] if match else None)
            if path != "/" and path not in _ROUTES:
                raise OpenaiError(f"Unknown route {path}.", status=404, code="unknown_url")
            _only(method, "POST")
            body = _json_body(request)
            endpoint = self._endpoint(path, body)
            if endpoint == "embed":
                return await self._embed(embedding_request(body, self._model))
            if endpoint == "chat":
                requests: list[Generation] = [chat_request(body, self._model)]
            else:
                requests = list(completion_requests(body, self._model))
            return await self._generate(endpoint, requests)
        except OpenaiError as exc:
            return json_result(exc.document(), exc.status, headers=exc.headers)
        except Exception as exc:  # the module's own code failed (its counter, its vectors)
            return _server_error(_failure(exc))

    def _endpoint(self, path: str, body: Any) -> str:
        """The function ``path`` asks for; ``POST /`` chooses by the body's keys."""
        if path == "/":
            keys = body if isinstance(body, dict) else {}
            path = next(
                (ENDPOINTS[name] for key, name in _ROOT_KEYS if key in keys), ENDPOINTS["chat"]
            )
        endpoint = _ROUTES[path]
        if endpoint not in self._functions:
            raise OpenaiError(
                f"This model serves no {path}: its module defines no {endpoint}(request).",
                status=404,
                code="unknown_url",
            )
        return endpoint

    def _models(self, wanted: str | None) -> EncodedResponse:
        card = {
            "id": self._model,
            "object": "model",
            "created": self._created,
            "owned_by": "abeja-runtime",
        }
        if wanted is None:
            return json_result({"object": "list", "data": [card]})
        if wanted != self._model:
            raise OpenaiError(
                f"The model `{wanted}` does not exist.",
                status=404,
                param="model",
                code="model_not_found",
            )
        return json_result(card)

    async def _embed(self, request: EmbeddingRequest) -> EncodedResponse:
        vectors = await settled(self._functions["embed"](request))
        vectors = list(vectors) if vectors is not None else []
        if len(vectors) != len(request.input):
            return _server_error(
                f"embed returned {len(vectors)} vectors for {len(request.input)} inputs; "
                "it must return one vector per input"
            )
        data = [
            {"object": "embedding", "index": index, "embedding": _vector(vector, request)}
            for index, vector in enumerate(vectors)
        ]
        prompt = request.usage.prompt_tokens
        if prompt is None:
            prompt = sum(self._count(text) for text in request.input)
        return json_result(
            {
                "object": "list",
                "data": data,
                "model": self._model,
                "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
            }
        )

    async def _generate(self, endpoint: str, requests: list[Generation]) -> EncodedResponse:
        answer = _Answer(endpoint, self._model, requests, self._functions[endpoint], self._count)
        if not requests[0].stream:
            return json_result(await answer.whole())
        events = answer.events()
        try:  # the first event waits for the first piece: a failure before it is a 500
            first = await events.__anext__()
        except BaseException:
            await events.aclose()
            raise
        return EncodedResponse(200, _SSE, _prepended(first, events))


#: The POST routes, and the function each calls.
_ROUTES: Final = {route: name for name, route in ENDPOINTS.items()}
#: ``POST /``'s body keys, and the function each asks for (the first found wins).
_ROOT_KEYS: Final = (("messages", "chat"), ("prompt", "complete"), ("input", "embed"))
_WORD: Final = re.compile(r"\s*\S+")


class _Choice:
    """One choice's text as the function yields it: ``stop`` applied across pieces (the text
    that could begin a stop sequence held back until the next piece says), tokens counted up
    to ``max_tokens`` (a piece that would pass it cut to its words, with the default count)."""

    def __init__(self, request: Generation, words: bool) -> None:
        self._stops = request.stop
        self._hold = max((len(stop) for stop in self._stops), default=1) - 1
        self._max_tokens = request.max_tokens
        self._words = words
        self._held = ""
        self.tokens = 0
        #: ``max_tokens`` came: the choice ends as ``length`` if the function had more.
        self.full = False
        self.finish_reason: str | None = None

    def take(self, piece: str, tokens: int) -> str:
        """The text to send now for ``piece`` (``tokens`` long); sets :attr:`finish_reason`
        (a stop sequence) or :attr:`full` once the choice ends."""
        limit = self._max_tokens
        left = None if limit is None else limit - self.tokens
        cut_short = left is not None and tokens > left and self._words
        if cut_short and left is not None:
            piece, tokens = "".join(_WORD.findall(piece)[:left]), left
        self.tokens += tokens
        text = self._held + piece
        if self._stops:
            cut = min((i for stop in self._stops if (i := text.find(stop)) >= 0), default=-1)
            if cut >= 0:
                self._held = ""
                self.finish_reason = "stop"
                return text[:cut]
            keep = _held_back(text, self._stops, self._hold)
            self._held, text = text[len(text) - keep :], text[: len(text) - keep]
        if limit is not None and self.tokens >= limit:
            self.full = True
            if cut_short:  # the text had more than max_tokens
                self.finish_reason = "length"
            text, self._held = text + self._held, ""
        return text

    def end(self, more: bool) -> str:
        """What is still held back, once the function ended (``more``: it had more to give,
        and the choice is ``length``)."""
        text, self._held = self._held, ""
        self.finish_reason = self.finish_reason or ("length" if more else "stop")
        return text


def _held_back(text: str, stops: tuple[str, ...], longest: int) -> int:
    """How many characters at the end of ``text`` could be the start of a stop sequence."""
    for size in range(min(longest, len(text)), 0, -1):
        tail = text[-size:]
        if any(stop.startswith(tail) for stop in stops):
            return size
    return 0


class _Answer:
    """One chat or completion call: its choices run one after the other, as a whole document
    (:meth:`whole`) or as Server-Sent Events (:meth:`events`)."""

    def __init__(
        self,
        endpoint: str,
        model: str,
        requests: list[Generation],
        function: Callable[[Any], Any],
        count: TokenCounter,
    ) -> None:
        self._chat = endpoint == "chat"
        self._function = function
        self._requests = requests
        self._count = count
        self._words = count is count_words
        self._id = ("chatcmpl-" if self._chat else "cmpl-") + uuid.uuid4().hex
        self._created = int(time.time())
        self._model = model
        self._object = "chat.completion" if self._chat else "text_completion"
        self.completion_tokens = 0
        #: Prompt tokens a function reported, by prompt.
        self._reported: dict[int, int] = {}
        #: Whether an event went out: from then on, a failure is an error event.
        self._begun = False
        #: A piece's event by choice, as the bytes before and after the piece's JSON string.
        self._piece_events: dict[int, tuple[bytes, bytes]] = {}

    async def whole(self) -> dict[str, Any]:
        """The answer document: every choice's whole text."""
        choices = []
        async for index, prompt, request in self._choices():
            choice = _Choice(request, self._words)
            text = [
                request.prompt if isinstance(request, CompletionRequest) and request.echo else ""
            ]
            pieces = self._pieces(request)
            try:
                async for piece, tokens in pieces:
                    text.append(choice.take(piece, tokens))
                    if choice.finish_reason or choice.full:
                        break
                more = choice.full and await _has_more(pieces)
            finally:
                await pieces.aclose()
            text.append(choice.end(more))
            self._counted(prompt, request, choice)
            choices.append(self._whole_choice(index, "".join(text), choice.finish_reason))
        return {
            "id": self._id,
            "object": self._object,
            "created": self._created,
            "model": self._model,
            "choices": choices,
            "usage": self._usage(),
        }

    async def events(self) -> AsyncGenerator[bytes, None]:
        """The answer's events; the first comes with the first piece (what fails before it
        raises), a failure later is an error event."""
        try:
            async for index, prompt, request in self._choices():
                events = self._choice_events(index, prompt, request)
                try:
                    async for event in events:
                        self._begun = True
                        yield event
                finally:  # at once, also when the client left: it closes the function
                    await events.aclose()
            if self._requests[0].include_usage:
                yield _sse(self._frame([], usage=self._usage()))
        except Exception as exc:
            if not self._begun:
                raise
            error = OpenaiError(_failure(exc), kind="server_error").document()
            yield _sse(error)
        yield _DONE

    async def _choice_events(
        self, index: int, prompt: int, request: Generation
    ) -> AsyncGenerator[bytes, None]:
        """One choice's events: its role (chat) or echoed prompt, its text as it comes, its
        finish reason."""
        choice = _Choice(request, self._words)
        opened = False
        pieces = self._pieces(request)
        try:
            async for piece, tokens in pieces:
                text = choice.take(piece, tokens)
                event = self._piece(index, text) if text else b""
                if not opened:
                    opened = True
                    if opening := self._opening(request):  # with the first text: one write
                        event = self._event(index, opening) + event
                if event:
                    yield event
                if choice.finish_reason or choice.full:
                    break
            more = choice.full and await _has_more(pieces)
        finally:
            await pieces.aclose()
        if tail := choice.end(more):
            yield self._piece(index, tail)
        self._counted(prompt, request, choice)
        if not opened and (opening := self._opening(request)):
            yield self._event(index, opening)
        yield self._event(index, None, choice.finish_reason)

    def _opening(self, request: Generation) -> str | dict[str, str]:
        """A choice's first event: the role (chat), the prompt (``echo``), or none."""
        if self._chat:
            return _ROLE
        return request.prompt if isinstance(request, CompletionRequest) and request.echo else ""

    async def _choices(self) -> AsyncGenerator[tuple[int, int, Generation], None]:
        """Each choice: its index, its prompt's and a request of its own (its usage its own)."""
        index = 0
        for prompt, request in enumerate(self._requests):
            for _ in range(request.n):
                yield index, prompt, dataclasses.replace(request, usage=Usage())
                index += 1

    async def _pieces(self, request: Generation) -> AsyncGenerator[tuple[str, int], None]:
        """The function's text pieces for ``request``, each with its token count (a returned
        text is one piece); closed, this closes the function's generator."""
        name = "chat" if self._chat else "complete"
        count, produced = self._count, None
        try:
            produced = await settled(self._function(request))
            if isinstance(produced, str) or produced is None:
                if produced:
                    yield produced, count(produced)
                return
            each = 1 if self._words else None  # a yielded piece is a token
            if loop_steps(produced):  # each piece awaited as it comes
                async for piece in produced:
                    yield _text(piece, name), each or count(piece)
            elif hasattr(produced, "__aiter__"):  # stepped through settled: also where no loop runs
                step = produced.__aiter__().__anext__
                while True:
                    try:
                        piece = await settled(step())
                    except StopAsyncIteration:
                        return
                    yield _text(piece, name), each or count(piece)
            else:
                for piece in produced:
                    yield _text(piece, name), each or count(piece)
        finally:
            await _close(produced, name)

    def _counted(self, prompt: int, request: Generation, choice: _Choice) -> None:
        reported = request.usage.completion_tokens
        self.completion_tokens += choice.tokens if reported is None else reported
        if request.usage.prompt_tokens is not None:
            self._reported[prompt] = request.usage.prompt_tokens

    def _usage(self) -> dict[str, int]:
        prompt = sum(
            reported
            if (reported := self._reported.get(index)) is not None
            else self._count(request.prompt_text())
            for index, request in enumerate(self._requests)
        )
        return {
            "prompt_tokens": prompt,
            "completion_tokens": self.completion_tokens,
            "total_tokens": prompt + self.completion_tokens,
        }

    def _whole_choice(self, index: int, text: str, finish_reason: str | None) -> dict[str, Any]:
        if self._chat:
            message = {"role": "assistant", "content": text}
            return {"index": index, "message": message, "finish_reason": finish_reason}
        return {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}

    def _event(
        self, index: int, content: str | dict[str, str] | None, finish: str | None = None
    ) -> bytes:
        """One chunk event: a piece of ``content`` (or the role), or the choice's end."""
        choice: dict[str, Any]
        if self._chat:
            delta = (
                content
                if isinstance(content, dict)
                else ({} if content is None else {"content": content})
            )
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            text = content if isinstance(content, str) else ""
            choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish}
        usage = {"usage": None} if self._requests[0].include_usage else {}
        return _sse(self._frame([choice], **usage))

    def _piece(self, index: int, text: str) -> bytes:
        """The event of a piece of ``text``, as :meth:`_event` writes it: from its bytes around
        the text, made once a choice (nearly every event is a piece, and ``json.dumps`` of the
        whole document costs several times the text's JSON string alone)."""
        around = self._piece_events.get(index)
        if around is None:
            # (The last mark: the text comes after the model's name, which could hold one.)
            before, _, after = self._event(index, _MARK).rpartition(_MARK_JSON)
            around = self._piece_events[index] = (before, after)
        return b"".join((around[0], _json_string(text).encode(), around[1]))

    def _frame(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": self._id,
            "object": "chat.completion.chunk" if self._chat else "text_completion",
            "created": self._created,
            "model": self._model,
            "choices": choices,
            **extra,
        }


async def _close(produced: Any, name: str) -> None:
    """Close what the function gave (its generator's ``finally`` runs); a failure is logged."""
    close = getattr(produced, "aclose", None) or getattr(produced, "close", None)
    if callable(close):
        try:
            await settled(close())
        except Exception as exc:
            _log.error("closing the model's %s failed: %s", name, _failure(exc))


async def _has_more(pieces: AsyncGenerator[tuple[str, int], None]) -> bool:
    """Whether the function has a piece beyond ``max_tokens`` (then the choice is ``length``;
    a function that ended there is ``stop``)."""
    try:
        await pieces.__anext__()
    except StopAsyncIteration:
        return False
    return True


def _failure(exc: BaseException) -> str:
    """What the model's code raised, logged once, as its error message says it."""
    _log.error("the model's function failed: %s: %s", type(exc).__name__, exc)
    return f"the model failed: {type(exc).__name__}: {exc}"


def _text(piece: Any, name: str) -> str:
    if not isinstance(piece, str):
        raise TypeError(f"{name} must yield str pieces of text, got {type(piece).__name__}")
    return piece


def _sse(document: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(document, separators=(",", ":")).encode() + b"\n\n"


#: A piece's JSON string, as ``json.dumps`` writes it (``ensure_ascii``: plain ASCII bytes).
_json_string: Final[Callable[[str], str]] = json.encoder.encode_basestring_ascii
#: The text in the one piece event made to cut the others from (:meth:`_Answer._piece`).
_MARK: Final = "\x00piece\x00"
_MARK_JSON: Final = _json_string(_MARK).encode()


async def _prepended(
    first: bytes, rest: AsyncGenerator[bytes, None]
) -> AsyncGenerator[bytes, None]:
    """``first``, then ``rest``; closed, it closes ``rest`` (and so the function)."""
    try:
        yield first
        async for event in rest:
            yield event
    finally:
        await rest.aclose()


def _vector(vector: Any, request: EmbeddingRequest) -> Any:
    values = [float(value) for value in vector]
    if request.dimensions is not None:
        values = values[: request.dimensions]
    if request.encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()
    return values


def _json_body(request: Request) -> Any:
    try:
        return parse_json(read_body(request))
    except BodyNotJson as exc:
        raise OpenaiError(f"The request body is not valid JSON: {exc}.") from None


def _only(method: str, allowed: str) -> None:
    if method != allowed:
        raise OpenaiError(
            f"Method {method} is not allowed here; use {allowed}.",
            status=405,
            code="method_not_allowed",
            headers={"Allow": allowed},
        )


def _server_error(message: str) -> EncodedResponse:
    return json_result(OpenaiError(message, status=500, kind="server_error").document(), 500)
