"""A reload (SIGHUP, :class:`Reload`): a new version of the handler, from the files as they are
now, replaces the old one worker by worker, with no request refused or failed.

The new version is loaded first, by a new template (``--preload``; the old one forks the
replacements of workers that die meanwhile), or by each new worker (``--preload off``). Then each
worker that served when the reload began is retired as ``--max-requests`` retires one: its
replacement, of the new version, starts; once that one is ready the old one takes no more calls
and exits when its last is answered (the drain of a shutdown); then the next. Every request is
answered whole by the old version or by the new. A new version that cannot be loaded, or whose
new worker exits before it is ready (its warm-up failed), ends the reload: the old version serves
on, and the log and ``abeja_runtime_reloads_total{outcome="failed"}`` say so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from abeja_runtime.config import Config
from abeja_runtime.front.members import Member, ProcessState
from abeja_runtime.front.processes import FreshInterpreter, Launcher
from abeja_runtime.front.template import Template
from abeja_runtime.metrics import FrontMetrics

__all__ = ["Reload", "Rolled"]

_log = logging.getLogger("abeja_runtime")


class Rolled(Protocol):
    """What a reload changes of the pool's lifecycle."""

    members: list[Member]
    #: What starts the pool's next processes.
    launcher: Launcher
    #: The template they are forked from (``--preload``).
    template: Template | None
    metrics: FrontMetrics | None

    def retire(self, member: Member, reason: str, why: str) -> None: ...


class Reload:
    """One reload, from its signal to the last old worker's replacement, or to its failure."""

    def __init__(
        self,
        pool: Rolled,
        config: Config,
        environment: dict[str, str],
        ended: Callable[[], None],
    ) -> None:
        self._pool = pool
        self._config = config
        self._environment = environment
        #: The lifecycle forgets this reload.
        self._ended = ended
        self._old_launcher = pool.launcher
        self._old_template = pool.template
        #: The workers of the old version, replaced in this order.
        self._old = [
            member
            for member in pool.members
            if member.state is ProcessState.READY and not member.retiring
        ]
        self._count = len(self._old)
        #: The old worker whose replacement is starting.
        self._replacing: Member | None = None
        self._template: Template | None = None

    def start(self) -> None:
        _log.info(
            "reloading the handler (SIGHUP): the new version replaces the %d worker(s) one by "
            "one once it is loaded; the old one serves until then",
            self._count,
        )
        if self._old_template is None:  # --preload off: each new worker loads it
            self._loaded()
            return
        self._template = Template(self._config, self._environment, self._load_failed, self._loaded)
        self._template.start()

    def stop(self) -> None:
        """The runtime stops: the new template, if any, with it."""
        if self._template is not None:
            self._template.kill()

    # -- the sequence -------------------------------------------------------------------------

    def _loaded(self) -> None:
        if self._template is not None:
            _log.info("the new version of the handler is loaded; replacing the workers")
        self._pool.launcher = self._template or FreshInterpreter()
        self._next()

    def _next(self) -> None:
        while self._old:
            member = self._old.pop(0)
            if member not in self._pool.members or member.state is not ProcessState.READY:
                continue  # it died meanwhile: its replacement is of the new version already
            self._replacing = member
            self._pool.retire(member, "reload", "a new version of the handler replaces it")
            if member.retiring:
                return
        self._finish()

    def replaced(self, retired: Member | None) -> None:
        """A process became ready in place of ``retired``: the next old one is replaced."""
        if retired is not None and retired is self._replacing:
            self._replacing = None
            self._next()

    def failed_to_start(self, member: Member, how: str) -> bool:
        """``member`` exited before it was ready: if it was this reload's, the new version
        failed and the reload ends (``True``: it is not replaced; the old one serves on)."""
        replacing = self._replacing
        if replacing is None or member.replaces is not replacing:
            return False
        replacing.retiring = False
        self._fail(f"a worker of the new version exited before it was ready ({how})")
        return True

    def _load_failed(self, text: str, details: str) -> None:
        self._fail(f"the new version could not be loaded: {text}")

    def _fail(self, why: str) -> None:
        replaced = self._count - len(self._old) - 1
        _log.error(
            "the reload failed: %s; the old version serves on%s",
            why,
            f" (in all but the {replaced} worker(s) replaced before)" if replaced > 0 else "",
        )
        self._pool.launcher = self._old_launcher
        if self._template is not None:
            self._template.stop()
        self._end("failed")

    def _finish(self) -> None:
        if self._template is not None and self._old_template is not None:
            self._old_template.stop()
            self._pool.template = self._template
        _log.info("reloaded: every worker serves the new version of the handler")
        self._end("done")

    def _end(self, outcome: str) -> None:
        self._old.clear()
        self._replacing = None
        if self._pool.metrics is not None:
            self._pool.metrics.reloaded(outcome)
        self._ended()
