"""Whose a call is and how urgent (:class:`Tenants`): its tenant, from ``--tenant-header`` (or
the caller's API key), and its priority class, from ``--priority-header``. The waiting calls are
then served by class and by weighted fairness across tenants (``waiting.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from abeja_runtime.config import Config, tenant_weights

__all__ = ["API_KEY", "NORMAL", "OTHER", "PRIORITIES", "Tenants"]

#: ``--tenant-header api-key``: the tenant is the caller's key's short hash.
API_KEY: Final = "api-key"
#: The tenant of a call that names none, and the metrics' name for tenants not weighed.
OTHER: Final = "other"
#: The priority classes, highest first (their index is the class).
PRIORITIES: Final = ("high", "normal", "low")
#: The class of a call that says none.
NORMAL: Final = PRIORITIES.index("normal")


class Tenants:
    """The rules of ``--tenant-header``, ``--tenant-weights`` and ``--priority-header``."""

    __slots__ = ("_header", "_priority", "by_key", "on", "weights")

    def __init__(self, config: Config) -> None:
        self._header = config.tenant_header.strip().lower()
        self._priority = config.priority_header.strip().lower()
        self.weights = tenant_weights(config.tenant_weights)
        #: Whether calls are told apart at all (else one queue, in arrival order).
        self.on = bool(self._header or self._priority)
        #: Whether the tenant is the caller's API key (``--tenant-header api-key``).
        self.by_key = self._header == API_KEY

    def tenant(self, headers: Mapping[str, str], caller: str | None) -> str:
        """The tenant of a call with these ``headers`` (``caller``: its key's short hash)."""
        if self.by_key:
            return caller or OTHER
        if self._header:
            return (headers.get(self._header) or "").strip()[:64] or OTHER
        return OTHER

    def priority(self, headers: Mapping[str, str]) -> int:
        """The class of a call with these ``headers``: 0 the highest; ``normal`` when it says
        none, or a value that is not a class."""
        if not self._priority:
            return NORMAL
        named = (headers.get(self._priority) or "").strip().lower()
        return PRIORITIES.index(named) if named in PRIORITIES else NORMAL

    def label(self, tenant: str) -> str:
        """The tenant as the metrics name it: a weighed one by its name, others ``other``."""
        return tenant if tenant in self.weights else OTHER
