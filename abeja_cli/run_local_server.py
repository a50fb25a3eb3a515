"""``abeja model run-local-server``: serve the model on 127.0.0.1 until Ctrl+C or SIGTERM."""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import click

from abeja_cli.console import Console
from abeja_cli.engine import Engine, Server
from abeja_cli.errors import InputError, ServerError
from abeja_cli.init import README_CURL
from abeja_cli.project_request import ProjectRequest, project_request
from abeja_cli.reload import ChangeWatcher
from abeja_cli.server_log import LogSink
from abeja_cli.session import (
    STOP_SIGNALS,
    ModelCommand,
    ModelOptions,
    model_options,
    reported,
    start_server,
    terminate_as_interrupt,
)
from abeja_cli.try_page import TryPage
from abeja_runtime.launch import free_port
from abeja_runtime.media import guess_content_type

__all__ = ["run_local_server"]

#: How often the serve loop checks for a stop signal, a dead server and changed files.
_TICK: Final = 0.3


@click.command("run-local-server", cls=ModelCommand)
@model_options()
@click.option(
    "-p",
    "--port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Port on 127.0.0.1 to serve on (default: a free one).",
)
@click.option(
    "--try-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Port on 127.0.0.1 of the try-it page (default: a free one).",
)
@click.option(
    "--reload",
    is_flag=True,
    help="Reload the model when a .py file of the project changes (the version before "
    "answers until the new one is ready, and goes on if it cannot be loaded).",
)
def run_local_server(**params: Any) -> None:
    """Serve the model in the current folder on 127.0.0.1 until Ctrl+C.

    \b
    abeja model run-local-server -h main:handler -p 8080
    """
    console = Console(verbose=params["verbose"])
    reported(console, lambda: _run(params, console))


def _check_port(port: int, engine: str | None, console: Console) -> None:
    """The port is free, or held by a container that a killed run of this CLI left (removed
    now, as the next run would remove it anyway)."""
    if _port_free(port):
        return
    if engine != "local":
        from abeja_cli.docker_engine import remove_orphans_if_reachable

        remove_orphans_if_reachable(console)
        if _port_free(port):
            return
    raise InputError(f"port {port} on 127.0.0.1 is already in use; choose another with -p")


def _check_try_port(try_port: int, port: int | None) -> None:
    """The try-it page's port is free and not the model's."""
    if try_port == port:
        raise InputError(
            f"--try-port {try_port} is the model's port too (-p); give the try-it page another"
        )
    if not _port_free(try_port):
        raise InputError(
            f"port {try_port} on 127.0.0.1 is already in use; choose another for the try-it "
            "page with --try-port"
        )


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As the runtime binds: a port whose last connections are in TIME_WAIT (the previous
        # run, stopped a moment ago) is free to listen on again.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _run(params: dict[str, Any], console: Console) -> int:
    options = ModelOptions.from_params(params)
    port = params["port"]
    if port is not None:
        _check_port(port, options.engine, console)
    try_port = params["try_port"]
    if try_port is not None:
        _check_try_port(try_port, port)
    sink = LogSink(console)
    with (
        terminate_as_interrupt(),
        start_server(options, console, sink, host_port=port or free_port()) as (engine, server),
    ):
        # Watchers and signal handlers come before the banner: whoever reads it may edit a
        # file or press Ctrl+C at once.
        watchers = _Watchers(options.project) if params["reload"] else None
        request = project_request(options.project)
        page = _try_page(server.url, request, options.project, sink, try_port)
        page.start()
        try:
            with _stop_signals() as stop:
                _banner(options, engine, server, page.url)
                _serve(options, console, sink, server, stop, watchers)
        finally:
            page.stop()
        console.info("stopping the model server")
        server.stop()
    console.info("the model server was stopped and removed")
    return 0


def _try_page(
    model_url: str,
    request: ProjectRequest,
    project: Path,
    sink: LogSink,
    try_port: int | None,
) -> TryPage:
    """The try-it page, on a free port or on ``--try-port``, which was free when checked
    before the model started but may have been taken since."""
    if try_port is None:
        return TryPage(model_url, request, project=project, log=sink)
    try:
        return TryPage(model_url, request, project=project, log=sink, port=try_port)
    except OSError as exc:
        raise InputError(
            f"the try-it page cannot listen on port {try_port} of 127.0.0.1 ({exc.strerror}); "
            "choose another with --try-port"
        ) from None


def _banner(options: ModelOptions, engine: Engine, server: Server, page: str) -> None:
    lines = [
        " ----- Local Server ----- ",
        " Started successfully!",
        f" Endpoint : {server.url}",
        f" Handler :  {options.handler}",
        f" Image :    {options.image if engine.name == 'docker' else '(none: local engine)'}",
        f" Engine :   {server.description}",
        f" Try :      {_curl_example(options.project, server.url)}",
        f" Try it :   {page}  (a page to send requests and see the answers)",
        "you can now access this http api!",
        "press Ctrl + C to stop",
        " ------------------------ ",
    ]
    click.echo(click.style("\n".join(lines), fg="green", bold=True))


def _curl_example(project: Path, url: str) -> str:
    """A command that sends the project's own request to the server: the curl line of its
    README (``abeja model init`` writes one that fits the model: a multipart form, an image
    answer written to a file), else its request file, else a JSON body."""
    readme = project / "README.md"
    with contextlib.suppress(OSError, UnicodeDecodeError):
        for line in readme.read_text("utf-8").splitlines() if readme.is_file() else ():
            if line.startswith(README_CURL):
                return f"curl -s {url}{line.removeprefix(README_CURL)}"
    for candidate in sorted(project.glob("request*")):
        if candidate.is_file():
            kind = guess_content_type(candidate.name)
            # An image in, most likely an image out: to a file, not the terminal.
            output = f" -o answer{candidate.suffix}" if kind.startswith("image/") else ""
            return (
                f"curl -s {url} -H 'Content-Type: {kind}' --data-binary @{candidate.name}{output}"
            )
    return f"curl -s {url} -H 'Content-Type: application/json' -d '{{}}'"


@contextmanager
def _stop_signals() -> Iterator[threading.Event]:
    """SIGINT/SIGTERM set the returned event (a graceful stop); a second one forces it."""
    stop = threading.Event()

    def handle(signum: int, frame: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, *STOP_SIGNALS)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _Watchers:
    """What ``--reload`` watches: the code (a reload) and requirements.txt (a warning)."""

    def __init__(self, project: Path) -> None:
        self.code = ChangeWatcher(project)
        self.requirements = ChangeWatcher(project, ("requirements.txt",))


def _serve(
    options: ModelOptions,
    console: Console,
    sink: LogSink,
    server: Server,
    stop: threading.Event,
    watchers: _Watchers | None,
) -> None:
    while not stop.wait(_TICK):
        if watchers is not None:
            if watchers.requirements.changes():
                console.warning("requirements.txt changed; restart run-local-server to install it")
            changed = watchers.code.changes()
            if changed:
                names = ", ".join(str(p.relative_to(options.project)) for p in changed[:3])
                console.info(f"{names} changed; reloading the model")
                _reload(options, console, sink, server)
                continue
        code = server.exit_code()
        if code is not None:
            server.drain_logs()
            raise ServerError(
                f"the model server stopped unexpectedly (exit code {code}); its log is above",
                log=sink.text(),
            )


def _reload(options: ModelOptions, console: Console, sink: LogSink, server: Server) -> None:
    """The runtime reloads (SIGHUP): it loads the new code in a process of its own while the
    version it has serves on, then hands the workers over one by one; a version that fails to
    load leaves the old one serving. Said once the runtime says how the reload ended."""
    mark = sink.mark()
    server.reload()
    timeout = options.startup_timeout
    ended = sink.record_since(mark, _reload_ended, timeout=timeout)
    message = "" if ended is None else str(ended.get("message", ""))
    if message.startswith(_RELOADED):
        console.info(f"the model server serves the new version at {server.url}")
    elif message.startswith(_RELOAD_FAILED):
        why = message.removeprefix(_RELOAD_FAILED).partition("; the old version serves on")[0]
        console.error(
            f"the reload failed: {why.rstrip('.')}; {server.url} still answers with the version "
            "before; waiting for the next change"
        )
    elif server.exit_code() is None:
        console.warning(
            f"the new version is not ready after {timeout:g} s (--startup-timeout); the one "
            "before answers until it is"
        )


#: How the runtime's log says a reload ended (``abeja_runtime/front/reload.py``).
_RELOADED: Final = "reloaded: "
_RELOAD_FAILED: Final = "the reload failed: "


def _reload_ended(record: dict[str, Any]) -> bool:
    return str(record.get("message", "")).startswith((_RELOADED, _RELOAD_FAILED))
