"""The ``openai`` style: a module with ``chat``, ``complete`` and ``embed`` functions, served as
OpenAI's API (``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``, ``/v1/models``).

The author writes the model's side only: ``chat(request)`` and ``complete(request)`` yield text
pieces (or return the whole text), ``embed(request)`` returns one vector per input; sync or
async. The style (:mod:`.adapter`) validates requests as OpenAI does (:mod:`.protocol`), applies
``stop``, ``max_tokens`` and ``n``, counts ``usage``, and answers OpenAI's documents and
Server-Sent Events.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

from abeja_runtime.errors import HandlerLoadError
from abeja_runtime.settings import setting
from abeja_runtime.styles import Choice, LoadedHandler, Style, Target

if TYPE_CHECKING:
    from abeja_runtime.config import Config

__all__ = ["ENDPOINTS", "STYLE", "OpenaiOptions", "endpoint_functions"]

#: The functions a module may define, and the route each serves.
ENDPOINTS: Final = {
    "chat": "/v1/chat/completions",
    "complete": "/v1/completions",
    "embed": "/v1/embeddings",
}


@dataclass(frozen=True)
class OpenaiOptions:
    served_model_name: str = setting(
        "model",
        kind="text",
        envvar="ABEJA_RUNTIME_SERVED_MODEL_NAME",
        help="OpenAI style: the model's id in `/v1/models` and what requests name in `model`",
    )

    def __post_init__(self) -> None:
        if not self.served_model_name.strip():
            raise ValueError("served model name must not be empty")


def endpoint_functions(module: ModuleType) -> dict[str, Any]:
    """The functions of :data:`ENDPOINTS` that ``module`` defines itself (not imported into
    it), each taking one argument, by name."""
    return {
        name: value
        for name in ENDPOINTS
        if inspect.isfunction(value := getattr(module, name, None))
        and value.__module__ == module.__name__
        and _one_parameter(value)
    }


def _one_parameter(func: Any) -> bool:
    """Whether ``func`` takes one positional argument (an ABEJA handler takes two)."""
    try:
        inspect.signature(func).bind(None)
    except (TypeError, ValueError):
        return False
    return True


class _Openai(Style):
    name = "openai"
    options = OpenaiOptions
    module_only = True

    def detect(self, target: Target) -> Choice | None:
        if target.attribute:
            if target.attribute in ENDPOINTS and _one_parameter(target.obj):
                return Choice(
                    self,
                    f"{target.attribute}(request) is an OpenAI {ENDPOINTS[target.attribute]} "
                    "function",
                    target.module,
                )
            return None
        found = endpoint_functions(target.module)
        if not found:
            return None
        return Choice(
            self, f"{target.module.__name__} defines {', '.join(found)}(request)", target.module
        )

    def fit(self, target: Target) -> ModuleType:
        if not endpoint_functions(target.module):
            raise HandlerLoadError(
                f"HANDLER[{target.spec}] is served with the openai style, which needs a module "
                f"that defines chat(request), complete(request) or embed(request); "
                f"{target.module.__name__} defines none of them. Write one, e.g. "
                "def chat(request): yield 'Hello'"
            )
        return target.module

    def load(
        self, subject: ModuleType, config: Config, options: OpenaiOptions, workdir: Path
    ) -> LoadedHandler:
        from abeja_runtime.styles.openai.adapter import adapt

        return adapt(subject, config=config, options=options)


STYLE = _Openai()
