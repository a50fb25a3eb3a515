"""OpenAI's request bodies, checked as its API checks them, and its error objects.

A request that breaks a rule is an :class:`OpenaiError` with the ``param`` at fault, which the
adapter answers as OpenAI does: ``{"error": {"message", "type", "param", "code"}}``. What the
author's function receives is a :class:`ChatRequest`, :class:`CompletionRequest` or
:class:`EmbeddingRequest`: the fields a model needs, typed, and the whole ``body`` for the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = [
    "ChatRequest",
    "CompletionRequest",
    "EmbeddingRequest",
    "OpenaiError",
    "TokenCounter",
    "Usage",
    "chat_request",
    "completion_requests",
    "count_words",
    "embedding_request",
]

_ROLES: Final = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_MAX_STOP: Final = 4
_MAX_N: Final = 128
#: OpenAI's default ``max_tokens`` for the legacy completions endpoint.
_COMPLETION_MAX_TOKENS: Final = 16


class OpenaiError(Exception):
    """An error answered as OpenAI's error object."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.headers = headers
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.kind = kind

    def document(self) -> dict[str, Any]:
        """``{"error": {...}}``, as OpenAI's API answers it."""
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


@dataclass
class Usage:
    """Tokens a call counted; the author sets them with ``request.report_usage``."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None


@dataclass
class _Generation:
    """What the chat and completion requests share."""

    model: str
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    n: int
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    seed: int | None
    user: str | None
    body: dict[str, Any]
    usage: Usage = field(default_factory=Usage, repr=False)

    def report_usage(
        self, *, prompt_tokens: int | None = None, completion_tokens: int | None = None
    ) -> None:
        """The call's token counts as the model counted them (else the runtime counts)."""
        if prompt_tokens is not None:
            self.usage.prompt_tokens = prompt_tokens
        if completion_tokens is not None:
            self.usage.completion_tokens = completion_tokens


@dataclass
class ChatRequest(_Generation):
    """``POST /v1/chat/completions``: ``messages`` as sent (dicts with ``role``, ``content``)."""

    messages: list[dict[str, Any]] = field(default_factory=list)

    def prompt_text(self) -> str:
        """The text of every message, for counting its tokens."""
        return "\n".join(_content_text(message.get("content")) for message in self.messages)


@dataclass
class CompletionRequest(_Generation):
    """``POST /v1/completions``: one ``prompt`` (a list of prompts is one call each)."""

    prompt: str = ""
    echo: bool = False

    def prompt_text(self) -> str:
        return self.prompt


@dataclass
class EmbeddingRequest:
    """``POST /v1/embeddings``: ``input`` is always a list of texts; ``embed`` returns one
    vector each."""

    model: str
    input: list[str]
    dimensions: int | None
    encoding_format: str
    user: str | None
    body: dict[str, Any]
    usage: Usage = field(default_factory=Usage, repr=False)

    def report_usage(self, *, prompt_tokens: int | None = None) -> None:
        """The input's token count as the model counted it (else the runtime counts)."""
        if prompt_tokens is not None:
            self.usage.prompt_tokens = prompt_tokens


def chat_request(body: Any, model: str) -> ChatRequest:
    """The chat request ``body`` asks for, or the :class:`OpenaiError` of its first fault."""
    fields = _generation(body, model, default_max_tokens=None)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise OpenaiError("'messages' must be a non-empty array of messages.", param="messages")
    for index, message in enumerate(messages):
        param = f"messages.[{index}]"
        if not isinstance(message, dict):
            raise OpenaiError(f"'{param}' must be an object.", param=param)
        if message.get("role") not in _ROLES:
            raise OpenaiError(
                f"'{param}.role' must be one of {', '.join(sorted(_ROLES))}; got "
                f"{message.get('role')!r}.",
                param=f"{param}.role",
            )
        content = message.get("content")
        if not (content is None or isinstance(content, (str, list))):
            raise OpenaiError(
                f"'{param}.content' must be a string or an array of content parts.",
                param=f"{param}.content",
            )
        for at, part in enumerate(content if isinstance(content, list) else ()):
            if not isinstance(part, dict) or (
                part.get("type") == "text" and not isinstance(part.get("text"), str)
            ):
                raise OpenaiError(
                    f"'{param}.content.[{at}]' must be a content part: an object, a text "
                    "part with its 'text' a string.",
                    param=f"{param}.content.[{at}]",
                )
    return ChatRequest(**fields, messages=messages)


def completion_requests(body: Any, model: str) -> list[CompletionRequest]:
    """One request per prompt of ``body`` (a string or an array of strings)."""
    fields = _generation(body, model, default_max_tokens=_COMPLETION_MAX_TOKENS)
    echo = _typed(body, "echo", bool, False)
    prompts = _texts(body, "prompt")
    return [CompletionRequest(**fields, prompt=text, echo=echo) for text in prompts]


def embedding_request(body: Any, model: str) -> EmbeddingRequest:
    """The embedding request ``body`` asks for, or the :class:`OpenaiError` of its first fault."""
    _object_with_model(body, model)
    texts = _texts(body, "input")
    encoding = _typed(body, "encoding_format", str, "float")
    if encoding not in ("float", "base64"):
        raise OpenaiError(
            f"'encoding_format' must be 'float' or 'base64'; got {encoding!r}.",
            param="encoding_format",
        )
    dimensions = _typed(body, "dimensions", int, None)
    if dimensions is not None and dimensions < 1:
        raise OpenaiError("'dimensions' must be at least 1.", param="dimensions")
    return EmbeddingRequest(
        model=model,
        input=texts,
        dimensions=dimensions,
        encoding_format=encoding,
        user=_typed(body, "user", str, None),
        body=body,
    )


def _texts(body: dict[str, Any], name: str) -> list[str]:
    """``body[name]``, a string or a non-empty array of them, as a list (token ids refused)."""
    given = body.get(name)
    texts = [given] if isinstance(given, str) else given
    if not isinstance(texts, list) or not texts:
        raise OpenaiError(f"'{name}' must be a string or a non-empty array of strings.", param=name)
    if not all(isinstance(text, str) for text in texts):
        raise OpenaiError(
            f"'{name}' as token ids is not supported by this model; send the text.", param=name
        )
    return texts


def _object_with_model(body: Any, model: str) -> None:
    if not isinstance(body, dict):
        raise OpenaiError("The request body must be a JSON object.")
    named = _typed(body, "model", str, model)  # (null: not named)
    if named != model:
        raise OpenaiError(
            f"The model `{named}` does not exist; this server serves `{model}`.",
            status=404,
            param="model",
            code="model_not_found",
        )


def _generation(body: Any, model: str, *, default_max_tokens: int | None) -> dict[str, Any]:
    """The checked fields chat and completion requests share."""
    _object_with_model(body, model)
    max_tokens = _typed(body, "max_completion_tokens", int, None)
    if max_tokens is None:
        max_tokens = _typed(body, "max_tokens", int, default_max_tokens)
    _at_least(max_tokens, 1, "max_tokens")
    temperature = _number(body, "temperature", 0, 2)
    top_p = _number(body, "top_p", 0, 1)
    n = _typed(body, "n", int, 1)
    _at_least(n, 1, "n")
    if n > _MAX_N:
        raise OpenaiError(f"'n' must be at most {_MAX_N}; got {n}.", param="n")
    stream = _typed(body, "stream", bool, False)
    options = body.get("stream_options")
    if options is not None and not stream:
        raise OpenaiError(
            "'stream_options' is only allowed when 'stream' is true.", param="stream_options"
        )
    if options is not None and not isinstance(options, dict):
        raise OpenaiError("'stream_options' must be an object.", param="stream_options")
    include_usage = _typed(options, "include_usage", bool, False) if options else False
    return {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "n": n,
        "stop": _stop(body.get("stop")),
        "stream": stream,
        "include_usage": include_usage,
        "seed": _typed(body, "seed", int, None),
        "user": _typed(body, "user", str, None),
        "body": body,
    }


def _stop(value: Any) -> tuple[str, ...]:
    stops = [value] if isinstance(value, str) else ([] if value is None else value)
    if not isinstance(stops, list) or not all(isinstance(stop, str) and stop for stop in stops):
        raise OpenaiError("'stop' must be a non-empty string or an array of them.", param="stop")
    if len(stops) > _MAX_STOP:
        raise OpenaiError(f"'stop' takes at most {_MAX_STOP} sequences.", param="stop")
    return tuple(stops)


def _typed(body: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    """``body[name]`` if it is a ``kind`` (null: ``default``), else the error for it."""
    value = body.get(name)
    if value is None:
        return default
    if kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise OpenaiError(f"'{name}' must be {_KIND_NAMES[kind]}; got {value!r}.", param=name)
    return value


def _number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise OpenaiError(
            f"'{name}' must be a number from {low} to {high}; got {value!r}.", param=name
        )
    return float(value)


def _at_least(value: int | None, low: int, name: str) -> None:
    if value is not None and value < low:
        raise OpenaiError(f"'{name}' must be at least {low}; got {value}.", param=name)


_KIND_NAMES: Final[dict[type, str]] = {
    int: "an integer",
    bool: "a boolean",
    str: "a string",
}


def _content_text(content: Any) -> str:
    """A message's text: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


#: Counts tokens in a text: the module's ``count_tokens``, else words (whitespace-separated).
TokenCounter = Callable[[str], int]


def count_words(text: str) -> int:
    """The default token count of a text: its whitespace-separated words."""
    return len(text.split())
