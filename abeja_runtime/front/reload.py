"""A reload (SIGHUP, :class:`Reload`): a new version of the handler, from the files as they are
now, replaces the old one worker by worker, with no request refused or failed.

The new version is loaded first, by a new template (``--preload``; the old one forks the
replacements of workers that die meanwhile), or by each new worker (``--preload off``). Then each
worker of the old version is retired in turn as ``--max-requests`` retires one: its replacement
starts, and once that one is ready the old one takes no more calls and exits when its last is
answered. A new version that cannot be loaded, or whose new worker exits before it is ready (its
warm-up failed), ends the reload: the old version serves on, and the log and
``abeja_runtime_reloads_total{outcome="failed"}`` say so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from abeja_runtime.config import Config
from abeja_runtime.front.pending import Member, ProcessState
from abeja_runtime.front.processes import FreshInterpreter, Launcher
from abeja_runtime.front.template import Template
from abeja_runtime.metrics import FrontMetrics

__all__ = ["Reload", "Rolled"]

_log = logging.getLogger("abeja_runtime")


class Rolled(Protocol):
    """What a reload changes of the pool's lifecycle (``lifecycle.py``)."""

    members: list[Member]
    launcher: Launcher
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
        self._ended = ended
        self._old_launcher = pool.launcher
        self._old_template = pool.template
        #: What starts the new version's processes, once it is loaded.
        self._launcher: Launcher | None = None
        #: The old worker whose replacement is starting.
        self._replacing: Member | None = None
        #: The new version's template (``--preload``).
        self.template: Template | None = None

    def start(self) -> None:
        workers = sum(1 for member in self._pool.members if member.state is ProcessState.READY)
        _log.info(
            "reloading the handler (SIGHUP): the new version replaces the %d worker(s) one by "
            "one once it is loaded; the old one serves until then",
            workers,
        )
        old = self._old_template
        if old is None or old.refused:  # each new worker loads it (a template would refuse)
            self._loaded()
            return
        self.template = Template(self._config, self._environment, self._load_failed, self._loaded)
        self.template.start()

    def stop(self) -> None:
        """The runtime stops: the new template, if any, with it."""
        if self.template is not None:
            self.template.kill()

    # -- the sequence -------------------------------------------------------------------------

    def _loaded(self) -> None:
        if self.template is not None:
            _log.info("the new version of the handler is loaded; replacing the workers")
        self._launcher = self._pool.launcher = self.template or FreshInterpreter()
        self._next()

    def _next(self) -> None:
        """The next worker of the old version is replaced, once none is being replaced; done
        once every worker is of the new version."""
        if self._launcher is None or self._replacing is not None:
            return
        old = [
            member
            for member in self._pool.members
            if member.launcher is not self._launcher and member.state is not ProcessState.STOPPING
        ]
        for member in old:
            if member.state is ProcessState.READY and not member.retiring:
                self._replacing = member
                self._pool.retire(member, "reload", "a new version of the handler replaces it")
                if member.retiring:
                    return
                self._replacing = None
        if not old:
            self._finish()

    def ready(self, retired: Member | None) -> None:
        """A process became ready (in place of ``retired``): the next old one is replaced."""
        if retired is not None and retired is self._replacing:
            self._replacing = None
        self._next()

    def failed_to_start(self, member: Member, how: str) -> bool:
        """``member`` exited before it was ready: if it was this reload's, the reload fails;
        ``True`` when the old one it was to replace serves on (no replacement)."""
        replacing = self._replacing
        if replacing is None or member.replaces is not replacing:
            return False
        self._replacing = None
        alive = replacing in self._pool.members
        if alive:
            replacing.retiring = ""
        self._fail(f"a worker of the new version exited before it was ready ({how})")
        return alive

    def _load_failed(self, text: str, details: str) -> None:
        self._fail(f"the new version could not be loaded: {text}")

    def _fail(self, why: str) -> None:
        replaced = sum(
            1
            for member in self._pool.members
            if self._launcher is not None
            and member.launcher is self._launcher
            and member.state is ProcessState.READY
        )
        _log.error(
            "the reload failed: %s; the old version serves on%s",
            why,
            f" (in all but the {replaced} worker(s) replaced before)" if replaced else "",
        )
        self._pool.launcher = self._old_launcher
        if self.template is not None:
            self.template.stop()
        self._end("failed")

    def _finish(self) -> None:
        if self.template is not None:
            if self._old_template is not None:
                self._old_template.stop()
            self._pool.template = self.template
        _log.info("reloaded: every worker serves the new version of the handler")
        self._end("done")

    def _end(self, outcome: str) -> None:
        self._launcher = self._replacing = None
        if self._pool.metrics is not None:
            self._pool.metrics.reloaded(outcome)
        self._ended()
