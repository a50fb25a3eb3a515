"""The ``abeja-v1`` style: ``handler(iterable, context)`` generators of ABEJA's 18.10 images
(:mod:`.adapter` decodes the inputs and encodes what the generator yields)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any

from abeja_runtime.styles import Choice, LoadedHandler, Style, Target
from abeja_runtime.styles.abeja import checked_handler

if TYPE_CHECKING:
    from abeja_runtime.config import Config

__all__ = ["STYLE"]


class _AbejaV1(Style):
    name = "abeja-v1"

    def detect(self, target: Target) -> Choice | None:
        obj = target.obj
        generator = inspect.isgeneratorfunction(obj) or inspect.isasyncgenfunction(obj)
        if generator and _takes(obj, 2):  # (iterable, context): not OpenAI's chat(request)
            return Choice(
                self,
                f"{target.attribute} is a generator function, as the 18.10 image's handlers are",
                target,
            )
        return None

    def fit(self, target: Target) -> Target:
        return target

    def load(self, subject: Any, config: Config, options: Any, workdir: Path) -> LoadedHandler:
        from abeja_runtime.styles.abeja_v1.adapter import adapt

        return adapt(checked_handler(subject).func, config=config, workdir=workdir)


def _takes(func: Any, count: int) -> bool:
    """Whether ``func`` can be called with ``count`` positional arguments."""
    try:
        inspect.signature(func).bind(*range(count))
    except (TypeError, ValueError):
        return False
    return True


STYLE = _AbejaV1()
