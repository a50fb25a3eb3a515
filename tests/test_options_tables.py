"""The tables of options in the README and docs/styles.md are what the declared settings say:
``scripts/write-options-tables.py --check`` passes on the repository and fails on a stale copy,
run as a developer runs it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "write-options-tables.py"


def check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--check", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_docs_tables_are_what_the_settings_declare():
    result = check(ROOT)
    assert result.returncode == 0, result.stderr


def test_a_stale_table_fails_the_check_and_the_script_rewrites_it(tmp_path):
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copy(ROOT / "docs" / "styles.md", tmp_path / "docs" / "styles.md")
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text().replace("| `100` |", "| `50` |", 1))
    result = check(tmp_path)
    assert result.returncode == 1
    assert "stale tables of options in README.md" in result.stderr
    subprocess.run([sys.executable, str(SCRIPT), "--root", str(tmp_path)], check=True, timeout=60)
    assert readme.read_text() == (ROOT / "README.md").read_text()
    assert check(tmp_path).returncode == 0
