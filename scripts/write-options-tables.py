"""Write the tables of options into the README (the core's) and docs/styles.md (the styles'),
from the settings as the code declares them; ``--check`` only says whether they are stale.

    python scripts/write-options-tables.py          # after changing a setting
    python scripts/write-options-tables.py --check  # what the tests run: exit 1 when stale

Each table sits between ``<!-- options:NAME -->`` and ``<!-- /options -->``; the text around it
is the docs' own.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from abeja_runtime.options import core_settings, markdown_table, style_settings

TABLES = {
    "core": ("README.md", lambda: markdown_table(core_settings())),
    "styles": ("docs/styles.md", lambda: markdown_table(s for _, s in style_settings())),
}


def refreshed(text: str, name: str, table: str) -> str:
    pattern = re.compile(rf"(<!-- options:{name} -->\n).*?(<!-- /options -->)", re.DOTALL)
    if not pattern.search(text):
        raise SystemExit(f"no <!-- options:{name} --> ... <!-- /options --> block to fill")
    return pattern.sub(lambda match: match.group(1) + table + match.group(2), text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale tables")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args()
    stale = []
    for name, (relative, make) in TABLES.items():
        path = args.root / relative
        text = path.read_text(encoding="utf-8")
        new = refreshed(text, name, make())
        if new != text:
            stale.append(relative)
            if not args.check:
                path.write_text(new, encoding="utf-8")
    if args.check and stale:
        print(
            f"stale tables of options in {', '.join(stale)}: run "
            "python scripts/write-options-tables.py",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
