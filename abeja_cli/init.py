"""``abeja model init``: a working project to start from, in the current folder or a new one.

Each template (``abeja_cli/templates/<name>/``) is a ``main.py``, its ``requirements.txt`` and a
request file; this module adds a README with the three commands a newcomer needs (run-local,
run-local-server, curl) and a ``.dockerignore``. Existing files are never overwritten.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import click

from abeja_cli.base_image import DEFAULT_IMAGE, DOTENV, IMAGE_VARIABLE
from abeja_cli.console import Console
from abeja_cli.errors import InputError
from abeja_cli.session import reported

__all__ = ["README_CURL", "TEMPLATES", "init"]

#: How the README's curl line starts (run-local-server's banner shows that line, on its URL).
README_CURL: Final = "curl -s localhost:8080"
_TEMPLATES_DIR: Final = Path(__file__).resolve().parent / "templates"


@dataclass(frozen=True)
class Template:
    title: str
    request: str  # the request file in the template
    run_input: str  # run-local's input options
    curl_body: str  # curl's options after the URL
    handler: str = "main:handler"  # what -h names
    path: str = ""  # the URL's path in the curl line
    more: str = ""  # a paragraph of the README on what the template serves

    def readme(self, name: str) -> str:
        return f"""# {name}

{self.title} Made by `abeja model init`; `main.py` is yours to change.

Send it one request:

```sh
abeja model run-local -h {self.handler} {self.run_input}
```

Serve it until Ctrl+C, and send requests with curl:

```sh
abeja model run-local-server -h {self.handler} -p 8080
{README_CURL}{self.path} {self.curl_body}
```
{self.more}
Packages the model needs go in `requirements.txt`; trained files in
`abejainc_training_result/` (read through `ABEJA_TRAINING_RESULT_DIR`). Without Docker, add
`--engine local`: the model runs in this Python, with `requirements.txt` installed in an
environment of its own (once, then reused). For production:

```sh
abeja model build -h {self.handler} -t {_image_name(name)}:1
```

With Docker, the model's image is built on `{DEFAULT_IMAGE}`, pulled the first time. Where
that cannot be pulled (no registry access), set `{IMAGE_VARIABLE}` to a Python 3.11+ image you
have (`docker images` lists them), once, and every command above works as written: in the
environment (`export {IMAGE_VARIABLE}=my-python:3.11`) or in this folder's `{DOTENV}`
(`echo {IMAGE_VARIABLE}=my-python:3.11 >> {DOTENV}`). `-i IMAGE` on a command wins over both.
"""


def _image_name(folder: str) -> str:
    """The folder's name as Docker takes an image name: lower case, no spaces."""
    return re.sub(r"[^a-z0-9]+", "-", folder.lower()).strip("-") or "model"


_CHAT_MORE: Final = """
The server speaks OpenAI's API (`/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`,
`/v1/models`): the `openai` package (`pip install openai`), and the tools built on it, call it
as they call OpenAI. The model's id is `model` (`-e ABEJA_RUNTIME_SERVED_MODEL_NAME=NAME`
changes it):

```python
from openai import OpenAI

client = OpenAI(base_url="http://localhost:8080/v1", api_key="unused")
stream = client.chat.completions.create(
    model="model", messages=[{"role": "user", "content": "What does the runtime do?"}], stream=True
)
for chunk in stream:
    print(chunk.choices[0].delta.content or "", end="", flush=True)
```
"""

TEMPLATES: Final = {
    "json": Template(
        "A model that answers JSON with JSON.",
        "request.json",
        "--input request.json",
        "-H 'Content-Type: application/json' --data-binary @request.json",
    ),
    "image": Template(
        "A model that takes an image and answers an image (with Pillow).",
        "request.jpg",
        "--input request.jpg --output answer.jpg",
        "-H 'Content-Type: image/jpeg' --data-binary @request.jpg -o answer.jpg",
    ),
    "multipart": Template(
        "A model that takes a multipart form (fields and a file) and answers JSON.",
        "request.txt",
        "--input title=notes --input document=@request.txt",
        "-F title=notes -F document=@request.txt",
    ),
    "csv": Template(
        "A model that takes a CSV table and answers JSON.",
        "request.csv",
        "--input request.csv",
        "-H 'Content-Type: text/csv' --data-binary @request.csv",
    ),
    "cortex": Template(
        "A Cortex request handler (pre_inference, post_inference) in front of an ONNX model.",
        "request.json",
        "--input request.json",
        "-H 'Content-Type: application/json' --data-binary @request.json",
    ),
    "chat": Template(
        "A chat model (a toy word chain) served as OpenAI's API: chat, completions, embeddings.",
        "request.json",
        "--input request.json",
        "-H 'Content-Type: application/json' --data-binary @request.json",
        handler="main:chat",
        path="/v1/chat/completions",
        more=_CHAT_MORE,
    ),
    "numpy": Template(
        "A numpy model (a linear layer) that answers JSON rows of numbers.",
        "request.json",
        "--input request.json",
        "-H 'Content-Type: application/json' --data-binary @request.json",
    ),
}

_DOCKERIGNORE: Final = """\
# Kept out of the model's image (abeja model run-local / build).
.git
.venv
venv
__pycache__
*.pyc
.pytest_cache
answer.*
# The CLI's settings (ABEJA_IMAGE), and maybe secrets: never baked into an image.
.env
"""


@click.command("init")
@click.argument("directory", type=click.Path(file_okay=False), default=".")
@click.option(
    "--template",
    "-t",
    type=click.Choice(sorted(TEMPLATES)),
    default="json",
    show_default=True,
    help="What the model takes and answers.",
)
def init(directory: str, template: str) -> None:
    """Start a project: main.py, requirements.txt, a request, a README, .dockerignore.

    \b
    abeja model init my-model --template image && cd my-model
    abeja model run-local -h main:handler --input request.jpg
    """
    console = Console()
    reported(console, lambda: _init(console, Path(directory), template))


def _init(console: Console, target: Path, name: str) -> int:
    template = TEMPLATES[name]
    source = _TEMPLATES_DIR / name
    files = {path.name: path.read_bytes() for path in sorted(source.iterdir()) if path.is_file()}
    project = target.resolve().name or "model"
    files["README.md"] = template.readme(project).encode()
    files[".dockerignore"] = _DOCKERIGNORE.encode()
    existing = sorted(file for file in files if (target / file).exists())
    if existing:
        raise InputError(
            f"{target} already has {', '.join(existing)}; choose an empty folder "
            "(abeja model init NEW_FOLDER) or move them away"
        )
    target.mkdir(parents=True, exist_ok=True)
    for file, data in files.items():
        (target / file).write_bytes(data)
    console.notice(
        f"created a project from the {name} template in {target.resolve()}: "
        f"{', '.join(sorted(files))}"
    )
    here = target.resolve() == Path.cwd().resolve()
    where = "" if here else f"cd {shlex.quote(str(target))} && "
    console.notice(
        f"try it: {where}abeja model run-local -h {template.handler} {template.run_input}"
    )
    return 0
