"""The runtime's settings: one frozen, picklable ``Config`` built once and passed down.

The core's settings are declared here, once each (:mod:`abeja_runtime.settings`): name,
variable, kind, default and help; each style declares its own in its options dataclass
(:mod:`abeja_runtime.styles`), carried in ``Config.style_options``. ``main.py`` maps flags and
environment variables onto them; worker processes receive the same object. A setting's kind is
its validator (:data:`VALIDATORS`, as gunicorn's settings each name theirs): ``Config`` checks
every declared value with it, however the value came, and says what is wrong and what to give
instead. Nothing below the command line reads ``os.environ`` for the runtime's settings; the
one variable read further down is another platform's own: the Seldon style reads seldon-core's
``INCLUDE_METRICS_IN_CLIENT_RESPONSE`` in the handler process, as seldon-core does.

Importing this module imports no style and nothing of :mod:`abeja_runtime.worker`: ``--style``'s
choices come from the styles' static table (:data:`abeja_runtime.styles_table.REGISTERED`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import math
import os
import re
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from abeja_runtime.errors import handler_format_message
from abeja_runtime.settings import Setting, setting, settings_of
from abeja_runtime.styles_table import REGISTERED, style_names

__all__ = [
    "DEVICE_ID",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "LOOPS",
    "VALIDATORS",
    "Config",
    "PlatformIds",
    "parse_bool",
    "parse_context",
    "parse_size",
    "resolve_training_result_dir",
    "setting_problems",
    "tenant_weights",
]

#: The event loops a worker can run on (``--loop``).
LOOPS: Final = ("auto", "asyncio", "uvloop")
MiB: Final = 1024 * 1024
#: One GPU id as CUDA_VISIBLE_DEVICES and ``docker run --gpus device=`` take it: an index, a
#: GPU's UUID or the start of one (``GPU-8f2a``), or a MIG device's (``MIG-...``).
DEVICE_ID: Final = re.compile(r"^(?:\d+|GPU-[0-9A-Fa-f-]+|MIG-[0-9A-Za-z/-]+)$")
LOG_LEVELS: Final = ("debug", "info", "warning", "error", "critical")
#: The least ``--max-head-size``: below it, ordinary requests would be refused.
_SMALLEST_HEAD_LIMIT: Final = 1024
#: How log records are written (``--log-format``); ``auto`` is resolved by each process against
#: the stream its records go to (:func:`abeja_runtime.logs.configure_logging`).
LOG_FORMATS: Final = ("auto", "json", "text")


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
        help="worker processes; with `--preload` (the default) they share one copy of the "
        "loaded handler",
    )
    preload: bool = setting(
        True,
        kind="switch",
        envvar="ABEJA_RUNTIME_PRELOAD",
        server_only=True,
        help="import the handler once, in a template process that every worker is forked from: "
        "the workers share the loaded model's memory, and a replacement is ready in the time of "
        "a fork and its warm-up; off (or where a fork is not safe, which the log says): each "
        "worker imports the handler itself",
    )
    #: 1 keeps ABEJA's guarantee that non-thread-safe ML frameworks and module globals rely on.
    concurrency: int = setting(
        1,
        kind="positive",
        envvar="ABEJA_RUNTIME_CONCURRENCY",
        help="handler calls running at once per worker (1 = ABEJA's one-at-a-time); raise it "
        "only for thread-safe handlers",
    )
    #: Off by default: a batched handler has another signature (a list in, a list out).
    max_batch_size: int = setting(
        1,
        kind="positive",
        envvar="ABEJA_RUNTIME_MAX_BATCH_SIZE",
        help="requests the handler gets in one call, as `handler(requests, context)` with a list "
        "of requests, returning a list of responses in the same order; a worker that is idle "
        "takes what waits at once, a busy one's requests gather up to this (1: off)",
    )
    max_batch_wait: float = setting(
        0.01,
        kind="seconds",
        envvar="ABEJA_RUNTIME_MAX_BATCH_WAIT",
        server_only=True,
        help="with `--max-batch-size` above 1: seconds a batch may gather, from its first "
        "request's arrival, while every worker runs one, before it goes to the next free slot",
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
    deadline_header: str = setting(
        "x-envoy-expected-rq-timeout-ms",
        kind="text",
        envvar="ABEJA_RUNTIME_DEADLINE_HEADER",
        server_only=True,
        help="a request header that carries the caller's own time limit (milliseconds when its "
        "name ends in `-ms`, else seconds; `Request-Timeout`, in seconds, is read too; gRPC: its "
        "deadline), capped by `--timeout`: a call is answered `504` once it passes, never "
        "started after it, and refused `503` at once when the wait ahead is longer; empty: "
        "`Request-Timeout` only",
    )
    tenant_header: str = setting(
        "",
        kind="text",
        envvar="ABEJA_RUNTIME_TENANT_HEADER",
        server_only=True,
        default_text="none",
        help="a request header that names the caller's tenant (gRPC: the same metadata), or "
        "`api-key` for the short hash of the caller's API key: waiting calls are served by "
        "weighted fair queuing across tenants, and each tenant holds at most its weighted share "
        "of the queue; empty: one queue in arrival order",
    )
    tenant_weights: str = setting(
        "",
        kind="text",
        envvar="ABEJA_RUNTIME_TENANT_WEIGHTS",
        server_only=True,
        default_text="all 1",
        help="the tenants' weights, as `batch=1,interactive=4` (a tenant not named weighs 1; "
        "the metrics name these tenants, and fold the others into `other`)",
    )
    priority_header: str = setting(
        "",
        kind="text",
        envvar="ABEJA_RUNTIME_PRIORITY_HEADER",
        server_only=True,
        default_text="none",
        help="a request header (gRPC: metadata) with the call's priority class, `high`, "
        "`normal` (the default) or `low`: a higher class is served first, within "
        "`--priority-aging`",
    )
    priority_aging: float = setting(
        1.0,
        kind="positive_seconds",
        envvar="ABEJA_RUNTIME_PRIORITY_AGING",
        server_only=True,
        help="with `--priority-header`: a call of a lower class goes before those of higher "
        "classes that came this many seconds (per class between them) after it",
    )
    stream_idle_timeout: float = setting(
        60.0,
        kind="seconds",
        envvar="ABEJA_RUNTIME_STREAM_IDLE_TIMEOUT",
        server_only=True,
        help="seconds a streamed answer may go without progress once it has begun (no chunk "
        "from the handler and nothing taken by the client; `--timeout` bounds its first chunk); "
        "then it alone is cut short, its connection closed and its generator closed (an answer "
        "above 1 MiB, written as the client takes it, likewise); `0`: no limit",
    )
    stream_timeout: float = setting(
        0.0,
        kind="seconds",
        envvar="ABEJA_RUNTIME_STREAM_TIMEOUT",
        server_only=True,
        help="seconds a streamed answer may last in all once it has begun, however steadily it "
        "sends; then it alone is cut short and its generator closed (the handler's worker and "
        "its other calls go on); `0`: no limit",
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
        89_478_485,  # Pillow's own threshold for its warning (a 9459 x 9459 image)
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
    #: Sized for balancers that learn of the stop from readiness: haproxy's default checks
    #: (every 2 s, down after 3 failures) take 6 s; short of docker stop's 10 s.
    drain_delay: float = setting(
        8.0,
        kind="seconds",
        envvar="ABEJA_RUNTIME_DRAIN_DELAY",
        server_only=True,
        help="seconds after SIGTERM during which readiness says `503` but the runtime still "
        "accepts connections and answers every request (with `Connection: close`), so that a "
        "load balancer stops sending before it stops accepting; then the drain of "
        "`--grace-period`; `0`: stop accepting at once (SIGINT never waits)",
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
    #: Twice nginx's 32 KiB (4 buffers of 8 KiB), near Envoy's 60 KiB: far above what clients
    #: send (cookies and tokens included), far below the 1 MiB that aiohttp's own limits (128
    #: lines of 8 KiB) let each connection hold.
    max_head_size: int = setting(
        64 * 1024,
        kind="bytes",
        envvar="ABEJA_RUNTIME_MAX_HEAD_SIZE",
        server_only=True,
        help="largest request head (its request line and header lines, as sent), else `431` "
        "JSON and the connection is closed; each line is also limited to 8190 bytes, else "
        "`400`",
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
        "(uvloop when installed: the runtime brings it on CPython for Linux and macOS; about "
        "13 % more small requests per second)",
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
    #: Replayed in every handler process before it counts as ready, after each replacement too.
    warmup: tuple[str, ...] = setting(
        kind="paths",
        envvar="ABEJA_RUNTIME_WARMUP",
        default_factory=tuple,
        server_only=True,
        default_text="none",
        help="request files (as `abeja model run-local --input` takes them: JSON, images, any "
        "file) that each worker sends through its handler before it counts as ready; repeat "
        "the flag for several (the variable: paths separated by `:`); a warm-up that fails keeps "
        "the worker out of readiness",
    )
    #: Given to each worker before it imports the handler, so that a framework sees one GPU.
    devices: str = setting(
        "",
        kind="text",
        envvar="ABEJA_RUNTIME_DEVICES",
        server_only=True,
        default_text="all",
        help="GPUs to share among the workers, as `0,1`: each worker gets one, round-robin, as "
        "its `CUDA_VISIBLE_DEVICES`; empty: the workers see what the process sees",
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
        + ", ".join(f"`{listed.name}` ({listed.summary})" for listed in REGISTERED)
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
    api_keys: str = setting(
        "",
        kind="text",
        envvar="ABEJA_RUNTIME_API_KEYS",
        server_only=True,
        default_text="none",
        help="keys a caller must send to be served (`Authorization: Bearer KEY` or "
        "`X-API-Key: KEY`; gRPC: the same metadata), separated by commas; the health port and "
        "`/health_check` never ask for one. Prefer the variable, or a file, to the flag, which "
        "`ps` shows",
    )
    api_keys_file: str = setting(
        "",
        kind="text",
        envvar="ABEJA_RUNTIME_API_KEYS_FILE",
        server_only=True,
        default_text="none",
        help="a file of such keys, one a line (a mounted Kubernetes Secret), read again when "
        "it changes",
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

    def __post_init__(self) -> None:
        problems = setting_problems(self, keep=True)
        for options in self.style_options.values():
            if dataclasses.is_dataclass(options) and not isinstance(options, type):
                problems += setting_problems(options)
        if not problems:  # the values are of their kinds: how they go together
            problems = self._problems()
        if problems:
            raise ValueError("; ".join(problems))

    def _problems(self) -> list[str]:
        """What the settings' kinds cannot see alone: how the settings go together."""
        from abeja_runtime.styles import module_alone_allowed  # (imports the styles)

        problems = []
        colons = self.handler.count(":")
        if colons != 1 and not (colons == 0 and module_alone_allowed(self.style)):
            problems.append(handler_format_message(self.handler))
        if self.port == self.healthcheck_port and self.port != 0:
            problems.append(
                f"--port and --healthcheck-port must differ, both are {self.port}; "
                "give each its own port"
            )
        if self.grpc_port is not None and self.grpc_port in (self.port, self.healthcheck_port):
            problems.append(
                f"--grpc-port must differ from the HTTP ports ({self.grpc_port}); "
                "give it a port of its own"
            )
        if self.devices and not all(DEVICE_ID.match(device) for device in self.devices.split(",")):
            problems.append(
                f"--devices (ABEJA_RUNTIME_DEVICES) must be GPU ids separated by commas, as "
                f"CUDA_VISIBLE_DEVICES takes them: indices or UUIDs (e.g. 0,1 or GPU-8f2a...), "
                f"got {self.devices!r}"
            )
        try:
            tenant_weights(self.tenant_weights)
        except ValueError as exc:
            problems.append(f"--tenant-weights (ABEJA_RUNTIME_TENANT_WEIGHTS) {exc}")
        if self.max_head_size < _SMALLEST_HEAD_LIMIT:
            problems.append(
                f"--max-head-size (ABEJA_RUNTIME_MAX_HEAD_SIZE) must be at least 1KiB, room for "
                f"a request line and a few headers, got {self.max_head_size} bytes; the default "
                "is 64KiB"
            )
        if self.loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
            problems.append(
                "--loop uvloop needs the uvloop package, which is not installed (it has no "
                "build for this platform or Python); pip install uvloop, or use --loop auto"
            )
        return problems

    @property
    def stuck_after(self) -> float | None:
        """Seconds after which a still-running handler makes its worker be recycled (A1)."""
        return self.timeout + self.grace_period if self.timeout else None


# --- the kinds' validators -----------------------------------------------------------------------
#
# One per kind of :data:`abeja_runtime.settings.KINDS`: it takes a value as the setting may be
# given (typed, or as the text of its flag or variable) and returns it as the runtime keeps it,
# or raises ValueError saying what the value must be. A setting declares its kind; the kind is
# its validator; :func:`setting_problems` runs them, naming the flag and the variable.


def _whole(value: Any) -> int:
    if isinstance(value, str):
        return int(value.strip())
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ValueError


def _in_range(low: int, high: int | None, requirement: str) -> Callable[[Setting, Any], int]:
    def validate(declared: Setting, value: Any) -> int:
        try:
            number = _whole(value)
        except ValueError:
            raise ValueError(requirement) from None
        if number < low or (high is not None and number > high):
            raise ValueError(requirement)
        return number

    return validate


_port_from_1: Final = _in_range(
    1, 65535, "must be a port number from 1 to 65535 (every worker binds it), or unset for off"
)


def _optional_port(declared: Setting, value: Any) -> int | None:
    return None if value is None else _port_from_1(declared, value)


def _seconds(above_zero: bool) -> Callable[[Setting, Any], float]:
    requirement = (
        "must be a number of seconds above 0 (e.g. 2.5)"
        if above_zero
        else "must be a number of seconds, 0 or more (e.g. 2.5; 0: no limit)"
    )

    def validate(declared: Setting, value: Any) -> float:
        try:
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                raise ValueError
            number = float(value)
        except ValueError:
            raise ValueError(requirement) from None
        if math.isnan(number) or number < 0 or (above_zero and number == 0):
            raise ValueError(requirement)
        return number

    return validate


_SIZE: Final = re.compile(r"^\s*(\d+)\s*([kmg]i?b?)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``'1048576'``, ``'512KiB'``, ``'100MiB'``, ``'1GiB'`` (KB, MB, GB, K, M, G: 1024-based
    too) → bytes; ``ValueError`` for anything else."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a size in bytes (e.g. 1048576 or 100MiB)")
    number, unit = match.groups()
    power = " kmg".index(unit[0].lower()) if unit else 0
    return int(number) * (1 << (10 * power))


def _size(declared: Setting, value: Any) -> int:
    requirement = (
        "must be a size in bytes, 0 or more: a number, or one with KiB, MiB or GiB (e.g. 100MiB)"
    )
    try:
        size = parse_size(value) if isinstance(value, str) else _whole(value)
    except ValueError:
        raise ValueError(requirement) from None
    if size < 0:
        raise ValueError(requirement)
    return size


def _choice(declared: Setting, value: Any) -> str:
    if isinstance(value, str):
        for choice in declared.choices:
            if value.strip().lower() == choice.lower():
                return choice
    raise ValueError(f"must be one of {', '.join(declared.choices)}")


def _json_object(declared: Setting, value: Any) -> dict[str, Any]:
    if isinstance(value, Mapping):
        return dict(value)
    requirement = 'must be a JSON object (e.g. {"key": "value"})'
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            found = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{requirement}; this is not JSON ({exc})") from None
        if isinstance(found, dict):
            return found
        requirement += f"; this is a JSON {type(found).__name__}"
    raise ValueError(requirement)


def _switch(declared: Setting, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return parse_bool(value)
        except ValueError:
            pass
    raise ValueError("must be on or off: true or false (yes/no, on/off, 1/0)")


def _paths(declared: Setting, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = value.split(os.pathsep)
    if isinstance(value, list | tuple) and all(isinstance(path, str) for path in value):
        return tuple(path for path in value if path)
    raise ValueError("must be file paths (the variable: separated by os.pathsep)")


def _text(declared: Setting, value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("must be text")
    return value


#: Each kind's validator: ``(setting, value) → the value kept``, else ValueError saying what
#: the value must be; one for every kind of :data:`abeja_runtime.settings.KINDS` (a test checks).
VALIDATORS: Final[Mapping[str, Callable[[Setting, Any], Any]]] = {
    "text": _text,
    "port": _in_range(0, 65535, "must be a port number from 0 to 65535 (0: any free port)"),
    "optional_port": _optional_port,
    "positive": _in_range(1, None, "must be a whole number, 1 or more"),
    "count": _in_range(0, None, "must be a whole number, 0 or more"),
    "seconds": _seconds(above_zero=False),
    "positive_seconds": _seconds(above_zero=True),
    "bytes": _size,
    "choice": _choice,
    "log_level": _choice,
    "json_object": _json_object,
    "switch": _switch,
    "paths": _paths,
}


@functools.cache
def _declared(cls: type) -> tuple[Setting, ...]:
    return settings_of(cls)


def setting_problems(obj: Any, *, keep: bool = False) -> list[str]:
    """Each of the settings of the dataclass ``obj`` checked by its kind's validator: a sentence
    per bad value, naming its flag and variable, what it must be and what it is. With ``keep``,
    a good value is stored as its validator returns it (``'100MiB'`` → 104857600), even in a
    frozen dataclass (for its ``__post_init__``)."""
    problems = []
    cls: type = type(obj)
    for declared in _declared(cls):
        value = getattr(obj, declared.name)
        try:
            kept = VALIDATORS[declared.kind](declared, value)
        except ValueError as exc:
            where = f" ({declared.envvar})" if declared.envvar else ""
            problems.append(f"{declared.flag}{where} {exc}, got {value!r}")
            continue
        if keep and kept is not value:
            object.__setattr__(obj, declared.name, kept)
    return problems


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


#: The weights a tenant may have: a thousand to one at most, each way.
_LIGHTEST_WEIGHT: Final = 0.001
_HEAVIEST_WEIGHT: Final = 1000.0


def tenant_weights(text: str) -> dict[str, float]:
    """``--tenant-weights``: ``name=weight`` pairs separated by commas, each weight a number
    above 0; ``ValueError`` saying what is wrong."""
    weights: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, equals, number = item.partition("=")
        try:
            weight = float(number)
        except ValueError:
            weight = 0.0
        if not equals or not name.strip() or not _LIGHTEST_WEIGHT <= weight <= _HEAVIEST_WEIGHT:
            raise ValueError(
                f"must be name=weight pairs separated by commas, each weight a number from "
                f"{_LIGHTEST_WEIGHT:g} to {_HEAVIEST_WEIGHT:g} (e.g. batch=1,interactive=4); "
                f"{item!r} is not"
            )
        weights[name.strip()] = weight
    return weights
