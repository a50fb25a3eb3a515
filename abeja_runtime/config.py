"""The runtime's settings: one frozen, picklable ``Config`` built once and passed down.

Field names and defaults live here only. ``main.py`` maps flags and environment variables onto
these fields; worker processes receive the same object. Nothing below the command line reads
``os.environ`` for settings.
"""

from __future__ import annotations

import importlib.util
import json
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from abeja_runtime.pixels import DEFAULT_MAX_IMAGE_PIXELS

__all__ = [
    "DEFAULT_MAX_BODY_SIZE",
    "DEFAULT_MAX_IMAGE_PIXELS",
    "DEFAULT_MAX_PARTS",
    "DEFAULT_SPOOL_THRESHOLD",
    "LOG_LEVELS",
    "LOOPS",
    "MODULE_ONLY_STYLES",
    "STYLES",
    "Config",
    "PlatformIds",
    "parse_bool",
    "parse_context",
    "resolve_training_result_dir",
]

#: The event loops a worker can run on (``--loop``).
LOOPS: Final = ("auto", "asyncio", "uvloop")
MiB: Final = 1024 * 1024
#: ABEJA Platform had no limit at all; 100 MiB admits large images and small videos while still
#: stopping a runaway client before it fills the disk.
DEFAULT_MAX_BODY_SIZE: Final = 100 * MiB
#: Bodies up to this size stay in memory; most inference payloads (JSON, a photo) fit.
DEFAULT_SPOOL_THRESHOLD: Final = 1 * MiB
#: A hundred thousand empty parts took 3.5 s to parse and were all handed over; real forms have
#: a few. Starlette and Werkzeug stop at 1,000 too.
DEFAULT_MAX_PARTS: Final = 1000
LOG_LEVELS: Final = ("debug", "info", "warning", "error", "critical")
#: Handler styles (``abeja_runtime.styles``); ``auto`` picks one from what HANDLER names.
STYLES: Final = ("auto", "abeja", "abeja-v1", "cortex", "kserve", "seldon")
#: Styles whose HANDLER may name a module alone (a Cortex request-handler file, a Seldon
#: ``MyModel.py`` holding ``class MyModel``, a module with one KServe model class).
MODULE_ONLY_STYLES: Final = frozenset({"auto", "cortex", "kserve", "seldon"})


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
    """Every setting of one runtime instance; see the README for what each one means."""

    handler: str = "main:handler"
    host: str = "0.0.0.0"
    port: int = 5000
    healthcheck_port: int = 5001
    workers: int = 1
    #: Handler calls that may run at once in one worker. 1 keeps ABEJA's guarantee that
    #: non-thread-safe ML frameworks and module globals rely on.
    concurrency: int = 1
    #: Requests that may wait for a free handler slot, per worker, before 503 "service busy".
    max_queue: int = 100
    #: Seconds from the start of a request until its handler must have answered; 0 = no limit.
    timeout: float = 60.0
    max_body_size: int = DEFAULT_MAX_BODY_SIZE
    spool_threshold: int = DEFAULT_SPOOL_THRESHOLD
    #: Parts a multipart/form-data body may have (Starlette's and Werkzeug's default); 0 = any.
    max_parts: int = DEFAULT_MAX_PARTS
    #: Pixels an image may have when the handler side opens it with Pillow; 0 = no check.
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    #: Requests a worker serves before it is replaced (plus up to 10 % so that workers do not
    #: all restart at once); 0 = never. For handlers that leak.
    max_requests: int = 0
    #: Resident memory of a worker above which it is replaced; 0 = no limit.
    max_worker_memory: int = 0
    #: Seconds that in-flight requests get to finish at shutdown; also the time past ``timeout``
    #: after which a worker whose handler is still running is recycled.
    grace_period: float = 30.0
    #: Seconds an idle keep-alive connection is kept open. Longer than the 60 s idle timeout of
    #: common load balancers, so that they, not we, close idle connections (no request is sent
    #: on a connection that the runtime is closing).
    keepalive_timeout: float = 75.0
    #: Seconds a client has to send a whole request line and headers (slowloris protection).
    request_head_timeout: float = 10.0
    #: The event loop of the front and of async workers: ``asyncio``, ``uvloop`` (the
    #: ``abeja-runtime[fast]`` extra), or ``auto`` for uvloop when it is installed.
    loop: str = "auto"

    @property
    def event_loop(self) -> str:
        """The loop the workers run: ``auto`` resolved."""
        if self.loop != "auto":
            return self.loop
        return "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"

    log_level: str = "info"
    #: ABEJA_USER_MODEL_ROOT: where the user's code lives (relative to the start directory).
    user_model_root: str = ""
    #: ABEJA_TRAINING_RESULT_DIR as given; resolved against the working directory at start.
    training_result_dir: str = ""
    #: The parsed CONTEXT variable; every call gets its own deep copy.
    context: Mapping[str, Any] = field(default_factory=dict)
    #: Install requirements.txt / Pipfile at start-up, as ABEJA Platform does (opt-in here).
    install_requirements: bool = False
    platform: PlatformIds = field(default_factory=PlatformIds)
    #: The handler style (see ``STYLES``); ``auto`` detects it at load time and logs the choice.
    style: str = "auto"
    #: KServe style: the name in ``/v1/models/NAME`` and ``/v2/models/NAME`` (KServe's default).
    model_name: str = "model"
    #: The port of the Open Inference (V2) gRPC protocol, served by the front; None = off.
    grpc_port: int | None = None
    #: KServe's main-script habit: the model file and its arguments, run as ``__main__``
    #: (``abeja-runtime kserve model.py ...``); empty = import ``handler`` as usual.
    kserve_script: tuple[str, ...] = ()
    #: KServe's ``--enable_docs_url``: ``/docs`` serves the Swagger UI of ``/openapi.json``.
    kserve_docs: bool = False
    #: Cortex style: the ONNX model file or SavedModel directory, relative to the working
    #: directory; empty = the one found in the training-result directory or the working one.
    cortex_model: str = ""
    #: Seldon style: the class's constructor parameters, as seldon-core takes them: a JSON list
    #: of ``{"name": ..., "value": "...", "type": "INT|FLOAT|DOUBLE|STRING|BOOL"}``.
    seldon_parameters: str = ""
    #: Seldon style: model metadata (YAML or JSON) under what ``init_metadata()`` returns.
    seldon_metadata: str = ""
    #: Seldon style: this unit's id in the graph (PREDICTIVE_UNIT_ID), which picks the routing
    #: decision that feedback passes to ``send_feedback``.
    seldon_unit_id: str = ""
    #: Seldon style: this unit's image (PREDICTIVE_UNIT_IMAGE), named with the unit id in the
    #: ``meta.requestPath`` of its answers.
    seldon_unit_image: str = ""
    #: Seldon style: seldon-core's ``--service-type``. seldon-core 1.18 checks it and answers
    #: each route by the methods the class has, whatever the type; so does this. (Not from
    #: SERVICE_TYPE, which ABEJA Platform sets to HTTP for its own purpose.)
    seldon_service_type: str = "MODEL"
    #: Cortex style: the ``metadata`` dict passed to ``pre_inference`` / ``post_inference``.
    cortex_metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = list(self._problems())
        if problems:
            raise ValueError("; ".join(problems))

    def _problems(self) -> list[str]:
        problems = []
        if self.style not in STYLES:
            problems.append(f"style must be one of {', '.join(STYLES)}, got {self.style!r}")
        colons = self.handler.count(":")
        if colons != 1 and not (colons == 0 and self.style in MODULE_ONLY_STYLES):
            problems.append(  # ABEJA's wording (contract A4), typo fixed
                f"Possibly, your HANDLER[{self.handler}] parameter is wrong. handler needs one "
                "':' separator. The format is <module>:<function>, e.g. main:handler."
            )
        if not self.model_name or "/" in self.model_name:
            problems.append(f"model name must be non-empty without '/', got {self.model_name!r}")
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
