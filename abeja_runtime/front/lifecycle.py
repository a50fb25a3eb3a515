"""The handler processes' lives (:class:`Lifecycle`): spawn, ready, retire, replace, exit, stop.

One that died is replaced (with a growing back-off while replacements die before they are
ready); one stuck in its handler is killed and replaced (the pool's watch judges); one that
reached ``--max-requests`` or ``--max-worker-memory`` is retired without failing a call: its
replacement starts first, and it stops once that one is ready and its own calls are answered.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Iterable
from typing import Final

from abeja_runtime.config import Config
from abeja_runtime.encode import word_errors_for
from abeja_runtime.errors import ServiceUnavailable
from abeja_runtime.frames import EXIT_WARMUP_FAILED, Frame, Ready
from abeja_runtime.front.interpreter import Prestarted
from abeja_runtime.front.pending import Member, ProcessState
from abeja_runtime.front.processes import (
    FrameSink,
    FreshInterpreter,
    HandlerProcess,
    Launcher,
    backoff,
    describe_exit,
    device_environment,
    reap,
    reap_orphans,
)
from abeja_runtime.front.reload import Reload
from abeja_runtime.front.scheduler import Scheduler
from abeja_runtime.front.startup import StartUp
from abeja_runtime.front.template import Template, adopt_orphans
from abeja_runtime.metrics import FrontMetrics

__all__ = ["Lifecycle", "ProcessFactory", "devices_held"]

_log = logging.getLogger("abeja_runtime")
_SPAWN_RETRY: Final = 1.0

#: Starts a handler process: the config, its environment, where its frames go.
ProcessFactory = Callable[[Config, dict[str, str], FrameSink], HandlerProcess]


class Lifecycle:
    """The pool's processes (:attr:`members`), from their start to their exit."""

    def __init__(
        self,
        config: Config,
        environment: dict[str, str],
        members: list[Member],
        scheduler: Scheduler,
        received: Callable[[Member, Frame, int | None], None],
        on_first_ready: Callable[[], None],
        on_load_failed: Callable[[str, str], None],
        process_factory: ProcessFactory | None = None,
        prestarted: Prestarted | None = None,
    ) -> None:
        """``process_factory``: the unit tests' fakes; by default, processes forked from the
        template (``--preload``) or fresh interpreters, the first one ``prestarted``."""
        self._config = config
        self._environment = environment
        self._scheduler = scheduler
        self._received = received
        self._on_first_ready = on_first_ready
        self._on_load_failed = on_load_failed
        #: What starts the next processes; the template they are forked from (--preload).
        self.launcher: Launcher = FreshInterpreter()
        self.template: Template | None = None
        self._adopting = config.preload and process_factory is None and adopt_orphans()
        if self._adopting:
            self.launcher = self.template = Template(config, environment, self._load_failed_once)
        elif config.preload and process_factory is None:
            _log.warning(
                "each worker imports the handler itself (no --preload): this system cannot "
                "make the runtime the parent of the processes forked for it"
            )
        self._prestarted = prestarted
        self._process_factory = process_factory or self._start_process
        self._reload: Reload | None = None
        #: The runtime's start, measured: the front says when its servers listen.
        self.start_up = StartUp()
        self.members = members  # the scheduler's list too
        self._ready_count = 0
        self.ever_ready = False
        self.stopping = False
        self._deaths_before_ready = 0
        self.all_gone = asyncio.Event()
        self.metrics: FrontMetrics | None = None
        #: What the first ready process said about its handler.
        self.style = ""
        self.front_paths: tuple[str, ...] = ()
        self.rpc_methods: tuple[str, ...] = ()

    def start(self) -> None:
        began, prestarted = time.monotonic(), self._prestarted
        if self.template is not None:
            self.template.start(self._launcher(self._environment, FreshInterpreter()))
        for _ in range(self._config.workers):
            self.spawn()
        if self._prestarted is not None:  # not the environment of the process it was for
            self._prestarted.discard()
            self._prestarted = prestarted = None
        self.start_up.spawning(prestarted.started_at if prestarted is not None else began)

    def _start_process(
        self, config: Config, environment: dict[str, str], sink: FrameSink
    ) -> HandlerProcess:
        return HandlerProcess(config, environment, sink, self._launcher(environment, self.launcher))

    def _launcher(self, environment: dict[str, str], otherwise: Launcher) -> Launcher:
        """The interpreter the front started already if it has ``environment`` (once), else
        ``otherwise``."""
        prestarted = self._prestarted
        if prestarted is None or environment != prestarted.environment:
            return otherwise
        self._prestarted = None
        return prestarted

    # -- readiness ----------------------------------------------------------------------------

    @property
    def serving(self) -> bool:
        """A ready process takes calls (asked for every request: a count, not a search)."""
        return self._ready_count > 0 and not self.stopping

    @property
    def admitting(self) -> bool:
        """A new call is taken: a process is ready, or the pool was ready and a replacement is
        starting (unless replacements keep dying before they are ready)."""
        return self.serving or (
            not self.stopping
            and self.ever_ready
            and backoff(self._deaths_before_ready) == 0.0
            and any(member.state is ProcessState.STARTING for member in self.members)
        )

    def _set_state(self, member: Member, state: ProcessState) -> None:
        if member.state is ProcessState.READY:
            self._ready_count -= 1
        member.state = state
        if state is ProcessState.READY:
            self._ready_count += 1

    # -- spawn, ready, retire -----------------------------------------------------------------

    def spawn(self, retiree: Member | None = None) -> None:
        """A new process unless the pool stops, now or after a retry; ``retiree``'s replacement
        if that one still serves (its first replacement died before it was ready)."""
        if self.stopping:
            return
        if retiree not in self.members:
            retiree = None
        if self._spawn(retiree) is None:
            asyncio.get_running_loop().call_later(_SPAWN_RETRY, self.spawn, retiree)

    def _spawn(self, retiree: Member | None) -> Member | None:
        held = devices_held(self.members)
        environment = device_environment(self._environment, self._config.devices, held)
        member = Member(self._received, self.exited)
        member.launcher = self.launcher
        prestarted = self._prestarted
        try:
            member.process = self._process_factory(self._config, environment, member)
            if prestarted is not None and self._prestarted is None:  # it took that interpreter
                member.started_at = prestarted.started_at
        except OSError as exc:
            _log.error("cannot start a worker process: %s", exc)
            return None
        member.replaces = retiree
        self.members.append(member)
        return member

    def ready(self, member: Member, ready: Ready) -> None:
        """``member`` loaded its handler (and warmed it up): it takes calls."""
        if member.state is not ProcessState.STARTING:
            return
        self.start_up.ready(member.started_at, ready, self.metrics)
        self._set_state(member, ProcessState.READY)
        if not self.ever_ready:  # every worker loads the same handler: the first one says
            self.style = ready.style
            word_errors_for(ready.style)
            self.front_paths = ready.front_paths
            self.rpc_methods = ready.rpc_methods
            if ready.batch is not None:  # declared by the handler (@abeja_runtime.batched)
                self._scheduler.batch_by(*ready.batch)
            self._on_first_ready()
        self.ever_ready = True
        self._deaths_before_ready = 0
        if limit := self._config.max_requests:  # a little more for some: they retire apart
            member.request_limit = limit + random.randint(0, limit // 10)
        _log.info("worker %s is ready", member.pid)
        retired, member.replaces = member.replaces, None
        if retired in self.members and retired.state is ProcessState.READY:
            self._stop(retired)
            self._count_restart(retired.retiring)  # replaced now (a reload may have failed)
        self._scheduler.dispatch()
        if self._reload is not None:
            self._reload.ready(retired)

    def answered(self, member: Member) -> None:
        member.answered += 1
        if member.answered == member.request_limit:
            self.retire(member, "max_requests", f"it has served {member.answered} requests")
        self.close_if_done(member)

    def close_if_done(self, member: Member) -> None:
        """Its socket is closed (it finishes) once it stops and has nothing left to answer."""
        if member.state is ProcessState.STOPPING and not member.sent:
            member.process.close_socket()

    def _stop(self, member: Member) -> None:
        self._set_state(member, ProcessState.STOPPING)
        self.close_if_done(member)

    def retire(self, member: Member, reason: str, why: str) -> None:
        """Replace ``member`` without failing a call (``reason``: the metric's label)."""
        if member.retiring or member.state is not ProcessState.READY or self.stopping:
            return
        member.retiring = reason  # from before the spawn: its replacement takes its device
        if self._spawn(member) is None:
            member.retiring = ""
            return
        _log.info("replacing worker %s: %s", member.pid, why)

    def _count_restart(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.worker_restarted(reason)

    def load_failed(self, member: Member, text: str, details: str) -> None:
        """``member`` could not load the handler: at the first start, the service stops (as on
        ABEJA Platform)."""
        if self.ever_ready:
            _log.error("worker %s could not load the handler: %s", member.pid, text)
        else:
            self._load_failed_once(text, details)

    def _load_failed_once(self, text: str, details: str) -> None:
        if not self.stopping:
            self.stopping = True
            self._on_load_failed(text, details)

    # -- exits --------------------------------------------------------------------------------

    def exited(self, member: Member) -> None:
        """``member`` has exited: its running calls fail, the others go back to the queue, and
        it is replaced if it should be."""
        if member not in self.members:
            return  # (the watch and its pidfd may both see it)
        # Out of the pool first: an answer read now frees a slot, and the queue's next call
        # must not go to this process, which would fail it unrun.
        self.members.remove(member)
        code = reap(member.process)
        if member.state is ProcessState.READY:
            self._ready_count -= 1
        if self.metrics is not None:
            self.metrics.worker_gone(member.pid)
        how = describe_exit(code)
        self._scheduler.fail_or_requeue(member, how)
        if self.stopping:
            if not self.members:
                self.all_gone.set()
            return
        warmup_failed = code == EXIT_WARMUP_FAILED  # it loaded the handler: replaced, back-off
        if member.state is ProcessState.STARTING and not self.ever_ready and not warmup_failed:
            self.load_failed(member, f"the worker exited ({how}) while loading the handler", "")
            return
        if self._reload is not None and self._reload.failed_to_start(member, how):
            return
        self._replace(member, "after its failed warm-up" if warmup_failed else None, how)
        if not self.admitting:  # no process will take the queued calls soon
            self._scheduler.fail_queue(
                ServiceUnavailable(
                    "service unavailable: the handler's worker processes keep exiting while "
                    "they load; the log says why"
                )
            )

    def _replace(self, member: Member, expected: str | None, how: str) -> None:
        """A replacement for a process that exited, unless it has one; ``expected``: why it
        exited, when it said so itself."""
        if member.state is ProcessState.STOPPING:
            return  # retired, recycled or killed as stuck: its replacement exists already
        if member.state is ProcessState.STARTING:
            self._deaths_before_ready += 1
        delay = backoff(self._deaths_before_ready)
        if member.retiring:
            when = "; its replacement is starting already"
        elif delay:
            when = f"; starting a replacement in {delay:g} s (replacements keep dying before "
            when += "they are ready)"
        else:
            when = "; starting a replacement"
        if expected is None:
            _log.error("worker %s exited unexpectedly (%s)%s", member.pid, how, when)
        else:
            _log.warning("worker %s exited %s%s", member.pid, expected, when)
        self._count_restart("crashed" if expected is None else "warmup_failed")
        if delay and not member.retiring:
            asyncio.get_running_loop().call_later(delay, self.spawn, member.replaces)
        elif not member.retiring:
            self.spawn(member.replaces)

    def recycle(self, member: Member, stuck: str) -> None:
        """``member``'s handler is ``stuck``: killed, and replaced."""
        _log.error("%s; this worker is killed and replaced", stuck)
        _log.warning("recycling worker %s, whose handler is stuck", member.pid)
        self._set_state(member, ProcessState.STOPPING)
        member.process.kill()
        self._count_restart("stuck")
        if not member.retiring:  # a retiree's replacement is coming
            self.spawn()

    def reap_orphans(self) -> None:
        """Reap the front's exited children that are none of its processes (orphans it
        adopted)."""
        if not self._adopting:
            return
        known = {member.pid for member in self.members}
        for template in (self.template, self._reload.template if self._reload else None):
            if template is not None:
                known.add(template.pid)
        reap_orphans(known)

    # -- reload and shutdown ------------------------------------------------------------------

    def reload(self) -> None:
        """A new version of the handler replaces the old one, worker by worker (``reload.py``)."""
        if self.stopping or not self.ever_ready:
            _log.warning("SIGHUP ignored: the runtime reloads the handler once it serves")
        elif self._reload is not None:
            _log.warning("SIGHUP ignored: a reload is under way")
        else:
            self._reload = Reload(self, self._config, self._environment, self._reloaded)
            self._reload.start()

    def _reloaded(self) -> None:
        self._reload = None

    def stop(self) -> None:
        """No new calls; each process finishes once its calls are answered."""
        self._stopping(kill=False)
        for member in self.members:
            self._stop(member)
        if not self.members:
            self.all_gone.set()

    def kill_all(self) -> None:
        """Kill every process now (a second signal, or the end)."""
        self._stopping(kill=True)
        for member in self.members:
            member.process.kill()

    def _stopping(self, *, kill: bool) -> None:
        """The pool, a reload and the template stop: no process that exits is replaced."""
        self.stopping = True
        if self._reload is not None:
            self._reload.stop()
        if self.template is not None and kill:
            self.template.kill()
        elif self.template is not None:
            self.template.stop()


def devices_held(members: Iterable[Member]) -> list[str | None]:
    """The devices of the processes that stay (not those stopping or retiring), for
    :func:`~abeja_runtime.front.processes.device_environment`."""
    return [
        member.process.device
        for member in members
        if member.state is not ProcessState.STOPPING and not member.retiring
    ]
