"""``--style auto`` between the OpenAI style and the others: a module of another platform that
happens to define a ``chat`` or ``embed`` helper keeps its style; OpenAI's functions are found
only where the module defines them itself, each taking one request."""

from __future__ import annotations

import textwrap
from types import ModuleType

from abeja_runtime.styles import Target, choose


def module(source: str, name: str = "main") -> ModuleType:
    made = ModuleType(name)
    exec(textwrap.dedent(source), vars(made))
    return made


def style_of(made: ModuleType, attribute: str = "") -> str:
    spec = f"{made.__name__}:{attribute}" if attribute else made.__name__
    return choose(Target(spec, made, attribute), "auto").style.name


def test_a_seldon_class_beside_an_embed_helper_stays_seldon() -> None:
    seldon = module(
        """
        def embed(text, size=4):
            return [0.0] * size

        class MyModel:
            def predict(self, X, features_names=None):
                return X
        """,
        "MyModel",
    )
    assert style_of(seldon) == "seldon"


def test_a_module_of_openai_functions_is_the_openai_style() -> None:
    chat = module(
        """
        async def chat(request):
            yield "hello"

        def embed(request):
            return [[0.0]]
        """
    )
    assert style_of(chat) == "openai"
    assert style_of(chat, "chat") == "openai"  # what `abeja model` commands name


def test_an_abeja_v1_generator_of_two_arguments_stays_abeja_v1() -> None:
    v1 = module(
        """
        def chat(_iter, context):
            for item in _iter:
                yield item
        """
    )
    assert style_of(v1, "chat") == "abeja-v1"


def test_functions_imported_into_a_module_are_not_its_own() -> None:
    imported = module("from json import dumps as chat\n\ndef handler(request, context): ...\n")
    assert style_of(imported, "handler") == "abeja"
