"""Waiting until the model server answers its health check, bounded, failing early when its
process exits.
"""

from __future__ import annotations

from abeja_cli.engine import Server
from abeja_cli.errors import ServerError
from abeja_cli.server_log import LogSink
from abeja_runtime.launch import NotHealthy, wait_healthy

__all__ = ["wait_ready"]


def wait_ready(server: Server, *, timeout: float, sink: LogSink | None = None) -> None:
    """Poll the health check until it says 200; fail early when the server process exits.

    Raises :class:`ServerError` (with the server log) when the server exits or is not ready
    within ``timeout`` seconds. abeja-sdk's CLI polled once a second; 0.05 s keeps start-up snappy.
    """
    host, _, port = server.url.removeprefix("http://").partition(":")
    try:
        wait_healthy(host, int(port), timeout=timeout, exit_code=server.exit_code)
    except NotHealthy as exc:
        if exc.exit_code is not None:
            server.drain_logs()
            message = (
                f"the model server stopped before it was ready (exit code {exc.exit_code}); "
                "its log says why (often the handler failed to import)"
            )
        else:
            seen = (
                f"it answered {exc.last_status}"
                if exc.last_status is not None
                else ("it did not answer")
            )
            message = (
                f"the model server was not ready after {timeout:g} s ({seen} on "
                f"{server.url}/health_check); raise --startup-timeout if loading the model "
                "takes longer"
            )
        raise ServerError(message, log=sink.text() if sink else "") from None
