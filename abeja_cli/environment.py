"""The model's environment: ``-e KEY:VALUE`` / ``-e KEY=VALUE``, ``--env-file``, and defaults.

Precedence, lowest first: the defaults below < ``--env-file`` < ``-e`` < what the CLI sets
from its own options (``HANDLER`` from ``-h``, ``ABEJA_ORGANIZATION_ID`` from ``-o``) and for
itself (``ABEJA_RUNTIME_LOG_FORMAT=json``: it reads the server's log). A server that run-local
or run-local-server starts has no drain delay unless the user gives one
(:func:`without_drain_delay`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from abeja_cli.errors import InputError
from abeja_runtime.options import setting_named

__all__ = [
    "DEFAULTS",
    "local_environment",
    "model_environment",
    "parse_env_file",
    "parse_env_option",
    "without_drain_delay",
]

_KEY_RE: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: What the platform sets for a deployed model, so a local run behaves like the real one.
#: ``ABEJA_TRAINING_RESULT_DIR`` is the platform default (abeja-sdk's CLI used ``.`` locally, which
#: made local and deployed runs look for trained files in different places).
DEFAULTS: Final[Mapping[str, str]] = {
    "ABEJA_TRAINING_RESULT_DIR": "abejainc_training_result",
    "PYTHONUNBUFFERED": "1",
    "SERVICE_TYPE": "HTTP",
}


#: What the local engine passes on from the user's shell besides the model's variables: what a
#: process needs to run (paths, locale, time zone, temp dir, the Python environment, native
#: library and device selection, BLAS threading), never credentials or tokens. A container
#: gets none of the shell's variables; ``--inherit-env`` passes them all.
_PASSED_ON: Final = frozenset(
    {
        "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR",
        "PYTHONPATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES", "SYSTEMROOT",
    }
)  # fmt: skip
_PASSED_ON_PREFIXES: Final = ("LC_", "OPENBLAS_", "OMP_", "MKL_")


def local_environment(
    shell: Mapping[str, str], model: Mapping[str, str], *, inherit: bool = False
) -> dict[str, str]:
    """The environment of a model run by the local engine: a minimal part of the user's shell
    (all of it with ``inherit``), then the model's variables."""
    if inherit:
        base = dict(shell)
    else:
        base = {
            key: value
            for key, value in shell.items()
            if key in _PASSED_ON or key.startswith(_PASSED_ON_PREFIXES)
        }
    return {**base, **model}


_DRAIN_DELAY: Final = str(setting_named("drain_delay").envvar)
#: The project's file that the runtime reads for variables that are not set.
_PROJECT_DOTENV: Final = ".env"


def without_drain_delay(
    env: Mapping[str, str], *, project: Path, inherited: Mapping[str, str]
) -> dict[str, str]:
    """``env`` with the runtime's drain delay set to 0, unless the user set it: with ``-e`` or
    ``--env-file`` (in ``env``), in the project's ``.env`` (which the runtime reads), or in the
    shell that ``--inherit-env`` passes on (``inherited``).

    The delay keeps a stopping runtime answering until load balancers have seen its readiness
    turn; nothing balances in front of a local run, and the CLI kills a runtime that has not
    stopped 10 s after it asked."""
    if _DRAIN_DELAY in env or _DRAIN_DELAY in inherited or _DRAIN_DELAY in _dotenv(project):
        return dict(env)
    return {**env, _DRAIN_DELAY: "0"}


def _dotenv(project: Path) -> Mapping[str, str | None]:
    from dotenv import dotenv_values

    path = project / _PROJECT_DOTENV
    if not path.is_file():
        return {}
    try:
        return dotenv_values(path, interpolate=False, encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {path}: {exc}") from None


#: Names of variables that hold credentials (a token, a password, an API key).
_SECRET_NAME: Final = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|KEY", re.IGNORECASE)


def secret_names(names: Sequence[str]) -> list[str]:
    """The names that look like they hold a secret, in order."""
    return [name for name in names if _SECRET_NAME.search(name)]


def parse_env_option(value: str) -> tuple[str, str]:
    """Split one ``-e`` value at its first ``:`` or ``=`` (abeja-sdk's form and the shell's)."""
    match = re.search(r"[:=]", value)
    if match is None:
        raise InputError(
            f"-e {value!r} has no value; write -e KEY=VALUE (or abeja-sdk's -e KEY:VALUE)"
        )
    key, rest = value[: match.start()], value[match.end() :]
    if not _KEY_RE.match(key):
        raise InputError(
            f"-e {value!r}: {key!r} is not a valid variable name (letters, digits and _, "
            "not starting with a digit)"
        )
    return key, rest


def parse_env_file(path: Path) -> dict[str, str]:
    """Read a dotenv file (python-dotenv syntax); variables without a value are an error."""
    from dotenv import dotenv_values

    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise InputError(f"--env-file {path} {what}; give a file of KEY=VALUE lines")
    try:
        values = dotenv_values(path, interpolate=False, encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read --env-file {path}: {exc}") from None
    result: dict[str, str] = {}
    for key, value in values.items():
        if not _KEY_RE.match(key):
            raise InputError(f"--env-file {path}: {key!r} is not a valid variable name")
        if value is None:
            raise InputError(f"--env-file {path}: {key} has no value; write {key}=VALUE")
        result[key] = value
    return result


def model_environment(
    *,
    handler: str,
    env_options: Sequence[str] = (),
    env_file: Path | None = None,
    organization_id: str | None = None,
) -> dict[str, str]:
    """The variables set for the model, validated; raises :class:`InputError`."""
    env = dict(DEFAULTS)
    if env_file is not None:
        env.update(parse_env_file(env_file))
    env.update(parse_env_option(value) for value in env_options)
    env["HANDLER"] = handler
    # The CLI reads the model server's log as JSON records (its ports, each request's lines),
    # whatever format a -e or an env file asks for.
    env["ABEJA_RUNTIME_LOG_FORMAT"] = "json"
    if organization_id is not None:
        env["ABEJA_ORGANIZATION_ID"] = organization_id
    return env
