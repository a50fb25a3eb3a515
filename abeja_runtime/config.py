"""The runtime's settings: one frozen, picklable ``Config`` built once and passed down.

The core's settings are declared here, once each (:mod:`abeja_runtime.settings`): name,
variable, default and help; each style declares its own in its options dataclass
(:mod:`abeja_runtime.styles`), carried in ``Config.style_options``. ``main.py`` maps flags and
environment variables onto them; worker processes receive the same object. Nothing below the
command line reads ``os.environ`` for settings.
"""

from __future__ import annotations

import importlib.util
import json
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from abeja_runtime.errors import handler_format_message
from abeja_runtime.pixels import DEFAULT_MAX_IMAGE_PIXELS
from abeja_runtime.settings import setting
from abeja_runtime.styles import Style, registered, style_named, style_names

__all__ = [
    "LOG_FORMATS",
    "LOG_LEVELS",
    "LOOPS",
    "Config",
    "PlatformIds",
    "module_alone_allowed",
    "parse_bool",
    "parse_context",
    "resolve_training_result_dir",
]

#: The event loops a worker can run on (``--loop``).
LOOPS: Final = ("auto", "asyncio", "uvloop")
MiB: Final = 1024 * 1024
LOG_LEVELS: Final = ("debug", "info", "warning", "error", "critical")
#: How log records are written (``--log-format``); ``auto`` is resolved by each process against
#: the stream its records go to (:func:`abeja_runtime.logs.configure_logging`).
LOG_FORMATS: Final = ("auto", "json", "text")


def module_alone_allowed(style: str) -> bool:
    """Whether HANDLER may name a module alone with ``style`` (``auto``: if a style takes it)."""
    if style == "auto":
        return any(candidate.module_only for candidate in registered())
    return style_named(style).module_only


@dataclass(frozen=True)
class PlatformIds:
    """Identifiers that ABEJA Platform puts in the environment.

    They become response headers (contract A3 / Part B 5.2) and log fields (Part B 6.1).
    """

    organization_id: str = ""
    model_id: str = ""
    model_version: str = ""
    deployment_id: str = ""
    service_id: str = ""
    #: Where the results of async requests go (ABEJA_API_URL); no default, so that a runtime
    #: outside the platform never sends them to the public API.
    api_url: str = ""

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> PlatformIds:
        return cls(
            organization_id=environ.get("ABEJA_ORGANIZATION_ID", ""),
            model_id=environ.get("ABEJA_MODEL_ID", ""),
            model_version=environ.get("ABEJA_MODEL_VERSION", ""),
            deployment_id=environ.get("ABEJA_DEPLOYMENT_ID", ""),
            service_id=environ.get("ABEJA_SERVICE_ID", ""),
            api_url=environ.get("ABEJA_API_URL", ""),
        )

    def response_headers(self) -> tuple[tuple[str, str], ...]:
        """The ``X-Abeja-*`` headers of every handler response, for the variables that are set."""
        pairs = (
            ("X-Abeja-Model-Id", self.model_id),
            # Path-escaped as ABEJA Platform does: "1.0 β/x" → "1.0%20%CE%B2%2Fx".
            ("X-Abeja-Model-Version", urllib.parse.quote(self.model_version, safe="")),
            ("X-Abeja-Deployment-Id", self.deployment_id),
            ("X-Abeja-Service-Id", self.service_id),
        )
        return tuple((name, value) for name, value in pairs if value)

    def log_fields(self) -> dict[str, str]:
        fields = {
            "organization_id": self.organization_id,
            "deployment_id": self.deployment_id,
            "service_id": self.service_id,
        }
        return {key: value for key, value in fields.items() if value}


@dataclass(frozen=True)
class Config:
    """Every setting of one runtime instance: the core's, declared here, and each style's, in
    ``style_options``. The README's table of options is generated from these declarations."""

    handler: str = setting(
        "main:handler",
        kind="text",
        envvar="HANDLER",
        help="the handler, as `module:function`",
    )
    host: str = setting(
        "0.0.0.0",
        kind="text",
        envvar="ABEJA_RUNTIME_HOST",
        server_only=True,
        help="interface to listen on (`0.0.0.0`: all; `127.0.0.1`: this machine only)",
    )
    port: int = setting(
        5000,
        kind="port",
        envvar="PORT",
        server_only=True,
        help="service port: the handler on any path, and `/health_check`",
    )
    healthcheck_port: int = setting(
        5001,
        kind="port",
        envvar="HEALTHCHECK_PORT",
        server_only=True,
        help="port that serves only `/health_check` (and `/livez`, `/metrics`)",
    )
    workers: int = setting(
        1,
        kind="positive",
        envvar="ABEJA_RUNTIME_WORKERS",
        server_only=True,
        help="worker processes, each with its own copy of the handler",
    )
    #: 1 keeps ABEJA's guarantee that non-thread-safe ML frameworks and module globals rely on.
    concurrency: int = setting(
        1,
        kind="positive",
        envvar="ABEJA_RUNTIME_CONCURRENCY",
        help="handler calls running at once per worker (1 = ABEJA's one-at-a-time); raise it "
        "only for thread-safe handlers",
    )
    max_queue: int = setting(
        100,
        kind="count",
        envvar="ABEJA_RUNTIME_MAX_QUEUE",
        help="requests waiting for a handler slot per worker; beyond: `503 service busy` with "
        "`Retry-After`",
    )
    timeout: float = setting(
        60.0,
        kind="seconds",
        envvar="ABEJA_RUNTIME_TIMEOUT",
        help="seconds from the request's arrival (queue wait included) until the handler must "
        "answer, else `504`; `0`: no limit",
    )
    stream_idle_timeout: float = setting(
        60.0,
        kind="seconds",
        envvar="ABEJA_RUNTIME_STREAM_IDLE_TIMEOUT",
        server_only=True,
        help="seconds a streamed answer may go without a chunk once it has begun (`--timeout` "
        "bounds its first); then it is cut short and its generator closed; `0`: no limit",
    )
    #: ABEJA Platform had no limit at all; 100 MiB admits large images and small videos while
    #: still stopping a runaway client before it fills the disk.
    max_body_size: int = setting(
        100 * MiB,
        kind="bytes",
        envvar="ABEJA_RUNTIME_MAX_BODY_SIZE",
        help="largest request body, else `413`; `0`: no limit",
    )
    #: Most inference payloads (JSON, a photo) stay in memory.
    spool_threshold: int = setting(
        1 * MiB,
        kind="bytes",
        envvar="ABEJA_RUNTIME_SPOOL_THRESHOLD",
        help="bodies and parts above this go to a per-request temp dir",
    )
    #: A hundred thousand empty parts took 3.5 s to parse and were all handed over; real forms
    #: have a few. Starlette and Werkzeug stop at 1,000 too.
    max_parts: int = setting(
        1000,
        kind="count",
        envvar="ABEJA_RUNTIME_MAX_PARTS",
        help="most parts of a multipart/form-data body, else `413`; `0`: no limit",
    )
    max_requests: int = setting(
        0,
        kind="count",
        envvar="ABEJA_RUNTIME_MAX_REQUESTS",
        help="requests a worker serves before a fresh one replaces it (plus up to 10 %, so "
        "that workers retire apart); the old one finishes what it has: no request fails; "
        "`0`: never",
    )
    max_worker_memory: int = setting(
        0,
        kind="bytes",
        envvar="ABEJA_RUNTIME_MAX_WORKER_MEMORY",
        help="resident memory above which a worker is replaced the same way (a leaking "
        "handler, before the OOM killer); `0`: no limit",
    )
    max_image_pixels: int = setting(
        DEFAULT_MAX_IMAGE_PIXELS,
        kind="count",
        envvar="ABEJA_RUNTIME_MAX_IMAGE_PIXELS",
        help="most pixels of an image a handler opens with Pillow (decompression bombs), else "
        "`413` before decoding; `0`: no limit",
    )
    grace_period: float = setting(
        30.0,
        kind="seconds",
        envvar="ABEJA_RUNTIME_GRACE_PERIOD",
        server_only=True,
        help="seconds in-flight requests get at shutdown; a handler still running "
        "`timeout + grace` seconds after it started gets its worker recycled",
    )
    keepalive_timeout: float = setting(
        75.0,
        kind="positive_seconds",
        envvar="ABEJA_RUNTIME_KEEPALIVE_TIMEOUT",
        server_only=True,
        help="seconds an idle keep-alive connection stays open (longer than the 60 s idle "
        "timeout of common load balancers, so that they close idle connections, not the "
        "runtime)",
    )
    request_head_timeout: float = setting(
        10.0,
        kind="positive_seconds",
        envvar="ABEJA_RUNTIME_REQUEST_HEAD_TIMEOUT",
        server_only=True,
        help="seconds from a request's first byte (or from the connection, for the first "
        "request) until its whole request line and headers must have arrived, and the "
        "longest a body may make no progress; then `408` JSON and the connection is closed "
        "(slowloris)",
    )
    log_level: str = setting(
        "info",
        kind="log_level",
        envvar="LOG_LEVEL",
        choices=LOG_LEVELS,
        help="the lowest level of log records written: `debug`, `info`, `warning`, `error`, "
        "`critical` (logrus names accepted)",
    )
    log_format: str = setting(
        "auto",
        kind="choice",
        envvar="ABEJA_RUNTIME_LOG_FORMAT",
        choices=LOG_FORMATS,
        help="how log records are written: `json` (one JSON object per line, ABEJA's fields), "
        "`text` (one readable line per record, tracebacks on the lines after it), or `auto` "
        "(text when the log goes to a terminal, JSON otherwise)",
    )
    loop: str = setting(
        "auto",
        kind="choice",
        envvar="ABEJA_RUNTIME_LOOP",
        choices=LOOPS,
        server_only=True,
        help="the event loop of the front and of async workers: `asyncio`, `uvloop`, or `auto` "
        "(uvloop when installed: `pip install 'abeja-runtime[fast]'`; about 13 % more small "
        "requests per second)",
    )
    user_model_root: str = setting(
        "",
        kind="text",
        envvar="ABEJA_USER_MODEL_ROOT",
        default_text="current dir",
        help="directory of the handler's code, relative to the current one",
    )
    #: As given; resolved against the working directory at start.
    training_result_dir: str = setting(
        "",
        kind="text",
        envvar="ABEJA_TRAINING_RESULT_DIR",
        default_text="`abejainc_training_result`",
        help="made absolute (relative to the code directory) and exported to the handler",
    )
    #: Every call gets its own deep copy.
    context: Mapping[str, Any] = setting(
        kind="json_object",
        envvar="CONTEXT",
        default_factory=dict,
        help="JSON object passed as `context`; each call gets its own copy",
    )
    cancel_raises: bool = setting(
        False,
        kind="switch",
        envvar="ABEJA_RUNTIME_CANCEL_RAISES",
        server_only=True,
        help="for `def` handlers: raise `abeja_runtime.CallCancelled` in the handler when "
        "nobody waits for its answer any more (its client left, its deadline passed), as Cog "
        "does; without it a handler looks at `request.cancelled` itself",
    )
    install_requirements: bool = setting(
        False,
        kind="switch",
        envvar="ABEJA_RUNTIME_INSTALL_REQUIREMENTS",
        help="install `requirements.txt` / `Pipfile` at start-up, as ABEJA Platform does",
    )
    #: ``auto`` detects it at load time and logs the choice.
    style: str = setting(
        "auto",
        kind="choice",
        envvar="ABEJA_RUNTIME_STYLE",
        choices=style_names(),
        help="the handler's style: "
        + ", ".join(f"`{style.name}` ({style.summary})" for style in registered())
        + "; `auto` detects it from what HANDLER names",
    )
    #: Served by the front with the style's services; every worker binds it.
    grpc_port: int | None = setting(
        None,
        kind="optional_port",
        envvar="ABEJA_RUNTIME_GRPC_PORT",
        server_only=True,
        default_text="off",
        help="KServe and Seldon styles: serve their gRPC protocol on this port too, as "
        "KServe's `--grpc_port` (Open Inference V2; KServe uses 8081) and seldon-core's "
        "`--grpc-port` (5000 in its images) do",
    )
    platform: PlatformIds = field(default_factory=PlatformIds)
    #: Each style's options object, by the style's name; a style missing here has its defaults.
    style_options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def event_loop(self) -> str:
        """The loop the workers run: ``auto`` resolved."""
        if self.loop != "auto":
            return self.loop
        return "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"

    def options_of(self, style: Style) -> Any:
        """``style``'s options: as set, else its defaults; None for a style without any."""
        options = self.style_options.get(style.name)
        if options is None and style.options is not None:
            options = style.options()
        return options

    def __post_init__(self) -> None:
        problems = list(self._problems())
        if problems:
            raise ValueError("; ".join(problems))

    def _problems(self) -> list[str]:
        problems = []
        if self.style not in style_names():
            problems.append(f"style must be one of {', '.join(style_names())}, got {self.style!r}")
        colons = self.handler.count(":")
        if colons != 1 and not (colons == 0 and module_alone_allowed(self.style)):
            problems.append(handler_format_message(self.handler))
        for name in ("port", "healthcheck_port"):
            value = getattr(self, name)
            if not 0 <= value <= 65535:
                problems.append(f"{name} must be from 0 to 65535, got {value}")
        if self.port == self.healthcheck_port and self.port != 0:
            problems.append(f"port and healthcheck port must differ, both are {self.port}")
        if self.grpc_port is not None:
            if not 1 <= self.grpc_port <= 65535:  # every worker binds it: no "any free port"
                problems.append(f"gRPC port must be from 1 to 65535, got {self.grpc_port}")
            elif self.grpc_port in (self.port, self.healthcheck_port):
                problems.append(f"the gRPC port must differ from the HTTP ports ({self.grpc_port})")
        for name, minimum in (("workers", 1), ("concurrency", 1), ("max_queue", 0)):
            if getattr(self, name) < minimum:
                problems.append(f"{name} must be at least {minimum}, got {getattr(self, name)}")
        for name in ("timeout", "grace_period"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must not be negative, got {getattr(self, name)}")
        for name in ("keepalive_timeout", "request_head_timeout"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be more than 0, got {getattr(self, name)}")
        for name in (
            "max_body_size",
            "spool_threshold",
            "max_parts",
            "max_image_pixels",
            "max_requests",
            "max_worker_memory",
        ):
            if getattr(self, name) < 0:
                problems.append(f"{name} must not be negative, got {getattr(self, name)}")
        if self.log_level not in LOG_LEVELS:
            problems.append(f"log level must be one of {', '.join(LOG_LEVELS)}")
        if self.log_format not in LOG_FORMATS:
            problems.append(
                f"log format must be one of {', '.join(LOG_FORMATS)}, got {self.log_format!r}"
            )
        if self.loop not in LOOPS:
            problems.append(f"loop must be one of {', '.join(LOOPS)}, got {self.loop!r}")
        elif self.loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
            problems.append(
                "--loop uvloop needs the uvloop package, which is not installed; "
                "pip install 'abeja-runtime[fast]' (or use --loop auto)"
            )
        return problems

    @property
    def stuck_after(self) -> float | None:
        """Seconds after which a still-running handler makes its worker be recycled (A1)."""
        return self.timeout + self.grace_period if self.timeout else None


_TRUE: Final = frozenset({"y", "yes", "t", "true", "on", "1"})
_FALSE: Final = frozenset({"n", "no", "f", "false", "off", "0"})


def parse_bool(text: str) -> bool:
    """``strtobool`` as the other platforms read their flags (KServe's ``--enable_grpc``,
    seldon-core's ``BOOL`` parameters); ``ValueError`` for anything else."""
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"{text!r} is not true or false")


def parse_context(text: str | None, name: str = "CONTEXT") -> dict[str, Any]:
    """Parse the ``CONTEXT`` variable (or another JSON-object setting called ``name``).

    Raises ``ValueError`` with a message naming the variable; ABEJA Platform crashed with a
    traceback.
    """
    if text is None or not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name} is not valid JSON ({exc}); set it to a JSON object") from exc
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a JSON object, got {type(value).__name__}")
    return value


#: Where ``ABEJA_TRAINING_RESULT_DIR`` points when it is empty (ABEJA's name).
_DEFAULT_TRAINING_RESULT_DIR: Final = "abejainc_training_result"


def resolve_training_result_dir(workdir: Path, value: str) -> Path:
    """Absolute as given; relative to the working dir; empty → ``abejainc_training_result``."""
    return workdir / (value or _DEFAULT_TRAINING_RESULT_DIR)
