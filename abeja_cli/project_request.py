"""The request a project is tried with, for the try-it page to open on.

It is the curl line of the project's README (``abeja model init`` writes one that fits its
template, and every sample has one: a JSON file, an image, a CSV table, a multipart form), else
the project's ``request.*`` file, else an empty JSON object. A file the request names is read
only inside the project folder.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Final, Literal

from abeja_cli.init import README_CURL
from abeja_runtime.media import guess_content_type

__all__ = ["FormField", "ProjectRequest", "project_request"]

Kind = Literal["json", "text", "file", "form"]

#: A request file larger than this opens as a file to send, not as text in a text box.
_EDITABLE: Final = 256 * 1024
_JSON: Final = "application/json"
_DATA: Final = frozenset({"-d", "--data", "--data-binary", "--data-ascii", "--data-raw"})


@dataclass(frozen=True, slots=True)
class FormField:
    """A field of a multipart form: text, or a file of the project (``value`` is its name)."""

    name: str
    value: str
    is_file: bool = False


@dataclass(frozen=True, slots=True)
class ProjectRequest:
    """What the page shows first: the kind of body and its content."""

    kind: Kind = "json"
    method: str = "POST"
    path: str = "/"
    content_type: str = _JSON
    #: The body of the json and text kinds.
    text: str = "{}"
    #: The file of the file kind, a name inside the project folder.
    file: str | None = None
    fields: tuple[FormField, ...] = ()
    #: Where the README's curl line writes the answer (``-o``), if it does.
    output: str | None = None
    #: Where it came from, for the page to say.
    source: str = ""

    def files(self) -> frozenset[str]:
        """The project files the page fetches to put this request in place."""
        names = {f.value for f in self.fields if f.is_file}
        return frozenset(names | ({self.file} if self.file else set()))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def project_request(project: Path) -> ProjectRequest:
    """The project's own request: its README's curl line, its request file, or ``{}``."""
    readme = project / "README.md"
    try:
        lines = readme.read_text("utf-8").splitlines() if readme.is_file() else []
    except (OSError, UnicodeDecodeError):
        lines = []
    for line in lines:
        if line.startswith(README_CURL):
            found = _from_curl(project, line.removeprefix(README_CURL))
            if found is not None:
                return found
    for candidate in sorted(project.glob("request*")):
        if candidate.is_file():
            return _from_file(project, candidate.name, guess_content_type(candidate.name))
    return ProjectRequest()


def _from_curl(project: Path, rest: str) -> ProjectRequest | None:
    """The request of a README's curl line (what follows ``curl -s localhost:8080``), or None
    when it names a file that the project does not have or is not a line curl would take."""
    try:
        words = shlex.split(rest)
    except ValueError:
        return None
    path = words.pop(0) if words and words[0].startswith(("/", "?")) else "/"
    line = _CurlLine()
    for option, value in _options(words):
        if not line.take(project, option, value):
            return None
    source = f"the curl line of {project.name}/README.md"
    method, content_type = line.method, line.content_type
    if line.fields:
        return ProjectRequest(
            "form", method or "POST", path, fields=tuple(line.fields), source=source
        )
    if line.body_file is not None:
        if _project_file(project, line.body_file) is None:
            return None
        found = _from_file(
            project, line.body_file, content_type or guess_content_type(line.body_file)
        )
        return replace(found, method=method or "POST", path=path, output=line.output, source=source)
    if line.body is None:
        return ProjectRequest(method=method or "GET", path=path, source=source)
    kind: Kind = "json" if _is_json(content_type or _JSON) else "text"
    return ProjectRequest(
        kind,
        method or "POST",
        path,
        content_type or _JSON,
        line.body,
        output=line.output,
        source=source,
    )


@dataclass
class _CurlLine:
    """What a curl line's options say about its request."""

    method: str | None = None
    content_type: str | None = None
    output: str | None = None
    body: str | None = None
    body_file: str | None = None
    fields: list[FormField] = field(default_factory=list)

    def take(self, project: Path, option: str, value: str) -> bool:
        """Note one option; ``False`` for a form field naming a file the project lacks."""
        if option in ("-X", "--request"):
            self.method = value.upper()
        elif option in ("-H", "--header"):
            name, _, given = value.partition(":")
            if name.strip().lower() == "content-type":
                self.content_type = given.strip()
        elif option in _DATA and option != "--data-raw" and value.startswith("@"):
            self.body, self.body_file = None, value[1:]
        elif option in _DATA:
            self.body, self.body_file = value, None
        elif option in ("-F", "--form", "--form-string"):
            name, _, given = value.partition("=")
            if option == "--form-string" or not given.startswith("@"):
                self.fields.append(FormField(name, given))
                return True
            file_name = given[1:].split(";", 1)[0].strip('"')
            self.fields.append(FormField(name, file_name, is_file=True))
            return _project_file(project, file_name) is not None
        elif option in ("-o", "--output"):
            self.output = value
        return True


def _options(words: list[str]) -> Iterator[tuple[str, str]]:
    """(option, value) pairs of curl's options that take a value; others are skipped."""
    taking = {"-X", "--request", "-H", "--header", "-F", "--form", "--form-string", "-o"}
    taking |= {"--output"} | _DATA
    index = 0
    while index < len(words):
        word = words[index]
        if word in taking and index + 1 < len(words):
            yield word, words[index + 1]
            index += 2
        else:
            index += 1


def _project_file(project: Path, name: str) -> Path | None:
    """``name`` as a file inside the project folder, or None."""
    root = project.resolve()
    path = (root / name).resolve()
    return path if path.is_relative_to(root) and path.is_file() else None


def _from_file(project: Path, name: str, content_type: str) -> ProjectRequest:
    """A request file: JSON or text to edit in the page when it is small UTF-8, else a file."""
    source = f"{name} of {project.name}"
    path = _project_file(project, name)
    media = content_type.partition(";")[0].strip().lower()
    textual = _is_json(media) or media.startswith("text/") or media.endswith(("+xml", "/xml"))
    if path is not None and textual and path.stat().st_size <= _EDITABLE:
        try:
            text = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError):
            pass
        else:
            kind: Kind = "json" if _is_json(media) else "text"
            return ProjectRequest(kind, content_type=content_type, text=text, source=source)
    return ProjectRequest("file", content_type=content_type, file=name, source=source)


def _is_json(media: str) -> bool:
    media = media.partition(";")[0].strip().lower()
    return media == _JSON or media.endswith("+json")
