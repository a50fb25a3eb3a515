"""Finding, importing and calling the user's handler (issue point 3; contract A4 / Part B 4).

Every scenario is a real folder under ``tests/handlers`` (``ld_*``), or a tree built in tmp_path
from a copy of one, served by a real runtime process.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from helpers.servers import HANDLERS, RunningServer
from helpers.waiting import wait_until

EXIT_TIMEOUT = 20.0


def exit_code(server: RunningServer) -> int:
    """Wait for the runtime to exit and for its last log line to be read."""
    return server.wait_exit(EXIT_TIMEOUT)


def load_failure(server: RunningServer) -> str:
    """Wait for a runtime that cannot load its handler to exit; return its one error message."""
    code = exit_code(server)
    assert code != 0, f"a load failure must exit non-zero: {server.lines}"
    failures = [
        record
        for record in server.records()
        if str(record.get("message", "")).startswith("failed to setup model: ")
    ]
    assert len(failures) == 1, f"expected one 'failed to setup model' record: {server.lines}"
    assert failures[0]["log_level"] == "error"
    return failures[0]["message"].removeprefix("failed to setup model: ")


def output(server: RunningServer) -> str:
    exit_code(server)
    return "\n".join(server.lines)


def copy_handler(name: str, destination: Path) -> Path:
    shutil.copytree(HANDLERS / name, destination, dirs_exist_ok=True)
    return destination


# --- handler kinds -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("folder", "kind"),
    [
        ("ld_sync", "sync"),
        ("ld_async", "async"),
        ("ld_callable", "callable"),
        ("ld_async_callable", "async-callable"),
    ],
)
def test_sync_async_and_callable_handlers_all_serve(make_server, folder, kind):
    server = make_server(folder)
    for _ in range(2):
        answer = server.request("GET", "/")
        assert answer.status == 200, answer.body
        assert answer.json() == {"kind": kind}


# --- HANDLER -------------------------------------------------------------------------------------


def test_handler_defaults_to_main_handler(make_server):
    server = make_server("mn_probe")
    assert server.request("GET", "/").json()["which"] == "handler"


def test_handler_env_names_module_and_function(make_server):
    server = make_server("mn_probe", env={"HANDLER": "main:other"})
    assert server.request("GET", "/").json()["which"] == "other"


@pytest.mark.parametrize("spec", ["main", "main:handler:extra", ":handler", "main:"])
def test_bad_handler_format_exits_with_the_contract_message(make_server, spec):
    server = make_server("ld_sync", env={"HANDLER": spec}, wait=False)
    text = output(server)
    assert server.process.returncode != 0
    assert f"HANDLER[{spec}]" in text, text
    assert "handler needs one ':' separator" in text, text
    assert "The format is <module>:<function>" in text, text


def test_missing_module_names_module_and_handler(make_server):
    server = make_server("ld_sync", env={"HANDLER": "nosuchmodule:handler"}, wait=False)
    message = load_failure(server)
    assert message.startswith(
        "Couldn't import a module named [nosuchmodule] specified in "
        "HANDLER[nosuchmodule:handler]. Possibly, your HANDLER parameter or packaging "
        "(zip/tar) file structure is wrong."
    ), message


def test_missing_function_lists_what_the_module_defines(make_server):
    server = make_server("ld_missing_function", wait=False)
    message = load_failure(server)
    assert message.startswith(
        "Couldn't import a function named [handler] specified in HANDLER[main:handler]."
    ), message
    assert "handler_v2, preprocess" in message
    for not_defined_here in ("dumps", "_private_helper", "Model"):
        assert not_defined_here not in message


@pytest.mark.parametrize(
    ("folder", "module"),
    [("ld_import_error", "main"), ("ld_import_error_prefix", "abeja_missing_dependency_model")],
    ids=["main", "module-name-starts-with-the-package"],
)
def test_import_error_inside_the_module_names_the_missing_package(make_server, folder, module):
    server = make_server(folder, env={"HANDLER": f"{module}:handler"}, wait=False)
    message = load_failure(server)
    assert "No module named 'abeja_missing_dependency'" in message, message
    # The module named in HANDLER exists: the message must not say that it could not be found.
    assert f"Couldn't import a module named [{module}]" not in message, message
    assert message.endswith("Add the missing package to requirements.txt."), message  # none yet


#: How requirements.txt is installed, as the advice about a missing package says it.
INSTALL = (
    "pip install -r requirements.txt, or start the runtime with --install-requirements "
    "(ABEJA_RUNTIME_INSTALL_REQUIREMENTS=on), which installs requirements.txt at every start"
)


@pytest.mark.parametrize(
    ("imported", "requirements", "flags", "advice"),
    [
        pytest.param(
            "abeja_missing_dependency",
            "numpy>=1.0\nAbeja.Missing-Dependency==1.0  # the model's\n",
            (),
            "The package Abeja.Missing-Dependency is listed in requirements.txt but is not "
            f"installed: install it with {INSTALL}.",
            id="listed",
        ),
        pytest.param(
            "abeja_missing_dependency",
            "numpy>=1.0\n",
            (),
            "requirements.txt lists no package named abeja_missing_dependency: add the package "
            f"that provides it, and install requirements.txt with {INSTALL}. If it is listed "
            "under another name (as Pillow provides PIL), only the install is missing.",
            id="not-listed",
        ),
        pytest.param(  # pytest is installed here: the install at start has nothing to fetch
            "abeja_missing_dependency",
            "pytest\n",
            ("--install-requirements",),
            "requirements.txt lists no package named abeja_missing_dependency: add the package "
            "that provides it (its name may differ from the module's, as Pillow provides PIL); "
            "--install-requirements installs it at the next start.",
            id="not-listed-installed-at-start",
        ),
        pytest.param(  # installed here too, and its module is google.protobuf
            "protobuf",
            "protobuf\n",
            ("--install-requirements",),
            "requirements.txt lists protobuf, which was installed at start "
            "(--install-requirements), yet no module named protobuf is there: check that "
            "protobuf is the package that provides it.",
            id="listed-installed-at-start",
        ),
    ],
)
def test_a_missing_package_is_advised_from_what_requirements_txt_lists(
    make_server, tmp_path, imported, requirements, flags, advice
):
    project = tmp_path / "project"
    project.mkdir()
    (project / "main.py").write_text(
        f"import {imported}\n\n\ndef handler(request, context):\n    return {{}}\n"
    )
    (project / "requirements.txt").write_text(requirements)
    message = load_failure(make_server(project, *flags, wait=False))
    assert message == (
        "Importing the module [main] specified in HANDLER[main:handler] failed: "
        f"No module named '{imported}'. {advice}"
    )


def test_syntax_error_in_the_module_is_reported(make_server, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "main.py").write_text("def handler(request, context)\n    return {}\n")
    message = load_failure(make_server(project, wait=False))
    assert "HANDLER[main:handler]" in message
    assert "SyntaxError" in message
    assert "main.py, line 1" in message, message


def test_exception_at_import_is_reported(make_server):
    server = make_server("ld_raises_at_import", wait=False)
    message = load_failure(server)
    assert "HANDLER[main:handler]" in message
    assert "RuntimeError: weights file model.bin is missing" in message, message
    # The traceback shows the user's frames only: no runtime or import machinery frames.
    (record,) = (r for r in server.records() if "traceback" in r)
    frames = re.findall(r'File "([^"]+)"', record["traceback"])
    assert frames == [str(HANDLERS / "ld_raises_at_import" / "main.py")], record["traceback"]


def test_non_callable_handler_is_reported(make_server):
    message = load_failure(make_server("ld_not_callable", wait=False))
    assert "HANDLER[main:handler]" in message
    assert "str" in message
    assert "function" in message, message


def test_load_failure_keeps_the_health_check_unavailable_until_exit(make_server):
    server = make_server("ld_raises_at_import", wait=False)
    seen = []

    def exited() -> bool:
        seen.append(server.health())
        return server.process.poll() is not None

    wait_until(exited, EXIT_TIMEOUT, "the runtime to exit")
    assert 200 not in seen, seen


# --- working directory: ABEJA_USER_MODEL_ROOT and .abeja -----------------------------------------


def marker_tree(root: Path, depth: int, marker_is_file: bool = False) -> Path:
    """A project at ``root`` and another ``depth`` levels below, next to a ``.abeja`` entry."""
    copy_handler("ld_whoami", root)
    deep = root.joinpath(*[f"level{level}" for level in range(1, depth + 1)])
    copy_handler("ld_whoami", deep)
    if marker_is_file:
        (deep / ".abeja").write_text("not a directory")
    else:
        (deep / ".abeja").mkdir()
    return deep


@pytest.mark.parametrize("depth", [0, 1, 2, 3])
def test_abeja_directory_up_to_three_levels_down_sets_the_working_dir(make_server, tmp_path, depth):
    root = tmp_path / "project"
    deep = marker_tree(root, depth)
    answer = make_server(root).request("GET", "/").json()
    assert answer["cwd"] == str(deep.resolve())
    assert answer["file"] == str((deep / "main.py").resolve())


def test_abeja_directory_four_levels_down_is_not_found(make_server, tmp_path):
    root = tmp_path / "project"
    marker_tree(root, 4)
    answer = make_server(root).request("GET", "/").json()
    assert answer["cwd"] == str(root.resolve())
    assert answer["file"] == str((root / "main.py").resolve())


def test_a_file_named_abeja_is_ignored(make_server, tmp_path):
    root = tmp_path / "project"
    marker_tree(root, 1, marker_is_file=True)
    answer = make_server(root).request("GET", "/").json()
    assert answer["cwd"] == str(root.resolve())


def test_the_shallowest_abeja_directory_wins(make_server, tmp_path):
    root = tmp_path / "project"
    deep = marker_tree(root, 3)
    shallow = deep.parent.parent
    copy_handler("ld_whoami", shallow)
    (shallow / ".abeja").mkdir()
    answer = make_server(root).request("GET", "/").json()
    assert answer["cwd"] == str(shallow.resolve())


def test_relative_user_model_root_is_below_the_start_directory(make_server, tmp_path):
    start = tmp_path / "start"
    code = copy_handler("ld_whoami", start / "code")
    server = make_server(start, env={"ABEJA_USER_MODEL_ROOT": "code"})
    answer = server.request("GET", "/").json()
    assert answer["cwd"] == str(code.resolve())
    assert answer["training_result_dir"] == str(code.resolve() / "abejainc_training_result")


def test_absolute_user_model_root(make_server, tmp_path):
    start = tmp_path / "start"
    start.mkdir()
    code = copy_handler("ld_whoami", tmp_path / "elsewhere" / "code")
    server = make_server(start, env={"ABEJA_USER_MODEL_ROOT": str(code)})
    assert server.request("GET", "/").json()["cwd"] == str(code.resolve())


def test_abeja_search_starts_at_the_user_model_root(make_server, tmp_path):
    start = tmp_path / "start"
    deep = marker_tree(start / "code", 2)
    server = make_server(start, env={"ABEJA_USER_MODEL_ROOT": "code"})
    assert server.request("GET", "/").json()["cwd"] == str(deep.resolve())


# --- ABEJA_TRAINING_RESULT_DIR -------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", [None, "results/v1", "ABSOLUTE"], ids=["unset", "relative", "absolute"]
)
def test_training_result_dir_is_absolute_in_the_handler_environment(make_server, tmp_path, value):
    workdir = (HANDLERS / "ld_whoami").resolve()
    env = {}
    if value == "ABSOLUTE":
        value = str(tmp_path / "trained")
        expected = value
    elif value is None:
        expected = str(workdir / "abejainc_training_result")
    else:
        expected = str(workdir / value)
    if value is not None:
        env["ABEJA_TRAINING_RESULT_DIR"] = value
    answer = make_server("ld_whoami", env=env).request("GET", "/").json()
    assert answer["training_result_dir"] == expected


# --- CONTEXT -------------------------------------------------------------------------------------


def test_context_is_passed_to_the_handler(make_server):
    server = make_server("ld_whoami", env={"CONTEXT": '{"model": "v1", "labels": ["cat"]}'})
    assert server.request("GET", "/").json()["context"] == {"model": "v1", "labels": ["cat"]}


def test_context_defaults_to_an_empty_dict(make_server):
    assert make_server("ld_whoami").request("GET", "/").json()["context"] == {}


def test_a_handler_mutating_context_does_not_leak_into_the_next_call(make_server):
    server = make_server("ld_context", env={"CONTEXT": '{"model": "v1"}'})
    expected = {"model": "mutated-by-handler", "calls": ["called"]}
    for _ in range(3):
        assert server.request("GET", "/").json() == expected


@pytest.mark.parametrize("context", ["{not json", '["a", "list"]'], ids=["invalid", "not-object"])
def test_bad_context_exits_non_zero_with_a_clear_message(make_server, context):
    server = make_server("ld_whoami", env={"CONTEXT": context}, wait=False)
    text = output(server)
    assert server.process.returncode != 0
    assert "CONTEXT" in text, text
    assert "JSON" in text, text
    assert "Traceback" not in text, text


# --- .env ----------------------------------------------------------------------------------------


def test_dotenv_in_the_working_directory_sets_unset_variables(make_server):
    answer = make_server("ld_dotenv").request("GET", "/").json()
    assert answer == {"handler": "from_dotenv", "greeting": "from-dotenv"}


def test_dotenv_does_not_override_set_variables(make_server):
    env = {"HANDLER": "main:handler", "GREETING": "from-environment"}
    answer = make_server("ld_dotenv", env=env).request("GET", "/").json()
    assert answer == {"handler": "handler", "greeting": "from-environment"}


# --- HANDLER in the handler's environment ---------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "env", "expected"),
    [
        (("--handler", "main:handler"), {}, "main:handler"),
        ((), {"HANDLER": "main:handler"}, "main:handler"),
        ((), {}, "main:handler"),  # the default
    ],
    ids=["flag", "variable", "default"],
)
def test_the_handler_finds_handler_in_its_environment(make_server, tmp_path, flags, env, expected):
    """ABEJA's handler page lists HANDLER among the variables a handler may read: it is there
    however the handler was named (issue 28 point 12)."""
    code = copy_handler("ld_whoami", tmp_path / "code")
    server = make_server(code, *flags, env=env)
    assert server.request("GET", "/").json()["handler"] == expected
