"""The style samples run with ``abeja model run-local``, exactly as their README says.

Each sample is copied to a fresh folder and its README command is run by the real CLI with the
local engine (``--engine local -q`` added: no Docker, only the answer on stdout).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
CLI_TIMEOUT = 120.0

EXPECTED = {
    "abeja_v1_classifier": lambda answer: (
        [r["label"] for r in answer["result"]] == ["bright", "dark"]
    ),
    "cortex_iris": lambda answer: answer == "iris-setosa",
    "kserve_custom": lambda answer: len(answer["predictions"]) == 5,
    "seldon_identity": lambda answer: (
        answer == {"data": {"names": ["t:0", "t:1", "t:2"], "ndarray": [[1, 2, 3]]}, "meta": {}}
    ),
}


def readme_command(sample: Path) -> list[str]:
    """The sample README's run-local command (its first line that starts with one)."""
    lines = (sample / "README.md").read_text("utf-8").splitlines()
    command = next(line for line in lines if line.startswith("abeja model run-local "))
    return shlex.split(command)[1:]


def run_local(folder: Path, args: list[str]) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ABEJA_", "HANDLER", "PORT"))}
    return subprocess.run(
        [sys.executable, "-m", "abeja_cli", *args, "--engine", "local", "-q"],
        cwd=folder,
        env=env,
        capture_output=True,
        timeout=CLI_TIMEOUT,
        check=False,
    )


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_style_sample_runs_with_run_local(tmp_path, name):
    if name == "kserve_custom":
        pytest.importorskip("kserve")
    folder = shutil.copytree(SAMPLES / name, tmp_path / name)
    result = run_local(folder, readme_command(folder))
    assert result.returncode == 0, result.stderr.decode()
    answer = json.loads(result.stdout)
    assert EXPECTED[name](answer), answer


def test_the_kserve_sample_answers_v2_requests_too(tmp_path):
    pytest.importorskip("kserve")
    folder = shutil.copytree(SAMPLES / "kserve_custom", tmp_path / "kserve_custom")
    args = readme_command(folder)
    args[args.index("--input") + 1] = "v2_request.json"
    result = run_local(folder, args)
    assert result.returncode == 0, result.stderr.decode()
    (output,) = json.loads(result.stdout)["outputs"]
    assert (output["name"], output["shape"]) == ("output-0", [1, 5])


def test_the_cortex_sample_model_is_what_build_model_makes(tmp_path):
    pytest.importorskip("onnx")
    subprocess.run(
        [sys.executable, str(SAMPLES / "cortex_iris" / "build_model.py"), "rebuilt.onnx"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        timeout=CLI_TIMEOUT,
    )
    rebuilt = (tmp_path / "rebuilt.onnx").read_bytes()
    assert rebuilt == (SAMPLES / "cortex_iris" / "iris.onnx").read_bytes()


def test_run_local_v1_flag_serves_a_v1_handler_that_returns_a_list(tmp_path):
    (tmp_path / "main.py").write_text(
        "def handler(_iter, ctx):\n    return [{'inputs': len(list(_iter))}]\n"
    )
    (tmp_path / "request.json").write_text('{"a": 1}')
    args = ["model", "run-local", "-h", "main:handler", "--input", "request.json"]
    result = run_local(tmp_path, [*args, "--v1"])
    assert result.returncode == 0, result.stderr.decode()
    assert json.loads(result.stdout) == {"inputs": 1}


def test_run_local_path_reaches_the_kserve_and_seldon_routes(tmp_path):
    pytest.importorskip("kserve")
    kserve = shutil.copytree(SAMPLES / "kserve_custom", tmp_path / "kserve_custom")
    args = ["model", "run-local", "-h", "main:handler", "--input", "v2_request.json"]
    result = run_local(kserve, [*args, "--path", "/v2/models/model/infer"])
    assert result.returncode == 0, result.stderr.decode()
    assert json.loads(result.stdout)["model_name"] == "model"
    seldon = shutil.copytree(SAMPLES / "seldon_identity", tmp_path / "seldon_identity")
    args = ["model", "run-local", "-h", "main:handler", "--input", "request.json"]
    result = run_local(seldon, [*args, "--path", "/api/v1.0/predictions"])
    assert result.returncode == 0, result.stderr.decode()
    assert json.loads(result.stdout)["data"]["ndarray"] == [[1, 2, 3]]
