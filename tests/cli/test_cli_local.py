"""``abeja model run-local`` end to end with the local engine: the real CLI (a subprocess)
runs the real runtime; no Docker needed."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import (
    CHATTY_RUN,
    CLI_TIMEOUT,
    HELD_WHEEL,
    SAMPLES,
    CliProcess,
    HeldIndex,
    Result,
    assert_flipped,
    chatty_run,
    cli_env,
)

LOCAL = ("--engine", "local")

Abeja = Callable[..., Result]
Project = Callable[[str], Path]


def run_local(abeja: Abeja, cwd: Path, *args: str, **kwargs: object) -> Result:
    return abeja("model", "run-local", *LOCAL, *args, cwd=cwd, **kwargs)


# -- the samples --------------------------------------------------------------------------


def test_tax_sample(abeja: Abeja, project: Project) -> None:
    cwd = project("tax")
    result = run_local(abeja, cwd, "-h", "main:handler", "--input", "request.json")
    assert result.returncode == 0, str(result)
    assert result.text == '{\n    "total": 108.0\n}\n'
    assert "[info] sending request to model: POST / request.json (application/json" in result.stderr
    assert "access: POST / 200" in result.stderr  # the model's log is shown (on stderr)

    bad = run_local(abeja, cwd, "-h", "main:handler", "--input", "bad_request.json", "-q")
    assert bad.returncode == 1, str(bad)
    assert json.loads(bad.stdout) == {"message": "total_without_tax is need"}
    assert (
        bad.stderr
        == "[error] the model answered 400 Bad Request (application/json; charset=utf8)\n"
    )


def test_image_flip_sample(abeja: Abeja, project: Project) -> None:

    cwd = project("image_flip")
    result = run_local(abeja, cwd, "-h", "main:handler", "--input", "cat.jpg", "-q")
    assert result.returncode == 0, str(result)
    assert result.stderr == ""
    assert_flipped(cwd / "cat.jpg", result.stdout)


def test_multipart_sample(abeja: Abeja, project: Project) -> None:
    cwd = project("multipart_form")
    result = run_local(
        abeja, cwd, "-h", "main:handler", "-q",
        "--input", "title=Q3 ✓", "--input", "author=abeja", "--input", "document=@report.txt",
    )  # fmt: skip
    assert result.returncode == 0, str(result)
    report = (cwd / "report.txt").read_bytes()
    assert json.loads(result.stdout) == {
        "fields": {"title": "Q3 ✓", "author": "abeja"},
        "files": [
            {
                "form_name": "document",
                "file_name": "report.txt",
                "content_type": "text/plain",
                "size": len(report),
                "sha256": hashlib.sha256(report).hexdigest(),
            }
        ],
    }


def test_numpy_classifier_sample(abeja: Abeja, project: Project) -> None:
    cwd = project("numpy_classifier")
    result = run_local(abeja, cwd, "-h", "main:handler", "--input", "request.json", "-q")
    assert result.returncode == 0, str(result)
    labels = [p["label"] for p in json.loads(result.stdout)["predictions"]]
    assert labels == ["setosa", "versicolor", "virginica"]


def test_numpy_classifier_reads_the_training_result_dir(abeja: Abeja, project: Project) -> None:
    cwd = project("numpy_classifier")
    (cwd / "abejainc_training_result").rename(cwd / "elsewhere")
    missing = run_local(abeja, cwd, "-h", "main:handler", "--input", "request.json", "-q")
    assert missing.returncode == 1, str(missing)
    assert "model.npz" in missing.stderr  # the import error, from the model's log
    moved = run_local(
        abeja, cwd, "-h", "main:handler", "--input", "request.json", "-q",
        "-e", "ABEJA_TRAINING_RESULT_DIR:elsewhere",
    )  # fmt: skip
    assert moved.returncode == 0, str(moved)


def test_csv_sample(abeja: Abeja, project: Project) -> None:
    cwd = project("csv_table")
    result = run_local(abeja, cwd, "-h", "main:handler", "--input", "sales.csv", "-q")
    assert result.returncode == 0, str(result)
    answer = json.loads(result.stdout)
    assert answer["rows"] == 5
    assert answer["columns"]["store"] == {"type": "text", "count": 5, "distinct": 3}
    assert answer["columns"]["visitors"]["mean"] == 910.0
    assert answer["columns"]["sales"]["count"] == 4


OUR_SAMPLES = ("tax", "image_flip", "multipart_form", "numpy_classifier", "csv_table")


@pytest.mark.parametrize("name", OUR_SAMPLES)
def test_sample_has_a_readme_line_and_a_request(name: str) -> None:
    """A newcomer's three commands: run-local, run-local-server and curl, on files that exist."""
    sample = SAMPLES / name
    lines = (sample / "README.md").read_text("utf-8").splitlines()
    run = next(line for line in lines if line.startswith("abeja model run-local "))
    assert "-h main:handler" in run
    assert any(line.startswith("abeja model run-local-server -h main:handler") for line in lines)
    curl = next(line for line in lines if line.startswith("curl "))
    for command in (run, curl):
        words = [w.split("@")[-1] for w in command.split() if "@" in w or "." in w]
        assert any((sample / word).is_file() for word in words), command


# -- output ---------------------------------------------------------------------------------


def test_json_is_pretty_and_utf8(abeja: Abeja, project: Project) -> None:
    result = run_local(
        abeja, project("responder"), "-h", "main:unicode", "--input", "request.json", "-q"
    )
    assert result.returncode == 0, str(result)
    assert (
        result.stdout
        == '{\n    "name": "日本語",\n    "n": [\n        1,\n        2\n    ]\n}\n'.encode()
    )


def test_binary_round_trip_is_byte_exact(abeja: Abeja, project: Project) -> None:
    cwd = project("responder")
    blob = bytes(range(256)) * 64 + b"\n\r\n\x00"
    (cwd / "blob.bin").write_bytes(blob)
    result = run_local(abeja, cwd, "-h", "main:echo", "--input", "blob.bin", "-q")
    assert result.returncode == 0, str(result)
    assert result.stdout == blob


def on_terminal(cwd: Path, *args: str) -> tuple[int, bytes, str]:
    """``abeja ARGS`` with stdout on a terminal (a pty): exit code, what the terminal showed,
    stderr."""
    import pty

    leader, follower = pty.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "abeja_cli", *args],
            cwd=cwd, env=cli_env(), stdin=subprocess.DEVNULL, stdout=follower,
            stderr=subprocess.PIPE, timeout=120,
        )  # fmt: skip
        os.close(follower)
        follower = -1
        shown = b""
        with contextlib.suppress(OSError):  # EIO once the pty has no writer left
            while chunk := os.read(leader, 4096):
                shown += chunk
    finally:
        os.close(leader)
        if follower != -1:
            os.close(follower)
    return proc.returncode, shown, proc.stderr.decode()


def test_binary_is_not_dumped_on_a_terminal(project: Project) -> None:
    """On a terminal (a pty here) a JPEG answer is described, not printed."""
    code, shown, stderr = on_terminal(
        project("image_flip"), "model", "run-local", *LOCAL,
        "-h", "main:handler", "--input", "cat.jpg", "-q",
    )  # fmt: skip
    assert code == 0, stderr
    assert shown == b""
    assert stderr.startswith("[info] the answer is ")
    assert "bytes of image/jpeg; not printed to the terminal: use --output FILE" in stderr


MISLABELLED = "the answer is labelled application/json but is not JSON (256 bytes of binary data)"


def test_bytes_labelled_json_are_said_not_to_be_json(abeja: Abeja, project: Project) -> None:
    """A handler that returns bytes under application/json: on a terminal nothing is dumped,
    and either way the CLI says that the answer is not JSON and how to keep it."""
    cwd = project("responder")
    args = ("-h", "main:mislabelled", "--input", "request.json")
    code, shown, stderr = on_terminal(cwd, "model", "run-local", *LOCAL, *args, "-q")
    assert (code, shown) == (0, b""), stderr
    assert stderr == (
        f"[info] {MISLABELLED}; not printed to the terminal: save it with --output FILE, and "
        "check the content_type that the handler returns\n"
    )

    piped = run_local(abeja, cwd, *args)
    assert piped.returncode == 0, str(piped)
    assert piped.stdout == bytes(range(256))  # byte-exact, as the platform would send it
    assert (
        f"[warning] {MISLABELLED}; written as it came: save it with --output FILE, and check "
        "the content_type that the handler returns\n"
    ) in piped.stderr


def test_text_gets_no_newline_and_json_lines_stay_raw(abeja: Abeja, project: Project) -> None:
    cwd = project("responder")
    text = run_local(abeja, cwd, "-h", "main:text", "--input", "request.json", "-q")
    assert text.stdout == b"hello"
    lines = run_local(abeja, cwd, "-h", "main:dumps", "--input", "request.json", "-q")
    assert lines.stdout == b'{"a": 1}\n{"b": 2}'


def test_output_file(abeja: Abeja, project: Project, tmp_path: Path) -> None:
    cwd = project("responder")
    target = tmp_path / "answer.json"
    result = run_local(
        abeja, cwd, "-h", "main:unicode", "--input", "request.json", "--output", str(target)
    )
    assert result.returncode == 0, str(result)
    assert result.stdout == b""
    assert json.loads(target.read_bytes()) == {"name": "日本語", "n": [1, 2]}
    assert f"bytes (application/json) to {target}" in result.stderr


def test_error_status_prints_status_and_body(abeja: Abeja, project: Project) -> None:
    cwd = project("responder")
    result = run_local(abeja, cwd, "-h", "main:teapot", "--input", "request.json")
    assert result.returncode == 1, str(result)
    assert json.loads(result.stdout) == {"message": "short and stout"}
    assert result.error_lines() == [
        "[error] the model answered 418 I'm a Teapot (application/json)"
    ]


def test_quiet_prints_only_the_body(abeja: Abeja, project: Project) -> None:
    cwd = project("responder")
    result = run_local(abeja, cwd, "-h", "main:text", "--input", "request.json", "--quiet")
    assert (result.returncode, result.stdout, result.stderr) == (0, b"hello", "")


def test_method_content_type_and_query(abeja: Abeja, project: Project) -> None:
    cwd = project("responder")
    put = run_local(
        abeja, cwd, "-h", "main:describe", "-q", "--method", "PUT",
        "--input", "request.json", "--content-type", "text/x-custom",
    )  # fmt: skip
    seen = json.loads(put.stdout)
    assert (seen["method"], seen["content_type"]) == ("PUT", "text/x-custom")
    assert seen["body"] == (cwd / "request.json").read_text()

    get = run_local(
        abeja, cwd, "-h", "main:describe", "-q", "--method", "get",
        "--input", "a=1", "--input", "b=x y",
    )  # fmt: skip
    seen = json.loads(get.stdout)
    assert (seen["method"], seen["body"]) == ("GET", "a=1&b=x+y")


def test_many_runs_under_cpu_load_all_answer(abeja: Abeja, project: Project) -> None:
    """The local engine, started and asked again and again while every core is busy: each run
    answers. A request that reached the runtime as its worker became ready could hang forever
    (the supervisor dropped a connection it had just accepted); each run is bounded here."""
    cwd = project("responder")
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 2)
    ]
    try:
        with ThreadPoolExecutor(3) as pool:
            runs = list(pool.map(
                lambda _: run_local(abeja, cwd, "-h", "main:describe", "-q", "--method", "PUT",
                                    "--input", "request.json", timeout=60),
                range(24),
            ))  # fmt: skip
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    for run in runs:
        assert run.returncode == 0, str(run)
        assert json.loads(run.stdout)["method"] == "PUT"


def test_stdin_input(abeja: Abeja, project: Project) -> None:
    result = run_local(
        abeja, project("responder"), "-h", "main:echo", "--input", "-", "-q", stdin=b"from stdin"
    )
    assert (result.returncode, result.stdout) == (0, b"from stdin")


def test_a_text_log_format_asked_for_the_model_does_not_blind_the_cli(
    abeja: Abeja, project: Project
) -> None:
    """The CLI reads the server's log as JSON records (its ports first): a log format set with
    -e is overridden for the server it starts."""
    cwd = project("tax")
    result = run_local(
        abeja, cwd, "-h", "main:handler", "--input", "request.json",
        "-e", "ABEJA_RUNTIME_LOG_FORMAT=text",
    )  # fmt: skip
    assert result.returncode == 0, str(result)
    assert json.loads(result.stdout) == {"total": 108.0}
    assert "access: POST / 200" in result.stderr


def test_environment_reaches_the_model(abeja: Abeja, project: Project) -> None:
    cwd = project("responder")
    (cwd / "model.env").write_text("FROM_FILE=file\nOVERRIDDEN=file\n")
    result = run_local(
        abeja, cwd, "-h", "main:describe", "-q", "--input", "request.json",
        "-e", "FROM_E=e=1", "-e", "FROM_COLON:a:b", "-e", "OVERRIDDEN=option",
        "--env-file", "model.env", "-o", "org-1",
    )  # fmt: skip
    assert result.returncode == 0, str(result)
    seen = json.loads(result.stdout)
    assert seen["env"] == {
        "HANDLER": "main:describe",
        "ABEJA_TRAINING_RESULT_DIR": str(cwd / "abejainc_training_result"),
        "ABEJA_ORGANIZATION_ID": "org-1",
        "FROM_E": "e=1",
        "FROM_COLON": "a:b",
        "FROM_FILE": "file",
        "OVERRIDDEN": "option",
        "PYTHONUNBUFFERED": "1",
    }
    assert seen["cwd"] == str(cwd)


@pytest.mark.parametrize("inherit", [False, True])
def test_the_shell_environment_stays_out_unless_inherited(
    abeja: Abeja, project: Project, inherit: bool
) -> None:
    env = cli_env(AWS_SECRET_ACCESS_KEY="do-not-leak", LC_ALL="C.UTF-8")
    extra = ["--inherit-env"] if inherit else []
    result = run_local(
        abeja, project("responder"), "-h", "main:environ", "-q", "--input", "request.json",
        "-e", "MODEL_VAR=1", *extra, env=env,
    )  # fmt: skip
    assert result.returncode == 0, str(result)
    seen = set(result.text.split())  # a list of str: one name a line
    assert {"PATH", "HOME", "LC_ALL", "MODEL_VAR", "HANDLER"} <= seen
    assert ("AWS_SECRET_ACCESS_KEY" in seen) is inherit


def variables(result: Result) -> dict[str, str | None]:
    assert result.returncode == 0, str(result)
    return json.loads(result.stdout)


DRAIN_DELAY = "ABEJA_RUNTIME_DRAIN_DELAY"


#: How a user gives the drain delay (nothing: the CLI's 0), and what the runtime gets.
DRAIN_DELAYS: dict[str, tuple[dict[str, Any], str]] = {
    "default": ({}, "0"),
    "-e": ({"args": ["-e", f"{DRAIN_DELAY}=3"]}, "3"),
    "env-file": ({"env_file": f"{DRAIN_DELAY}=4\n", "args": ["--env-file", "model.env"]}, "4"),
    "dotenv": ({"dotenv": f"{DRAIN_DELAY}=5\n"}, "5"),  # the runtime reads the project's .env
    "inherited": ({"shell": "6", "args": ["--inherit-env"]}, "6"),
    "not-inherited": ({"shell": "6"}, "0"),  # the shell's variables stay out by default
}


def test_a_local_run_has_no_drain_delay_unless_given(abeja: Abeja, project: Project) -> None:
    """Nothing balances in front of a local run, so its stop need not wait (issue 31)."""

    def run(given: dict[str, Any], cwd: Path) -> str | None:
        (cwd / "names.json").write_text(json.dumps([DRAIN_DELAY]))
        if "env_file" in given:
            (cwd / "model.env").write_text(given["env_file"])
        if "dotenv" in given:
            (cwd / ".env").write_text(given["dotenv"])
        env = cli_env(**({DRAIN_DELAY: given["shell"]} if "shell" in given else {}))
        result = run_local(abeja, cwd, "-h", "main:variables", "-q", "--input", "names.json",
                           *given.get("args", []), env=env)  # fmt: skip
        return variables(result)[DRAIN_DELAY]

    # The copies are made here, one after the other: two threads would pick the same folder.
    projects = [project("responder") for _ in DRAIN_DELAYS]
    with ThreadPoolExecutor(3) as pool:
        seen = pool.map(run, (given for given, _ in DRAIN_DELAYS.values()), projects)
        assert dict(zip(DRAIN_DELAYS, seen, strict=True)) == {
            case: expected for case, (_, expected) in DRAIN_DELAYS.items()
        }


def machine_with_gpus(tmp_path: Path, uuids: list[str] | None) -> dict[str, str]:
    """The CLI's environment on a machine whose ``nvidia-smi`` lists ``uuids`` (a stand-in
    that answers as the real one does to ``--query-gpu=uuid --format=csv,noheader``), or that
    has no ``nvidia-smi`` at all (None): the GPUs of the machine running the test are not the
    test's to choose."""
    folders = [
        folder
        for folder in os.environ.get("PATH", "").split(os.pathsep)
        if folder and not (Path(folder) / "nvidia-smi").exists()
    ]
    if uuids is not None:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        stand_in = bin_dir / "nvidia-smi"
        stand_in.write_text("#!/bin/sh\n" + "".join(f"echo {uuid}\n" for uuid in uuids))
        stand_in.chmod(0o755)
        folders.insert(0, str(bin_dir))
    env = {name: value for name, value in cli_env().items() if name != "CUDA_VISIBLE_DEVICES"}
    return {**env, "PATH": os.pathsep.join(folders)}


TWO_GPUS = ["GPU-5e1f0c2a-0000-0000-0000-000000000000", "GPU-8f2a77b1-0000-0000-0000-000000000000"]


@pytest.mark.parametrize(
    ("args", "machine", "expected", "said"),
    [
        (
            ["--gpus", "2"],
            TWO_GPUS,
            "0,1",
            "[info] --gpus 2: the model is given CUDA_VISIBLE_DEVICES=0,1, and this machine has "
            "GPUs 0,1",
        ),
        (
            ["--gpus", "2"],
            None,
            "0,1",
            "[warning] --gpus 2: the model is given CUDA_VISIBLE_DEVICES=0,1, but this machine "
            "has no NVIDIA GPU (there is no nvidia-smi on PATH), so it runs without one",
        ),
        (
            ["--gpus", "2"],
            [],
            "0,1",
            "[warning] --gpus 2: the model is given CUDA_VISIBLE_DEVICES=0,1, but this machine "
            "has no NVIDIA GPU (nvidia-smi lists none), so it runs without one",
        ),
        (
            ["--gpus", "device=3,GPU-5e1f"],
            TWO_GPUS,
            "3,GPU-5e1f",
            "[warning] --gpus device=3,GPU-5e1f: the model is given CUDA_VISIBLE_DEVICES="
            "3,GPU-5e1f, but this machine has GPUs 0,1 and no 3, so the model gets fewer GPUs "
            "than asked",
        ),
        (  # Docker's quotes
            ["--gpus", '"device=1"'],
            TWO_GPUS,
            "1",
            "[info] --gpus device=1: the model is given CUDA_VISIBLE_DEVICES=1, and this "
            "machine has GPUs 0,1",
        ),
        (
            ["--gpus", "count=3"],
            TWO_GPUS,
            "0,1,2",
            "[warning] --gpus count=3: the model is given CUDA_VISIBLE_DEVICES=0,1,2, but this "
            "machine has GPUs 0,1 and no 2, so the model gets fewer GPUs than asked",
        ),
        (
            ["--gpus", "all"],
            TWO_GPUS,
            None,
            "[info] --gpus all: the model sees every GPU of this machine, which has GPUs 0,1",
        ),
        (
            ["--gpus", "all"],
            None,
            None,
            "[warning] --gpus all: the model sees every GPU of this machine, but it has no "
            "NVIDIA GPU (there is no nvidia-smi on PATH), so the model runs without one",
        ),
    ],
    ids=[
        "count",
        "count, no GPU",
        "count, none listed",
        "devices, one missing",
        "quoted",
        "count=, one missing",
        "all",
        "all, no GPU",
    ],
)
def test_gpus_with_the_local_engine_are_the_ids_a_container_would_get_of_the_machines_gpus(
    abeja: Abeja,
    project: Project,
    tmp_path: Path,
    args: list[str],
    machine: list[str] | None,
    expected: str | None,
    said: str,
) -> None:
    """The local engine's model runs on this machine: --gpus gives it, through
    CUDA_VISIBLE_DEVICES, the ids Docker would give the container (a count: the first N),
    and they name the machine's own GPUs; what the machine has is said, and a machine with
    fewer GPUs than asked, or none, gets a warning instead of a claim."""
    cwd = project("responder")
    (cwd / "names.json").write_text('["CUDA_VISIBLE_DEVICES"]')
    env = machine_with_gpus(tmp_path, machine)
    result = run_local(abeja, cwd, "-h", "main:variables", "--input", "names.json", *args, env=env)
    assert variables(result) == {"CUDA_VISIBLE_DEVICES": expected}
    assert said in result.stderr.splitlines(), result


def test_gpus_and_cuda_visible_devices_together_are_refused_by_the_local_engine(
    abeja: Abeja, project: Project
) -> None:
    """In a container the variable would pick among the GPUs of --gpus, numbered from 0; on
    this machine it would name others: one of them must go."""
    result = run_local(
        abeja, project("responder"), "-h", "main:variables", "--input", "request.json",
        "--gpus", "device=2,3", "-e", "CUDA_VISIBLE_DEVICES=1",
    )  # fmt: skip
    assert result.returncode == 2, str(result)
    assert result.error_lines() == [
        "[error] --gpus device=2,3 and CUDA_VISIBLE_DEVICES=1 (-e or --env-file) both choose the "
        "model's GPUs; with the local engine give one of them"
    ], str(result)


def test_runtime_limits_as_options(abeja: Abeja, project: Project) -> None:
    seen = run_local(abeja, project("responder"), "-h", "main:environ", "-q",
                     "--input", "request.json", "--timeout", "5",
                     "--max-body-size", "1MiB")  # fmt: skip
    assert {"ABEJA_RUNTIME_TIMEOUT", "ABEJA_RUNTIME_MAX_BODY_SIZE"} <= set(seen.text.split()), seen


@pytest.mark.parametrize(
    ("cancel_raises", "given"),
    [
        (["--cancel-raises", "on"], "on"),
        (["--cancel-raises"], "on"),
        (["--cancel-raises", "off"], "off"),
    ],
    ids=["on", "alone", "off"],
)
def test_batching_and_cancel_raises_as_options(
    abeja: Abeja, project: Project, cancel_raises: list[str], given: str
) -> None:
    """--max-batch-size and --max-batch-wait serve a batched handler lists of requests, as
    the runtime's own flags do, and --cancel-raises takes on or off as the runtime's does
    (alone: on); each reaches the model as the runtime's variable."""
    cwd = project("responder")
    names = [
        "ABEJA_RUNTIME_MAX_BATCH_SIZE",
        "ABEJA_RUNTIME_MAX_BATCH_WAIT",
        "ABEJA_RUNTIME_CANCEL_RAISES",
    ]
    (cwd / "names.json").write_text(json.dumps(names))
    result = run_local(
        abeja, cwd, "-h", "main:batched_variables", "-q", "--input", "names.json",
        *cancel_raises, "--max-batch-size", "8", "--max-batch-wait", "0.005",
    )  # fmt: skip
    assert variables(result) == dict(zip(names, ["8", "0.005", given], strict=True))


@pytest.mark.parametrize(
    "limit",
    [("--max-body-size", "1MiB"), ("-e", "ABEJA_RUNTIME_MAX_BODY_SIZE=1048576")],
    ids=["option", "variable"],
)
def test_a_body_over_the_limit_is_refused_before_it_is_sent(
    abeja: Abeja, project: Project, limit: tuple[str, str]
) -> None:
    """The server would answer 413 and close the connection while the body is still being
    sent, which the sender sees only as "Connection reset by peer": said before, in one line."""
    cwd = project("responder")
    (cwd / "big.bin").write_bytes(b"\0" * (3 * 1024 * 1024 + 1))
    result = run_local(abeja, cwd, "-h", "main:echo", "--input", "big.bin", *limit)
    assert result.returncode == 2, str(result)
    assert result.stderr == (
        "[error] --input big.bin: the request body is 3.0 MiB, over the model server's limit "
        "of 1.0 MiB, so it would be refused (413) before it is sent whole; raise the limit "
        "with --max-body-size 4MiB (0: no limit)\n"
    )
    raised = run_local(abeja, cwd, "-h", "main:echo", "--input", "big.bin", "-q", *limit,
                       "--max-body-size", "4MiB")  # fmt: skip
    assert raised.returncode == 0, str(raised)
    assert len(raised.stdout) == 3 * 1024 * 1024 + 1


def test_a_base_image_the_local_engine_ignores_is_named(abeja: Abeja, project: Project) -> None:
    cwd = project("tax")
    given = run_local(abeja, cwd, "-h", "main:handler", "--input", "request.json",
                      "-i", "python:3.12-slim")  # fmt: skip
    default = run_local(abeja, cwd, "-h", "main:handler", "--input", "request.json")
    assert given.returncode == default.returncode == 0, str(given)
    notice = "[warning] -i python:3.12-slim is not used by the local engine"
    assert notice in given.stderr
    assert "is not used by the local engine" not in default.stderr


REQUIRING = """\
import importlib.metadata

import tinydb  # not installed in the test environment: only the project's requirements have it


def handler(request, context):
    return {"content_type": "application/json",
            "content": {"tinydb": importlib.metadata.version("tinydb")}}
"""


@pytest.mark.parametrize("declared_in", ["requirements.txt", "Pipfile"])
def test_the_projects_requirements_run_in_a_cached_environment(
    abeja: Abeja, tmp_path: Path, declared_in: str
) -> None:
    assert importlib.util.find_spec("tinydb") is None, "the test needs tinydb to be absent here"
    project = tmp_path / "project"
    project.mkdir()
    (project / "main.py").write_text(REQUIRING)
    (project / "request.json").write_text("{}")
    if declared_in == "requirements.txt":
        (project / "requirements.txt").write_text("tinydb==4.8.0\n")
    else:
        (project / "Pipfile").write_text('[packages]\ntinydb = "==4.8.0"\n')
    env = cli_env(ABEJA_RUNTIME_CACHE=str(tmp_path / "cache"))
    args = ("-h", "main:handler", "--input", "request.json")

    first = run_local(abeja, project, *args, env=env)
    assert first.returncode == 0, str(first)
    assert json.loads(first.stdout) == {"tinydb": "4.8.0"}
    assert "[info] installing the project's requirements into " in first.stderr
    again = run_local(abeja, project, *args, env=env)
    assert again.returncode == 0, str(again)
    assert "[info] using the environment with the project's requirements" in again.stderr
    assert importlib.util.find_spec("tinydb") is None  # this Python was left alone


def test_requirements_that_cannot_be_installed_are_one_error(abeja: Abeja, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "main.py").write_text(REQUIRING)
    (project / "request.json").write_text("{}")
    (project / "requirements.txt").write_text("--no-index\nabeja-no-such-package==1.0\n")
    env = cli_env(ABEJA_RUNTIME_CACHE=str(tmp_path / "cache"))
    result = run_local(abeja, project, "-h", "main:handler", "--input", "request.json", env=env)
    assert result.returncode == 1, str(result)
    assert result.error_lines()[0].startswith(
        "[error] installing the project's requirements failed"
    )
    assert "abeja-no-such-package" in result.stderr  # pip's own words follow
    assert not any((tmp_path / "cache" / "venvs").glob("[!.]*")), "a broken environment was kept"


def test_a_long_install_says_what_pip_is_doing(
    start_abeja: Callable[..., CliProcess],
    held_index: Callable[..., HeldIndex],
    project: Project,
    tmp_path: Path,
) -> None:
    """An install that takes long (here a download that the index holds until the progress
    line is seen) names pip's current step, not only the time it has taken."""
    index = held_index()
    cwd = project("tax")
    (cwd / "requirements.txt").write_text(index.requirements("127.0.0.1"))
    cli = start_abeja(
        "model", "run-local", *LOCAL, "-h", "main:handler", "--input", "request.json",
        cwd=cwd, env=cli_env(ABEJA_RUNTIME_CACHE=str(tmp_path / "cache")),
    )  # fmt: skip
    line = cli.wait_for(r"^\[info\] installing the project's requirements\.\.\. \(", timeout=60)
    index.release()
    assert re.fullmatch(
        r"\[info\] installing the project's requirements\.\.\. \(\d+ s; pip: Downloading "
        rf"{re.escape(HELD_WHEEL)} \(.+\)\)",
        line,
    ), line
    assert cli.wait(CLI_TIMEOUT) == 0, cli.output()
    assert json.loads("".join(cli.stdout)) == {"total": 108.0}
    cli.wait_for(r"^\[info\] installed the project's requirements \(\d+\.\d s\)$")


# -- failures -------------------------------------------------------------------------------


def test_a_folder_without_the_handler_is_told_to_init(abeja: Abeja, tmp_path: Path) -> None:
    """Not the runtime's words for the platform's zip/tar packaging: there is no main.py."""
    (tmp_path / "request.json").write_text("{}")
    result = run_local(abeja, tmp_path, "-h", "main:handler", "--input", "request.json")
    assert result.returncode == 2, str(result)
    assert result.stderr == (
        f"[error] there is no main.py in {tmp_path.resolve()} (-h main:handler); run the command "
        "in the folder of your handler, fix -h, or start a project with: abeja model init\n"
    )


def test_import_failure_shows_the_log(abeja: Abeja, project: Project) -> None:
    result = run_local(
        abeja, project("responder"), "-h", "broken:handler", "--input", "request.json"
    )
    assert result.returncode == 1, str(result)
    assert result.stdout == b""
    assert result.error_lines() == [
        "[error] the model server stopped before it was ready (exit code 1); its log says why "
        "(often the handler failed to import)"
    ]
    assert "abeja_test_missing_module" in result.stderr  # the runtime's own error line
    quiet = run_local(
        abeja, project("responder"), "-h", "broken:handler", "--input", "request.json", "-q"
    )
    assert quiet.returncode == 1
    assert (
        quiet.stderr.splitlines()[1] == " ------ Local Server Error ------ "
    )  # shown once, after the error
    assert "abeja_test_missing_module" in quiet.stderr


def test_unreachable_docker_falls_back_to_local(
    abeja: Abeja, project: Project, tmp_path: Path
) -> None:
    env = cli_env(DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock")
    result = abeja(
        "model", "run-local", "-h", "main:handler", "--input", "request.json", "-q",
        cwd=project("tax"), env=env,
    )  # fmt: skip
    assert result.returncode == 0, str(result)
    assert json.loads(result.stdout) == {"total": 108.0}
    assert result.stderr == "", "-q prints the answer only"
    told = abeja("model", "run-local", "-h", "main:handler", "--input", "request.json",
                 cwd=project("tax"), env=env)  # fmt: skip
    assert (
        f"[info] Docker is not reachable at unix://{tmp_path}/no-docker.sock (no such file or "
        "directory); running the model with the local engine instead (--engine local)\n"
    ) in told.stderr
    required = abeja(
        "model", "run-local", "-h", "main:handler", "--input", "sales.csv", "--engine", "docker",
        cwd=project("csv_table"), env=env,
    )  # fmt: skip
    assert required.returncode == 1
    assert required.error_lines() == [
        f"[error] Docker is not reachable at unix://{tmp_path}/no-docker.sock (no such file or "
        "directory); start Docker, or use --engine local to run without it"
    ]


def test_interrupt_stops_the_runtime(
    start_abeja: Callable[..., CliProcess], project: Project
) -> None:
    cwd = project("responder")
    cli = start_abeja(
        "model", "run-local", *LOCAL, "-h", "slow:handler", "--input", "request.json", cwd=cwd
    )
    line = cli.wait_for(r"\[info\] waiting server running : http://127.0.0.1:\d+")
    port = int(line.rsplit(":", 1)[1])
    cli.wait_for(r"\[info\] sending request to model")
    cli.send(signal.SIGINT)
    assert cli.wait(30) == 130
    assert cli.stderr[-1] == "[error] interrupted; nothing was left running"
    assert not _listening(port)
    assert not _runtime_processes(cwd)


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _runtime_processes(cwd: Path) -> list[int]:
    """Processes still running in the project folder (the runtime and its workers)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/cwd") == str(cwd):
                found.append(int(pid))
        except OSError:
            continue
    return found


def test_version(abeja: Abeja, tmp_path: Path) -> None:
    import importlib.metadata

    result = abeja("--version", cwd=tmp_path)
    version = importlib.metadata.version("abeja-runtime")
    assert (result.returncode, result.text) == (0, f"abeja, version {version}\n")


def test_console_script_is_installed() -> None:
    import shutil
    import subprocess

    script = shutil.which("abeja")
    if script is None:
        pytest.skip("the abeja console script is not on PATH (package not installed)")
    proc = subprocess.run([script, "model", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert "run-local" in proc.stdout and "run-local-server" in proc.stdout


def test_v1_flag_selects_the_v1_handler_style(abeja: Abeja, project: Project) -> None:
    cwd = project("responder")
    (cwd / "legacy.py").write_text(
        "def handler(_iter, ctx):\n    for item in _iter:\n        yield {'seen': item}\n"
    )
    result = run_local(abeja, cwd, "-h", "legacy:handler", "--input", "request.json", "--v1")
    assert result.returncode == 0, str(result)
    assert json.loads(result.stdout) == {"seen": {"hello": "world"}}
    assert "with the abeja-v1 style" in result.stderr
    described = run_local(abeja, cwd, "-h", "main:describe", "--input", "request.json", "-q",
                          "--v1", "-e", "ABEJA_RUNTIME_STYLE=abeja")  # fmt: skip
    assert described.returncode == 0, str(described)  # -e wins over --v1


def test_startup_wait_is_bounded(abeja: Abeja, project: Project) -> None:
    cwd = project("responder")
    result = run_local(
        abeja, cwd, "-h", "slow_import:handler", "--input", "request.json", "--startup-timeout", "2"
    )
    # Bounded by its own timeout (what the line says), not by the handler's import; the
    # harness's CLI timeout only stops a hang.
    assert result.returncode == 1, str(result)
    (line,) = result.error_lines()
    assert line.startswith("[error] the model server was not ready after 2 s (it answered 503 on ")
    assert line.endswith("raise --startup-timeout if loading the model takes longer")
    assert not _runtime_processes(cwd)


def test_a_streamed_answer_is_printed_as_it_arrives(
    start_abeja: Callable[..., Any], project: Project, tmp_path: Path
) -> None:
    """The handler's second line is produced only once the test has seen the first on the
    CLI's stdout (issue 29: run-local prints chunks as they arrive)."""
    cwd = project("responder")
    release = tmp_path / "release"
    cli = start_abeja(
        "model", "run-local", *LOCAL, "-h", "main:held_stream", "--input", "request.json",
        "-e", f"RELEASE={release}", cwd=cwd,
    )  # fmt: skip
    cli.wait_for(r"^first$", stream="stdout")
    assert "second" not in cli.stdout
    release.touch()
    assert cli.process.wait(60) == 0, cli.output()
    cli.wait_for(r"^second$", stream="stdout")
    assert cli.stdout[-2:] == ["first", "second"]


def test_the_log_comes_in_the_order_it_was_written(abeja: Abeja, project: Project) -> None:
    """The handler's lines, printed and written on stderr, in its order; its request's access
    record after them and before the server's stop (the front keeps records for a moment, to
    write them in batches, and run-local stops the server as soon as the answer came)."""
    result = run_local(abeja, project("responder"), "-h", "main:chatty", "--input", "request.json")
    assert result.returncode == 0, str(result)
    assert chatty_run(result.stderr) == CHATTY_RUN, str(result)
    assert result.text == "done"
