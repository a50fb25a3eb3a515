"""``project_request``: what the try-it page opens on, for every sample and template, and the
fallbacks (a request file, ``{}``) when a README has no usable curl line."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from helpers.cli import SAMPLES, run_abeja

from abeja_cli.init import TEMPLATES
from abeja_cli.project_request import FormField, ProjectRequest, project_request

#: sample: (kind, method, path, content type, file, form fields, -o)
OPENS_ON = {
    "abeja_v1_classifier": ("file", "/", "image/jpeg", "cat.jpg", (), None),
    "cortex_iris": ("json", "/", "application/json", None, (), None),
    "csv_table": ("text", "/", "text/csv", None, (), None),
    "image_flip": ("file", "/", "image/jpeg", "cat.jpg", (), "flipped_cat.jpg"),
    "kserve_custom": ("json", "/v1/models/model:predict", "application/json", None, (), None),
    "multipart_form": (
        "form", "/", "application/json", None,
        (FormField("title", "Q3"), FormField("author", "abeja"),
         FormField("document", "report.txt", is_file=True)),
        None,
    ),
    "numpy_classifier": ("json", "/", "application/json", None, (), None),
    "seldon_identity": ("json", "/api/v1.0/predictions", "application/json", None, (), None),
    "tax": ("json", "/", "application/json", None, (), None),
}  # fmt: skip


def test_every_sample_is_in_the_table() -> None:
    assert sorted(p.name for p in SAMPLES.iterdir() if p.is_dir()) == sorted(OPENS_ON)


@pytest.mark.parametrize("sample", sorted(OPENS_ON))
def test_a_sample_opens_on_its_readme_curl_line(sample: str) -> None:
    kind, path, content_type, file, fields, output = OPENS_ON[sample]
    found = project_request(SAMPLES / sample)
    assert (found.kind, found.method, found.path, found.content_type) == (
        kind, "POST", path, content_type,
    )  # fmt: skip
    assert (found.file, found.fields, found.output) == (file, fields, output)
    assert found.source == f"the curl line of {sample}/README.md"
    if kind in ("json", "text"):  # the file's text, to edit in the page
        name = {"csv_table": "sales.csv"}.get(sample, "request.json")
        assert found.text == (SAMPLES / sample / name).read_text()


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_a_template_opens_on_its_request_file(tmp_path: Path, template: str) -> None:
    """What ``abeja model init`` writes: the README's line names the template's request file."""
    made = run_abeja("model", "init", "made", "--template", template, cwd=tmp_path)
    assert made.returncode == 0, str(made)
    found = project_request(tmp_path / "made")
    request_file = TEMPLATES[template].request
    assert found.source == "the curl line of made/README.md"
    if found.kind == "file":
        assert found.file == request_file
    elif found.kind == "form":
        assert FormField("document", request_file, is_file=True) in found.fields
    else:
        assert found.text == (tmp_path / "made" / request_file).read_text()
    assert found.files() <= {request_file}


def test_without_a_readme_the_request_file(tmp_path: Path) -> None:
    shutil.copy(SAMPLES / "image_flip" / "cat.jpg", tmp_path / "request.jpg")
    assert project_request(tmp_path) == ProjectRequest(
        "file",
        content_type="image/jpeg",
        file="request.jpg",
        source=f"request.jpg of {tmp_path.name}",
    )


def test_a_readme_naming_a_file_outside_the_project_is_not_followed(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (tmp_path / "secret.json").write_text('{"secret": 1}')
    (project / "README.md").write_text(
        "curl -s localhost:8080 -H 'Content-Type: application/json' --data-binary @../secret.json\n"
    )
    assert project_request(project) == ProjectRequest()


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("""-d '{"a": 1}'""", ProjectRequest(text='{"a": 1}')),
        (
            "-X PUT -H 'Content-Type: text/plain' --data-binary 'hello there'",
            ProjectRequest("text", "PUT", content_type="text/plain", text="hello there"),
        ),
        ("/health", ProjectRequest(method="GET", path="/health")),  # no body: a GET
        ("-d '{", None),  # not a line a shell takes: the default, ``{}``
    ],
    ids=["inline-json", "inline-text", "get", "bad-quoting"],
)
def test_other_curl_lines(tmp_path: Path, line: str, expected: ProjectRequest | None) -> None:
    rest = line if line.startswith("/") else " " + line
    (tmp_path / "README.md").write_text(f"curl -s localhost:8080{rest}\n")
    if expected is not None:
        expected = replace(expected, source=f"the curl line of {tmp_path.name}/README.md")
    assert project_request(tmp_path) == (expected or ProjectRequest())
