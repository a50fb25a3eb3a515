"""Cold start (issue 39): from ``docker run`` of a production image to its first answer, split into
its parts, for the runtime and, beside it in the same run, KServe's own model server.

    python -m benchmarks.coldstart                           # 5 runs of each image
    python -m benchmarks.coldstart --runs 7 --write          # and a section in RESULTS.md
    BASE_IMAGE=abeja-runtime-base:bookworm python -m benchmarks.coldstart

**Images**, built first (Docker's layer cache makes a second run quick), all on the same base
image (``--base-image``, else ``BASE_IMAGE``, else ``python:3.11-slim``):

- ``tax``: ``samples/tax`` (the ABEJA docs' first example), built by the real
  ``abeja model build``.
- ``sklearn``: ``benchmarks/handlers/sklearn_forest``, a random forest that the handler loads
  at import with ``joblib``, as ABEJA's table-data template does; built by ``abeja model build``.
- ``kserve-sklearn``: the same model file in ``kserve.ModelServer`` (``benchmarks/peers/
  kserve_sklearn``), as KServe's sklearnserver serves one. The model is trained in this image's
  build (``train.py``), then copied into the runtime's ``sklearn`` image: both load the same bytes
  with the same scikit-learn.

**A run** of an image: ``docker run -d --read-only --tmpfs /tmp -p`` (ports on 127.0.0.1, as a
user runs the production image), then the image's request is sent every 5 ms until one is
answered 200; the container is removed. Its parts, from the container's ``State.StartedAt``
(when the container's process was started, after Docker's set-up of the container):

- *container start*: ``docker run`` called to ``StartedAt``;
- *runtime* (ours): ``StartedAt`` to the runtime's ``ready`` log line, less the handler's import
  (``abeja_runtime_start_seconds{part="handler"}``): the interpreter, the runtime's imports and
  set-up, the template's and the worker's start; *imports* (KServe): to the end of
  ``server.py``'s imports (``kserve``, ``joblib``), which it prints;
- *handler load* (ours: the handler's import, the model's load in it; KServe: ``load()``);
- *first answer*: from then to the first 200 (KServe: the model server's own start, uvicorn's
  and gRPC's, then the answer), within the 5 ms of the poll.

The first round of every image is not recorded: it reads the image's files into the page cache,
as on a node that already ran the image. Rounds alternate the images. Nothing is asserted; the
exit status is 1 only when an image could not be built or did not answer within 120 s.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from abeja_runtime.launch import free_ports

REPO = Path(__file__).resolve().parent.parent
KSERVE_VERSION = "0.21.0"
SKLEARN_VERSION = "1.9.1"
#: The runtime's service and health-check ports, KServe's HTTP port, in the containers.
RUNTIME_PORTS = (5000, 5001)
KSERVE_PORT = 8080
#: How long an image has to answer its first request.
ANSWER_WITHIN = 120.0
POLL = 0.005
_READY = re.compile(r"^ready [\d.]+ s after the runtime started")
_HANDLER_SECONDS = re.compile(r'abeja_runtime_start_seconds\{[^}]*part="handler"[^}]*\} (\S+)')


@dataclass(frozen=True)
class Image:
    """An image under test and the request it is asked."""

    name: str
    tag: str
    path: str
    body: bytes
    kserve: bool = False


@dataclass
class Sample:
    """One run of an image, in seconds."""

    container: float
    runtime: float
    load: float
    answer: float

    @property
    def total(self) -> float:
        return self.container + self.runtime + self.load + self.answer


@dataclass
class Series:
    image: Image
    samples: list[Sample] = field(default_factory=list)

    def median(self, part: str) -> float:
        return float(statistics.median(getattr(sample, part) for sample in self.samples))


def _instances() -> bytes:
    return json.dumps({"instances": [[0.5] * 20, [-1.0] * 20]}).encode()


def images(prefix: str) -> list[Image]:
    return [
        Image("tax", f"{prefix}-tax", "/", b'{"total_without_tax": 100}'),
        Image("sklearn", f"{prefix}-sklearn", "/", _instances()),
        Image(
            "kserve-sklearn",
            f"{prefix}-kserve-sklearn",
            "/v1/models/model:predict",
            _instances(),
            kserve=True,
        ),
    ]


def _docker(*args: str, timeout: float = 900) -> str:
    done = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode:
        raise RuntimeError(f"docker {' '.join(args[:2])} failed: {done.stderr.strip()[-2000:]}")
    return done.stdout


def build(base_image: str, prefix: str) -> list[Image]:
    """The three images (see the module); each image's name, as built."""
    todo = images(prefix)
    with tempfile.TemporaryDirectory(prefix="abeja-coldstart-") as scratch:
        work = Path(scratch)
        kserve = work / "kserve"
        shutil.copytree(REPO / "benchmarks" / "peers" / "kserve_sklearn", kserve)
        model_source = REPO / "benchmarks" / "handlers" / "sklearn_forest"
        shutil.copy(model_source / "train.py", kserve)
        print(f"building {todo[2].tag} (KServe {KSERVE_VERSION}, scikit-learn {SKLEARN_VERSION})")
        _docker(
            "build",
            "-q",
            "--build-arg",
            f"BASE_IMAGE={base_image}",
            "--build-arg",
            f"KSERVE_VERSION={KSERVE_VERSION}",
            "--build-arg",
            f"SKLEARN_VERSION={SKLEARN_VERSION}",
            "-t",
            todo[2].tag,
            str(kserve),
        )
        sklearn = work / "sklearn"
        shutil.copytree(model_source, sklearn, ignore=shutil.ignore_patterns("train.py"))
        (sklearn / "requirements.txt").write_text(f"scikit-learn=={SKLEARN_VERSION}\njoblib\n")
        container = _docker("create", todo[2].tag).strip()
        try:
            _docker("cp", f"{container}:/srv/model/model.joblib", str(sklearn / "model.joblib"))
        finally:
            _docker("rm", container)
        tax = work / "tax"
        shutil.copytree(REPO / "samples" / "tax", tax)
        for image, folder in ((todo[0], tax), (todo[1], sklearn)):
            print(f"building {image.tag} (abeja model build)")
            command = [sys.executable, "-m", "abeja_cli", "model", "build", "-h", "main:handler"]
            command += ["-i", base_image, "-t", image.tag, "-q"]
            done = subprocess.run(
                command, cwd=folder, capture_output=True, text=True, timeout=1800, check=False
            )
            if done.returncode:
                raise RuntimeError(f"abeja model build failed: {done.stderr.strip()[-2000:]}")
    return todo


@contextlib.contextmanager
def _container(image: Image) -> Iterator[tuple[str, list[int]]]:
    """The image's container, started, and the ports on 127.0.0.1 its own are published on."""
    inside = (KSERVE_PORT,) if image.kserve else RUNTIME_PORTS
    ports = free_ports(len(inside))
    command = ["run", "-d", "--read-only", "--tmpfs", "/tmp"]
    for host, port in zip(ports, inside, strict=True):
        command += ["-p", f"127.0.0.1:{host}:{port}"]
    container = _docker(*command, image.tag, timeout=60).strip()
    try:
        yield container, ports
    finally:
        subprocess.run(["docker", "rm", "-f", container], capture_output=True, check=False)


def _answered(image: Image, port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request(
            "POST", image.path, image.body, headers={"Content-Type": "application/json"}
        )
        response = connection.getresponse()
        response.read()
        return response.status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


def _epoch(docker_time: str) -> float:
    """Docker's RFC 3339 time (nanoseconds, ``Z``) in seconds since the epoch."""
    whole, _, fraction = docker_time.rstrip("Z").partition(".")
    moment = datetime.datetime.fromisoformat(whole).replace(tzinfo=datetime.timezone.utc)
    return moment.timestamp() + float(f"0.{fraction or 0}")


def _log_lines(container: str) -> list[dict[str, object]]:
    done = subprocess.run(
        ["docker", "logs", container], capture_output=True, text=True, timeout=60, check=False
    )
    lines = []
    for line in (done.stdout + done.stderr).splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict):
                lines.append(record)
    return lines


def run_once(image: Image) -> Sample:
    """One cold start of ``image`` (see the module)."""
    called = time.time()
    with _container(image) as (container, ports):
        until = time.monotonic() + ANSWER_WITHIN
        while not _answered(image, ports[0]):
            if time.monotonic() > until:
                raise RuntimeError(f"{image.name} did not answer within {ANSWER_WITHIN:g} s")
            time.sleep(POLL)
        answered = time.time()
        started = _epoch(_docker("inspect", "-f", "{{.State.StartedAt}}", container).strip())
        lines = _log_lines(container)
        if image.kserve:
            said = next(line for line in lines if "imported_at" in line)
            imported, loaded = (float(str(said[key])) for key in ("imported_at", "loaded_at"))
        else:
            ready = next(line for line in lines if _READY.match(str(line.get("message", ""))))
            loaded = _epoch(str(ready["timestamp"]).replace("+00:00", "Z"))
            imported = loaded - _handler_seconds(ports[1])
        return Sample(started - called, imported - started, loaded - imported, answered - loaded)


def _handler_seconds(health_port: int) -> float:
    """The runtime's ``abeja_runtime_start_seconds{part="handler"}``."""
    metrics = http.client.HTTPConnection("127.0.0.1", health_port, timeout=5)
    try:
        metrics.request("GET", "/metrics")
        found = _HANDLER_SECONDS.search(metrics.getresponse().read().decode())
    finally:
        metrics.close()
    if found is None:
        raise RuntimeError("the runtime's /metrics has no abeja_runtime_start_seconds")
    return float(found.group(1))


def render(series: list[Series], base_image: str, runs: int) -> str:
    rows = [
        "| image | container start | runtime's own / KServe's imports | handler / model load "
        "| first answer | `docker run` to first answer |",
        "|---|---|---|---|---|---|",
    ]
    for one in series:
        parts = [one.median(part) for part in ("container", "runtime", "load", "answer")]
        total = statistics.median(sample.total for sample in one.samples)
        cells = " | ".join(f"{value:.3f} s" for value in (*parts, total))
        rows.append(f"| {one.image.name} | {cells} |")
    lines = [
        f"Base image {base_image}; median of {runs} runs each, alternated, after one "
        "unrecorded run of each image.",
        "",
        *rows,
    ]
    owns = [one.median("runtime") for one in series if not one.image.kserve]
    if owns:
        own = max(owns)
        lines += [
            "",
            f"The runtime's own share (its imports and set-up, without the handler's): at most "
            f"{own:.3f} s: {'PASS' if own <= 0.3 else 'FAIL'} (target ≤ 0.3 s).",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.coldstart")
    parser.add_argument("--runs", type=int, default=5, help="recorded runs of each image")
    parser.add_argument("--base-image", default=os.environ.get("BASE_IMAGE", "python:3.11-slim"))
    parser.add_argument("--prefix", default="abeja-coldstart", help="the images' names begin so")
    parser.add_argument("--write", action="store_true", help="append the table to RESULTS.md")
    parser.add_argument(
        "--only", default="", help="comma-separated image names to run (all are built)"
    )
    args = parser.parse_args(argv)
    try:
        todo = build(args.base_image, args.prefix)
        if args.only:
            todo = [image for image in todo if image.name in args.only.split(",")]
        series = [Series(image) for image in todo]
        for round_ in range(args.runs + 1):
            for one in series:
                sample = run_once(one.image)
                if round_:
                    one.samples.append(sample)
                    print(f"{one.image.name}: {sample}", flush=True)
    except (RuntimeError, subprocess.TimeoutExpired, StopIteration) as exc:
        print(f"coldstart: {exc or 'a line the benchmark reads was not logged'}", file=sys.stderr)
        return 1
    report = render(series, args.base_image, args.runs)
    print(report)
    if args.write:
        head = f"## Cold start {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%M}Z"
        command = "`python -m benchmarks.coldstart " + " ".join(argv or sys.argv[1:]) + "`"
        with open(REPO / "benchmarks" / "RESULTS.md", "a") as results:
            results.write(f"\n{head}: {command}\n\n{report}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
