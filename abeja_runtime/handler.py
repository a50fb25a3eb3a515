"""What the loader hands the server: the user's handler, already adapted to ABEJA's signature.

A module of its own so that the loader and the style adapters (which produce it) and the
server (which calls it) all depend on it, and on nothing of each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["LoadedHandler"]


@dataclass(frozen=True)
class LoadedHandler:
    """The handler, and whether it must be awaited (decided once, at load time).

    ``func`` is always an ABEJA-style ``handler(request, context)``: handlers of other styles
    arrive here wrapped by their adapter, and ``style`` says which one.
    """

    func: Any
    is_async: bool
    name: str
    style: str = "abeja"
