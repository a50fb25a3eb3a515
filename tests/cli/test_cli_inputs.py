"""``abeja_cli.inputs`` and ``abeja_cli.environment``: parsing and validation, in-process."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from multipart import MultipartParser

from abeja_cli.environment import DEFAULTS, model_environment, parse_env_option
from abeja_cli.errors import InputError
from abeja_cli.inputs import build_request
from abeja_runtime.media import guess_content_type


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "request.json").write_text('{"a": "é"}', "utf-8")
    (tmp_path / "bad.json").write_text('{"a": ', "utf-8")
    (tmp_path / "cat.jpg").write_bytes(b"\xff\xd8\xff\xe0binary\x00\n")
    (tmp_path / "data.csv").write_text("a,b\n1,2\n", "utf-8")
    (tmp_path / "blob.xyz").write_bytes(b"\x00\x01")
    (tmp_path / "q.txt").write_text("?a=1&b=%E3%81%82\n", "utf-8")
    (tmp_path / "folder").mkdir()
    return tmp_path


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("request.json", "application/json"),
        ("cat.jpg", "image/jpeg"),
        ("cat.JPEG", "image/jpeg"),
        ("photo.png", "image/png"),
        ("data.csv", "text/csv"),
        ("notes.txt", "text/plain"),
        ("lines.jsonl", "application/x-ndjson"),
        ("blob.xyz", "application/octet-stream"),
        ("no_extension", "application/octet-stream"),
    ],
)
def test_content_type_comes_from_the_extension(name: str, expected: str) -> None:
    assert guess_content_type(name) == expected


def test_a_body_file_is_sent_unchanged(files: Path) -> None:
    request = build_request(["request.json"], base_dir=files)
    assert (request.method, request.content_type, request.target) == (
        "POST",
        "application/json",
        "/",
    )
    assert request.body == (files / "request.json").read_bytes()  # not re-serialised
    assert request.headers == {"Content-Type": "application/json", "Content-Length": "11"}


def test_binary_file_and_content_type_override(files: Path) -> None:
    request = build_request(
        ["cat.jpg"], method="put", content_type="image/x-custom", base_dir=files
    )
    assert (request.method, request.content_type) == ("PUT", "image/x-custom")
    assert request.body == b"\xff\xd8\xff\xe0binary\x00\n"


def test_content_type_override_skips_the_json_check(files: Path) -> None:
    request = build_request(["bad.json"], content_type="text/plain", base_dir=files)
    assert request.body == b'{"a": '


def test_stdin_is_read_for_dash(files: Path) -> None:
    request = build_request(["-"], base_dir=files, stdin=io.BytesIO(b"raw"))
    assert (request.body, request.content_type) == (b"raw", "application/octet-stream")


def test_multipart_fields_and_files(files: Path) -> None:
    request = build_request(
        ["title=Q3 report", "doc=@cat.jpg", "meta=@request.json;type=text/plain"],
        base_dir=files,
    )
    assert request.content_type is not None
    ctype, _, boundary = request.content_type.partition("; boundary=")
    assert ctype == "multipart/form-data"
    parts = list(MultipartParser(io.BytesIO(request.body), boundary))
    assert [(p.name, p.filename, p.content_type) for p in parts] == [
        ("title", None, "text/plain"),  # the parser's default for a part without a type
        ("doc", "cat.jpg", "image/jpeg"),
        ("meta", "request.json", "text/plain"),
    ]
    assert parts[0].value == "Q3 report"
    assert parts[1].raw == b"\xff\xd8\xff\xe0binary\x00\n"
    for part in parts:
        part.close()


def test_get_sends_fields_as_query(files: Path) -> None:
    request = build_request(["a=1", "b=x y", "c=あ"], method="GET", base_dir=files)
    assert (request.body, request.content_type) == (b"", None)
    assert request.target == "/?a=1&b=x+y&c=%E3%81%82"


def test_get_sends_a_file_as_raw_query(files: Path) -> None:
    request = build_request(["q.txt"], method="GET", base_dir=files)
    assert request.target == "/?a=1&b=%E3%81%82"


def test_path(files: Path) -> None:
    assert build_request(["request.json"], path="/v1/models/m:predict", base_dir=files).target == (
        "/v1/models/m:predict"
    )
    get = build_request(["a=1"], method="GET", path="/x/é", base_dir=files)
    assert get.target == "/x/%C3%A9?a=1"
    with pytest.raises(InputError, match="must start with /"):
        build_request(["request.json"], path="v1", base_dir=files)


def test_get_and_delete_need_no_input(files: Path) -> None:
    assert build_request([], method="GET", base_dir=files).target == "/"
    assert build_request([], method="DELETE", base_dir=files).body == b""


def test_an_existing_file_with_equals_sign_is_a_body(files: Path) -> None:
    (files / "a=b.json").write_text("[1]", "utf-8")
    request = build_request(["a=b.json"], base_dir=files)
    assert (request.body, request.content_type) == (b"[1]", "application/json")


@pytest.mark.parametrize(
    ("inputs", "kwargs", "message"),
    [
        (["missing.json"], {}, "input file not found: missing.json"),
        (["folder"], {}, "input file folder is a directory"),
        (["bad.json"], {}, "input file bad.json is not valid JSON (Expecting value: line 1"),
        (["f=@bad.json"], {}, "input file bad.json is not valid JSON"),
        (["f=@missing.png"], {}, "input file not found: missing.png"),
        ([], {}, "missing --input"),
        (["request.json", "cat.jpg"], {}, "only one body file can be sent, got 2"),
        (["request.json", "a=1"], {}, "is a body file but other inputs are form fields"),
        (["a=@cat.jpg"], {"method": "GET"}, "a GET request sends a query string"),
        (["request.json"], {"content_type": "json"}, "is not a media type"),
        (["a=1"], {"content_type": "text/plain"}, "cannot be used with NAME=VALUE"),
        (["a=@"], {}, "no file name after '@'"),
        (["request.json"], {"method": "HEAD"}, "unsupported --method HEAD"),
    ],
)
def test_input_errors_are_one_line(
    files: Path, inputs: list[str], kwargs: dict[str, str], message: str
) -> None:
    with pytest.raises(InputError) as info:
        build_request(inputs, base_dir=files, **kwargs)
    assert message in info.value.message
    assert "\n" not in info.value.message
    assert info.value.exit_code == 2


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read a file without read permission")
def test_unreadable_file(files: Path) -> None:
    (files / "cat.jpg").chmod(0)
    with pytest.raises(InputError, match=r"cannot read input file cat\.jpg: permission denied"):
        build_request(["cat.jpg"], base_dir=files)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("KEY=value", ("KEY", "value")),
        ("KEY:value", ("KEY", "value")),
        ("URL=http://x:80/a", ("URL", "http://x:80/a")),
        ("PAIR:a=b", ("PAIR", "a=b")),
        ("EMPTY=", ("EMPTY", "")),
        ("_x1:", ("_x1", "")),
    ],
)
def test_env_option_forms(value: str, expected: tuple[str, str]) -> None:
    assert parse_env_option(value) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("NOVALUE", "has no value; write -e KEY=VALUE"),
        ("1BAD=x", "'1BAD' is not a valid variable name"),
        ("=x", "'' is not a valid variable name"),
        ("A-B=x", "'A-B' is not a valid variable name"),
    ],
)
def test_env_option_errors(value: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_env_option(value)


def test_environment_precedence(tmp_path: Path) -> None:
    env_file = tmp_path / "model.env"
    env_file.write_text("A=file\nB=file\nHANDLER=ignored\n# comment\nQ='quoted value'\n")
    env = model_environment(
        handler="main:handler",
        env_options=["B=option", "ABEJA_ORGANIZATION_ID=from-e"],
        env_file=env_file,
        organization_id="from-o",
    )
    assert env == {
        **DEFAULTS,
        "A": "file",
        "B": "option",
        "Q": "quoted value",
        "HANDLER": "main:handler",
        "ABEJA_ORGANIZATION_ID": "from-o",
        "ABEJA_RUNTIME_LOG_FORMAT": "json",  # the CLI reads the server's log
    }
    assert env["ABEJA_TRAINING_RESULT_DIR"] == "abejainc_training_result"


def test_env_file_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        model_environment(handler="m:f", env_file=tmp_path / "nope.env")
    (tmp_path / "bare.env").write_text("JUSTNAME\n")
    with pytest.raises(InputError, match="JUSTNAME has no value"):
        model_environment(handler="m:f", env_file=tmp_path / "bare.env")
