"""What holds for every handler style: style selection, and the ABEJA runtime around each one.

Each style's handler is written into a fresh project (a tiny model that can sleep and reports
its process), then served with two workers, a 1 s timeout and a 1 KiB body limit: health
checks, access logs, request ids, 413, 504 and the workers must be the runtime's own.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
from helpers.cortex import build_model
from helpers.servers import TIMED_OUT_AFTER_1_S
from helpers.waiting import wait_until
from helpers.workers import wait_for_ready_workers

EXIT_TIMEOUT = 20.0

#: style → (files of the project, request path, request body for "sleep this long").
STYLES = {
    "abeja-v1": (
        {
            "main.py": """
                import os, time

                def handler(_iter, ctx):
                    for item in _iter:
                        time.sleep(item["sleep"])
                        yield {"pid": os.getpid()}
            """
        },
        "/",
        lambda seconds: {"sleep": seconds},
    ),
    "cortex": (
        {
            "main.py": """
                import os, time

                def pre_inference(sample, signature, metadata):
                    time.sleep(sample["sleep"])
                    return [1.0, 2.0, 3.0, 4.0]

                def post_inference(prediction, signature, metadata):
                    return {"pid": os.getpid()}
            """
        },
        "/predict",
        lambda seconds: {"sleep": seconds},
    ),
    "kserve": (
        {
            "main.py": """
                import os, time
                from kserve import Model

                class Sleepy(Model):
                    def predict(self, payload, headers=None):
                        time.sleep(payload["instances"][0])
                        return {"pid": os.getpid()}
            """
        },
        "/v1/models/model:predict",
        lambda seconds: {"instances": [seconds]},
    ),
    "seldon": (
        {
            "main.py": """
                import os, time

                class Sleepy:
                    def predict(self, X, features_names):
                        time.sleep(X["sleep"])
                        return {"pid": os.getpid()}
            """
        },
        "/api/v1.0/predictions",
        lambda seconds: {"jsonData": {"sleep": seconds}},
    ),
}


def write_project(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(textwrap.dedent(text).lstrip())
    return folder


def answer_pid(style: str, answer) -> int:
    body = answer.json()
    return body["jsonData"]["pid"] if style == "seldon" else body["pid"]


def load_failure(server) -> str:
    assert server.wait_exit(EXIT_TIMEOUT) != 0, server.lines
    found = [r for r in server.records() if str(r.get("message", "")).startswith("failed to")]
    assert found, server.lines
    return found[0]["message"]


@pytest.mark.parametrize("style", sorted(STYLES))
def test_the_abeja_runtime_applies_to_every_style(make_server, tmp_path, style):
    if style == "kserve":
        pytest.importorskip("kserve")
    files, path, body = STYLES[style]
    project = write_project(tmp_path / style, files)
    if style == "cortex":
        build_model(project / "iris.onnx")
    server = make_server(project, "--workers", "2", "--timeout", "1", "--max-body-size", "1KiB")
    # The handler is loaded with the detected style (HANDLER is the default main:handler), once
    # (--preload), and both workers serve it.
    wait_until(
        lambda: [r for r in server.records() if r.get("style") == style],
        EXIT_TIMEOUT,
        "the style to be logged",
    )
    wait_for_ready_workers(server, 2)

    headers = {"x-abeja-request-id": f"req-{style}"}
    answer = server.post_json(body(0), path=path, headers=headers)
    assert answer.status == 200, answer.body
    assert answer_pid(style, answer) != os.getpid()
    assert answer.headers["x-abeja-request-id"] == f"req-{style}"
    assert answer.headers["x-abeja-sys-meta-runtime-version"]
    access = server.wait_for_record(
        lambda r: r.get("log_type") == "access_log" and r.get("request_id") == f"req-{style}"
    )
    assert (access["http_method"], access["http_status"]) == ("POST", 200)

    for port in (server.port, server.healthcheck_port):
        assert server.health(port) == 200

    too_large = server.post_json({"pad": "x" * 2048}, path=path)
    assert too_large.status == 413
    assert too_large.json() == {"status": "request body too large (limit 1024 bytes)"}

    slow = server.post_json(body(3), path=path)
    assert slow.status == 504
    assert slow.json() == TIMED_OUT_AFTER_1_S
    assert server.health() == 200


def test_the_style_variable_selects_the_style(make_server, tmp_path):
    project = write_project(
        tmp_path / "p",
        {
            "main.py": """
                def handler(_iter, ctx):
                    return [{"seen": [type(item).__name__ for item in _iter]}]
            """
        },
    )
    server = make_server(project, env={"ABEJA_RUNTIME_STYLE": "abeja-v1"})
    record = server.wait_for_record(lambda r: r.get("style") == "abeja-v1")
    assert "set with --style / ABEJA_RUNTIME_STYLE" in record["message"]
    assert server.post_json({"a": 1}).json() == {"seen": ["dict"]}


def test_abeja_handlers_are_still_detected_as_abeja(make_server):
    server = make_server("ld_sync")
    record = server.wait_for_record(lambda r: r.get("style") == "abeja")
    assert "handler is a handler(request, context) callable" in record["message"]


@pytest.mark.parametrize(
    ("style", "expected"),
    [
        ("kserve", "is served with the kserve style, which needs a kserve.Model subclass"),
        ("seldon", "is served with the seldon style, which needs a class with a predict"),
    ],
)
def test_a_forced_style_that_does_not_fit_says_what_it_needs(make_server, style, expected):
    server = make_server("ld_sync", "--style", style, wait=False)
    message = load_failure(server)
    assert expected in message
    assert "HANDLER[main:handler]" in message


def test_an_unknown_style_is_a_usage_error(make_server):
    server = make_server("ld_sync", "--style", "torchserve", wait=False)
    assert server.wait_exit(EXIT_TIMEOUT) == 2
    assert "torchserve" in "\n".join(server.lines)


def test_a_module_alone_is_refused_for_the_abeja_style(make_server):
    server = make_server("ld_sync", "--style", "abeja", env={"HANDLER": "main"}, wait=False)
    assert server.wait_exit(EXIT_TIMEOUT) == 2  # a usage error, before anything starts
    assert "e.g. main:handler" in "\n".join(server.lines)


def test_two_kserve_models_in_one_module_must_be_named(make_server, tmp_path):
    pytest.importorskip("kserve")
    project = write_project(
        tmp_path / "p",
        {
            "main.py": """
                from kserve import Model

                class First(Model):
                    pass

                class Second(Model):
                    pass
            """
        },
    )
    message = load_failure(make_server(project, wait=False))
    assert "defines several kserve.Model classes (First, Second)" in message
    assert "main:First" in message


def test_a_missing_optional_package_is_named(make_server, tmp_path):
    project = write_project(
        tmp_path / "p",
        {
            "main.py": "def pre_inference(sample, signature, metadata):\n    return sample\n",
            "model.onnx": "an ONNX model, run with onnxruntime\n",
            # Shadows the installed package, as if it were not installed.
            "onnxruntime.py": "raise ImportError('No module named onnxruntime (simulated)')\n",
        },
    )
    message = load_failure(make_server(project, wait=False))
    assert "the cortex style needs the onnxruntime package" in message
    assert "pip install onnxruntime" in message


def test_the_context_reaches_v1_handlers_as_a_fresh_copy(make_server, tmp_path):
    project = write_project(
        tmp_path / "p",
        {
            "main.py": """
                def handler(_iter, ctx):
                    ctx.setdefault("calls", []).append(1)
                    yield dict(ctx)
            """
        },
    )
    server = make_server(project, env={"CONTEXT": json.dumps({"model": "m"})})
    for _ in range(2):
        assert server.post_json({}).json() == {"model": "m", "calls": [1]}
