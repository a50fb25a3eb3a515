"""Everything about our images except talking to Docker: where the runtime's source is, its
wheels, the build contexts, and the labels that key the image cache.

Two images are built, both from the Dockerfiles in ``images/``:

* the **runtime image** ``images/Dockerfile``: ``BASE_IMAGE`` + abeja-runtime, installed from
  wheels built on the host (no network needed in the build). One per base image and runtime
  version, shared by all projects.
* the **project image** ``images/project.Dockerfile``: the runtime image + the project's
  ``requirements.txt`` installed + the project copied to ``/srv/app``. One per project.

The project image is reused while its labels (base image, project path, requirements hash,
runtime version, recipe) match, so an unchanged project starts without building. The project
folder is also mounted over ``/srv/app`` at run time, so code edits need no rebuild. The copy
of the project in the image is labelled with the digest of its files
(:func:`project_files_digest`): the production image, which has no mount, is built only on a
project image that holds the project's files as they are now.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final

from abeja_cli.errors import BuildError, EngineUnavailable
from abeja_cli.requirements import requirements_text

__all__ = [
    "FILES_LABEL",
    "LABEL_PREFIX",
    "ProjectKey",
    "RuntimeKey",
    "RuntimeSource",
    "env_instruction",
    "find_runtime_source",
    "label_instruction",
    "largest_files",
    "production_context",
    "project_context",
    "project_files_digest",
    "requirements_digest",
    "runtime_context",
    "runtime_wheels",
]

LABEL_PREFIX: Final = "org.abeja-runtime"
#: A project image's label: the digest of the project's files it holds (project_files_digest).
FILES_LABEL: Final = f"{LABEL_PREFIX}.files-sha256"
#: Folders never sent to Docker: VCS data, caches, virtual environments.
EXCLUDED_DIRS: Final = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "__pycache__",
        ".venv",
        "venv",
        ".tox",
        ".nox",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        "node_modules",
    }
)
_EXCLUDED_SUFFIXES: Final = (".pyc", ".pyo")
_SOURCE_ENV: Final = "ABEJA_RUNTIME_SOURCE"
#: Build contexts up to this size stay in memory; larger ones (a model's weights) go to disk.
_SPOOL: Final = 64 << 20
#: Wheel sets kept in the cache (one per runtime version and Python): a few, for switching
#: between branches without rebuilding.
_WHEEL_SETS: Final = 4
_CACHE_ENV: Final = "ABEJA_RUNTIME_CACHE"
#: Files are read (and hashed) this much at a time.
_CHUNK: Final = 1 << 20


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class RuntimeSource:
    """A checkout of this repository: the runtime's source and the Dockerfiles."""

    root: Path
    #: ``<package version>+<hash of the runtime source>``: a checkout under development
    #: changes without a version bump, and images must follow it.
    version: str

    @property
    def runtime_dockerfile(self) -> Path:
        return self.root / "images" / "Dockerfile"

    @property
    def project_dockerfile(self) -> Path:
        return self.root / "images" / "project.Dockerfile"

    @property
    def production_dockerfile(self) -> Path:
        return self.root / "images" / "production.Dockerfile"


def _package_version(root: Path) -> str:
    """The runtime's ``__version__``, read as text: the checkout may not be importable here."""
    source = (root / "abeja_runtime" / "__init__.py").read_text("utf-8")
    match = re.search(r'^__version__\s*=\s*"([^"]+)"', source, re.M)
    return match.group(1) if match else "0"


def _runtime_files(root: Path) -> Iterator[Path]:
    yield root / "pyproject.toml"
    for path in sorted((root / "abeja_runtime").rglob("*")):
        if path.is_file() and not _excluded(path.relative_to(root)):
            yield path


def _excluded(relative: Path) -> bool:
    return bool(EXCLUDED_DIRS.intersection(relative.parts[:-1])) or (
        relative.name in EXCLUDED_DIRS or relative.suffix in _EXCLUDED_SUFFIXES
    )


def find_runtime_source() -> RuntimeSource:
    """The checkout this CLI runs from, or ``$ABEJA_RUNTIME_SOURCE``.

    Raises :class:`EngineUnavailable` when there is none (an install without the source
    cannot build images; the local engine still works).
    """
    configured = os.environ.get(_SOURCE_ENV)
    root = Path(configured) if configured else Path(__file__).resolve().parent.parent
    needed = [root / "pyproject.toml", root / "abeja_runtime", root / "images" / "Dockerfile"]
    missing = [str(p) for p in needed if not p.exists()]
    if missing:
        raise EngineUnavailable(
            f"cannot build images: the abeja-runtime source is not at {root} (missing "
            f"{', '.join(missing)})",
            hint=f"set {_SOURCE_ENV} to a checkout of abeja-runtime, or use --engine local",
        )
    digest = hashlib.sha256()
    for path in _runtime_files(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return RuntimeSource(root, f"{_package_version(root)}+{digest.hexdigest()[:12]}")


def cache_dir() -> Path:
    """Where host-side build artefacts are kept between runs (``$ABEJA_RUNTIME_CACHE``)."""
    configured = os.environ.get(_CACHE_ENV)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "abeja-runtime"


def runtime_wheels(source: RuntimeSource, log: Callable[[str], None]) -> Path:
    """A folder with wheels of abeja-runtime and all its dependencies, built once per version.

    Built with this Python's pip, so the wheels suit images whose Python has the same version
    as this one (the Dockerfile falls back to the package index otherwise).
    """
    python_tag = f"{sys.implementation.cache_tag}-{sysconfig.get_platform()}"
    target = cache_dir() / "wheels" / f"{source.version}-{python_tag}"
    if target.is_dir() and any(target.glob("abeja_runtime-*.whl")):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    log(f"building wheels of abeja-runtime {source.version} into {target}")
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as tmp:
        staging, out = Path(tmp) / "src", Path(tmp) / "wheels"
        _stage_source(source.root, staging)
        command = [sys.executable, "-m", "pip", "wheel", "--wheel-dir", str(out), str(staging)]
        lines = _run_logged(command, log)
        if lines is not None:
            raise BuildError(
                "building the abeja-runtime wheels failed (pip wheel, see its output); check "
                "that this Python has pip and can reach the package index",
                log=lines,
            )
        try:
            out.rename(target)
        except OSError:
            if not target.is_dir():  # another run finished first: use its result
                raise
    _prune_wheels(target)
    return target


def _prune_wheels(keep: Path, count: int = _WHEEL_SETS) -> None:
    """Keep the newest few wheel sets: every runtime source change makes a new one."""
    sets = sorted(
        (p for p in keep.parent.iterdir() if p.is_dir() and not p.name.startswith(".")),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for old in sets[count:]:
        if old != keep:
            shutil.rmtree(old, ignore_errors=True)


def _stage_source(root: Path, staging: Path) -> None:
    """Copy only what the wheel needs, so ``pip wheel`` writes nothing into the checkout."""
    staging.mkdir()
    shutil.copy2(root / "pyproject.toml", staging)
    ignore = shutil.ignore_patterns(*EXCLUDED_DIRS, *(f"*{s}" for s in _EXCLUDED_SUFFIXES))
    for package in ("abeja_runtime", "abeja_cli"):
        if (root / package).is_dir():
            shutil.copytree(root / package, staging / package, ignore=ignore)
    readme = root / "README.md"
    # pyproject names README.md as the long description; a checkout may lack it for a while.
    (staging / "README.md").write_bytes(readme.read_bytes() if readme.is_file() else b"")


def _run_logged(command: list[str], log: Callable[[str], None]) -> str | None:
    """Run a command, passing its output to ``log`` line by line; its output if it failed."""
    proc = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        encoding="utf-8",
        errors="replace",
    )
    assert proc.stdout is not None
    lines = []
    with proc.stdout:
        for line in proc.stdout:
            lines.append(line)
            log(line.rstrip("\n"))
    return None if proc.wait() == 0 else "".join(lines)


def requirements_digest(project: Path) -> str:
    """SHA-256 of the project's requirements (``requirements.txt`` or a Pipfile's packages),
    or ``none`` when it has none."""
    text = requirements_text(project)
    return _sha256(text) if text else "none"


@dataclass(frozen=True)
class RuntimeKey:
    """Identity of a runtime image: base image (by id), runtime version, Dockerfile."""

    base_image: str
    base_image_id: str
    runtime_version: str
    recipe: str

    @property
    def digest(self) -> str:
        parts = (self.base_image_id, self.runtime_version, self.recipe)
        return _sha256("\n".join(parts).encode())

    @property
    def tag(self) -> str:
        version = re.sub(r"[^A-Za-z0-9_.-]", "-", self.runtime_version)
        return f"abeja-runtime/runtime:{version}-{self.digest[:12]}"

    def labels(self) -> dict[str, str]:
        return {
            f"{LABEL_PREFIX}.kind": "runtime",
            f"{LABEL_PREFIX}.base-image": self.base_image,
            f"{LABEL_PREFIX}.base-image-id": self.base_image_id,
            f"{LABEL_PREFIX}.runtime-version": self.runtime_version,
            f"{LABEL_PREFIX}.cache-key": self.digest,
        }


@dataclass(frozen=True)
class ProjectKey:
    """Identity of a project image; any change of a field means a rebuild."""

    runtime: RuntimeKey
    project: Path
    requirements: str
    recipe: str

    @property
    def digest(self) -> str:
        parts = (self.runtime.digest, str(self.project), self.requirements, self.recipe)
        return _sha256("\n".join(parts).encode())

    @property
    def repository(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.project.name.lower()).strip("-") or "project"
        return f"abeja-local/{slug[:40]}-{_sha256(str(self.project).encode())[:8]}"

    @property
    def tag(self) -> str:
        return f"{self.repository}:{self.digest[:12]}"

    def labels(self) -> dict[str, str]:
        return {
            f"{LABEL_PREFIX}.kind": "project",
            f"{LABEL_PREFIX}.base-image": self.runtime.base_image,
            f"{LABEL_PREFIX}.base-image-id": self.runtime.base_image_id,
            f"{LABEL_PREFIX}.runtime-version": self.runtime.runtime_version,
            f"{LABEL_PREFIX}.project": str(self.project),
            f"{LABEL_PREFIX}.requirements-sha256": self.requirements,
            f"{LABEL_PREFIX}.cache-key": self.digest,
        }


def recipe_digest(*dockerfiles: Path) -> str:
    """Hash of the Dockerfiles: editing one invalidates the images built from it."""
    return _sha256(b"\0".join(p.read_bytes() for p in dockerfiles))[:16]


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def label_instruction(labels: Mapping[str, str]) -> bytes:
    """One ``LABEL`` line for all labels: the API's ``labels=`` costs one build step each."""
    pairs = []
    for key, value in sorted(labels.items()):
        # JSON quoting is Dockerfile quoting too; "$" is escaped so paths are not expanded.
        quoted = json.dumps(value, ensure_ascii=False).replace("$", "\\$")
        pairs.append(f'"{key}"={quoted}')
    return ("\nLABEL " + " ".join(pairs) + "\n").encode("utf-8")


def env_instruction(env: Mapping[str, str]) -> bytes:
    """One ``ENV`` line that bakes the model's variables into an image (empty when none)."""
    if not env:
        return b""
    pairs = [f"{key}={json.dumps(value, ensure_ascii=False)}" for key, value in sorted(env.items())]
    return ("\nENV " + " ".join(p.replace("$", "\\$") for p in pairs) + "\n").encode("utf-8")


def production_context(
    source: RuntimeSource, env: Mapping[str, str], labels: Mapping[str, str]
) -> IO[bytes]:
    """Build context of a production image: its Dockerfile, the variables and the labels."""
    buffer = io.BytesIO()
    dockerfile = (
        source.production_dockerfile.read_bytes() + env_instruction(env) + label_instruction(labels)
    )
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        _add_bytes(tar, "Dockerfile", dockerfile)
    buffer.seek(0)
    return buffer


def runtime_context(
    source: RuntimeSource, wheels: Path, labels: Mapping[str, str] | None = None
) -> IO[bytes]:
    """Build context of the runtime image: the Dockerfile (plus ``labels``) and ``wheels/``."""
    buffer = tempfile.SpooledTemporaryFile(max_size=_SPOOL)  # noqa: SIM115 - returned open
    dockerfile = source.runtime_dockerfile.read_bytes() + label_instruction(labels or {})
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        _add_bytes(tar, "Dockerfile", dockerfile)
        for wheel in sorted(wheels.glob("*.whl")):
            tar.add(wheel, arcname=f"wheels/{wheel.name}")
    buffer.seek(0)
    return buffer


def project_files(project: Path) -> Iterator[Path]:
    """The project's files that go into its image: caches, VCS folders and what the project's
    ``.dockerignore`` names (large data sets, say) are left out."""
    included: set[str] | None = None
    ignore_file = project / ".dockerignore"
    if ignore_file.is_file():
        from docker.utils.build import exclude_paths

        lines = ignore_file.read_text("utf-8", "replace").splitlines()
        patterns = [p.strip() for p in lines if p.strip() and not p.lstrip().startswith("#")]
        included = set(exclude_paths(str(project), patterns))
    for dirpath, dirnames, filenames in os.walk(project):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIRS)
        for name in sorted(filenames):
            path = Path(dirpath, name)
            if name.endswith(_EXCLUDED_SUFFIXES):
                continue
            if included is None or path.relative_to(project).as_posix() in included:
                yield path


def largest_files(project: Path, count: int) -> tuple[int, list[tuple[Path, int]]]:
    """The size of the project's files that go into its image, and the ``count`` largest."""
    sizes = []
    for path in project_files(project):
        try:
            sizes.append((path, path.stat().st_size))
        except OSError:  # removed meanwhile, or a dangling link: tar skips it too
            continue
    sizes.sort(key=lambda item: item[1], reverse=True)
    return sum(size for _, size in sizes), sizes[:count]


class _FilesDigest:
    """SHA-256 of a project's files as its image gets them: each file's path, kind, permissions
    and size, and its content or a link's target. Times and owners are left out: a time changes
    without the code, and ``COPY`` makes root the owner whoever it was."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256()

    def add(self, member: tarfile.TarInfo) -> None:
        """A member's header; a regular file's content follows through :meth:`reading`."""
        fields = (member.name, member.type.decode(), f"{member.mode:o}", member.linkname)
        header = "\0".join((*fields, str(member.size))) + "\0"
        self._sha.update(header.encode("utf-8", "surrogateescape"))

    def reading(self, file: IO[bytes]) -> _HashedReader:
        """``file``, hashed as it is read."""
        return _HashedReader(file, self._sha.update)

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


class _HashedReader:
    """A file whose bytes go into a digest as they are read (by ``tarfile``, or to hash it)."""

    def __init__(self, file: IO[bytes], hash_bytes: Callable[[bytes], None]) -> None:
        self._file = file
        self._hash_bytes = hash_bytes

    def read(self, size: int = -1, /) -> bytes:
        data = self._file.read(size)
        self._hash_bytes(data)
        return data


def _project_members(project: Path) -> Iterator[tuple[tarfile.TarInfo, Path]]:
    """The project's files (:func:`project_files`) as the tar members of its build context,
    ``project/<path>``: regular files and symbolic links; sockets and pipes are skipped."""
    for path in project_files(project):
        status = path.lstat()
        member = tarfile.TarInfo(f"project/{path.relative_to(project).as_posix()}")
        member.mode = stat.S_IMODE(status.st_mode)
        member.mtime = int(status.st_mtime)
        if stat.S_ISLNK(status.st_mode):
            member.type = tarfile.SYMTYPE
            member.linkname = os.readlink(path)
        elif stat.S_ISREG(status.st_mode):
            member.size = status.st_size
        else:
            continue
        yield member, path


def project_files_digest(project: Path) -> str:
    """The digest of the project's files as its image gets them (``.dockerignore`` honoured):
    equal to the :data:`FILES_LABEL` of an image that holds the project as it is now."""
    digest = _FilesDigest()
    for member, path in _project_members(project):
        digest.add(member)
        if member.isreg():
            with path.open("rb") as file:
                content, remaining = digest.reading(file), member.size
                while remaining > 0 and (chunk := content.read(min(remaining, _CHUNK))):
                    remaining -= len(chunk)
    return digest.hexdigest()


def project_context(
    source: RuntimeSource, project: Path, labels: Mapping[str, str] | None = None
) -> IO[bytes]:
    """Build context of a project image: the Dockerfile, ``project/`` and the requirements.

    The requirements (``requirements.txt``, or a Pipfile's packages) are also stored on their
    own (empty when there are none) so that the pip layer is cached independently of code
    changes. The Dockerfile adds ``labels`` and :data:`FILES_LABEL`, the digest of the files
    as they were read into this context.
    """
    buffer = tempfile.SpooledTemporaryFile(max_size=_SPOOL)  # noqa: SIM115 - returned open
    digest = _FilesDigest()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        _add_bytes(tar, "abeja-build/requirements.txt", requirements_text(project))
        tar.add(project, arcname="project", recursive=False)
        for member, path in _project_members(project):
            digest.add(member)
            if member.isreg():
                with path.open("rb") as file:
                    tar.addfile(member, digest.reading(file))
            else:
                tar.addfile(member)
        # Last, as it labels the digest of the files just added (the order does not matter
        # to Docker).
        labelled = {**(labels or {}), FILES_LABEL: digest.hexdigest()}
        dockerfile = source.project_dockerfile.read_bytes() + label_instruction(labelled)
        _add_bytes(tar, "Dockerfile", dockerfile)
    buffer.seek(0)
    return buffer
