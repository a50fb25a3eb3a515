"""Say whether a newer release of what the runtime leans on breaks it: ``python
scripts/check_newer_releases.py`` (CI runs it after the suite; it never fails the run).

The runtime pins the releases it is tested with where it uses a package's internals: aiohttp
(``connection.py`` subclasses its connection handler; pinned in ``dependencies``) and kserve
(the KServe style; pinned in the test extra, and ``TESTED_KSERVE``). For each, this asks PyPI
for the newest release; when it is outside the pinned range, it installs that release into a
virtual environment on top of this Python's packages and runs the tests that cover the
package's use there, then prints what passed and what failed.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
#: package → the tests that cover the runtime's use of its internals
COVERED = {
    "aiohttp": ["tests/test_keep_alive.py", "tests/test_connections.py", "tests/test_execute.py"],
    "kserve": [
        "tests/test_styles_kserve.py",
        "tests/test_styles_kserve_script.py",
        "tests/test_grpc.py",
    ],
}


def pinned() -> dict[str, Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    listed = [*project["dependencies"], *project["optional-dependencies"]["test"]]
    found = {}
    for text in listed:
        requirement = Requirement(text)
        if requirement.name in COVERED:
            found[requirement.name] = requirement
    return found


def newest(package: str) -> Version | None:
    """The newest release on the index, or None when the index cannot be asked."""
    asked = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", package],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    first = asked.stdout.splitlines()[0] if asked.returncode == 0 and asked.stdout else ""
    if not first.startswith(f"{package} ("):
        return None
    return Version(first[len(package) + 2 : -1])


def try_release(package: str, version: Version) -> str:
    """Run the covering tests with ``package==version``; a sentence saying how it went."""
    with tempfile.TemporaryDirectory(prefix="abeja-newer-") as tmp:
        venv = Path(tmp) / "venv"
        steps = [
            [sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
            [str(venv / "bin" / "pip"), "install", "-q", f"{package}=={version}"],
        ]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True, timeout=900, check=False)
            if done.returncode != 0:
                return f"could not be installed: {done.stderr.strip()[-300:]}"
        tests = subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
             *COVERED[package]],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )  # fmt: skip
    summary = tests.stdout.strip().splitlines()[-1] if tests.stdout.strip() else "no output"
    failed = [line for line in tests.stdout.splitlines() if line.startswith("FAILED")]
    verdict = "the covering tests pass" if tests.returncode == 0 else "the covering tests FAIL"
    return "; ".join([f"{verdict} ({summary})", *failed[:20]])


def main() -> None:
    for package, requirement in pinned().items():
        version = newest(package)
        if version is None:
            print(f"{package}: the package index did not answer; nothing checked")
        elif requirement.specifier.contains(version, prereleases=False):
            print(f"{package} {version}, the newest release, is within the tested {requirement}")
        else:
            outcome = try_release(package, version)
            print(f"NOTICE: {package} {version} is newer than the tested {requirement}: {outcome}")


if __name__ == "__main__":
    main()
