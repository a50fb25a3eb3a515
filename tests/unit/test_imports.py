"""What importing the settings and the front brings in (issue 32): no style and nothing of the
handler side. Each import runs in a fresh interpreter, so that what this test process imported
already cannot hide a module that the import would load."""

from __future__ import annotations

import json

import pytest
from helpers.interpreters import printed_by

from abeja_runtime import styles


def imported_by(*modules: str) -> list[str]:
    """Every module that importing ``modules`` in a fresh interpreter loads."""
    code = f"import json, sys\nimport {', '.join(modules)}\n"
    code += "print(json.dumps(sorted(sys.modules)))\n"
    return json.loads(printed_by(code))


def loaded_after(module: str) -> list[str]:
    """The runtime's modules that importing ``module`` in a fresh interpreter loads."""
    return [name for name in imported_by(module) if name.startswith("abeja_runtime")]


def handler_side(modules: list[str]) -> list[str]:
    return [name for name in modules if name.split(".")[:2] == ["abeja_runtime", "worker"]]


def style_modules(modules: list[str]) -> list[str]:
    """The styles' own modules (the base module, ``abeja_runtime.styles``, is the contract)."""
    return [name for name in modules if name.startswith("abeja_runtime.styles.")]


@pytest.mark.parametrize(
    "module",
    [
        "abeja_runtime.config",
        "abeja_runtime.front.supervisor",  # what `abeja-runtime` runs (main._run)
        "abeja_runtime.front.serving",
        "abeja_runtime.front.server",
    ],
)
def test_the_settings_and_the_front_import_no_style_and_no_handler_side(module):
    modules = loaded_after(module)
    assert module in modules
    assert handler_side(modules) == []
    assert style_modules(modules) == []


def test_the_front_starts_its_first_handler_process_before_it_imports_its_loop_and_servers():
    """What runs before the first handler process's interpreter is started (``supervisor.py``)
    imports neither asyncio nor aiohttp nor the pool: their imports overlap that process's."""
    modules = set(imported_by("abeja_runtime.main", "abeja_runtime.front.supervisor"))
    assert "abeja_runtime.front.supervisor" in modules
    later = {"asyncio", "aiohttp", "abeja_runtime.front.pool", "prometheus_client"}
    assert later & modules == set()


def test_the_command_line_imports_the_styles_for_their_options_but_no_handler_side():
    """The command line declares each style's options: it imports the styles' packages, which
    stay light (no adapter, nothing of the handler process)."""
    modules = loaded_after("abeja_runtime.main")
    assert handler_side(modules) == []
    assert {f"abeja_runtime.styles.{listed.module}" for listed in styles.REGISTERED} <= set(modules)
    assert [name for name in style_modules(modules) if name.count(".") > 2] == []


def test_the_static_table_lists_the_styles_as_they_name_themselves():
    """``--style``'s choices come from REGISTERED without importing a style: it must say what
    the styles, once imported, say of themselves, in the order ``auto`` tries them."""
    assert tuple(style.name for style in styles.registered()) == tuple(
        listed.name for listed in styles.REGISTERED
    )
    assert styles.style_names() == ("auto", *(style.name for style in styles.registered()))
    for listed in styles.REGISTERED:
        assert styles.style_named(listed.name).name == listed.name
    assert styles.REGISTERED[-1].name == "abeja"  # takes what no other style does


def test_a_style_named_alone_imports_only_its_own_module():
    code = (
        "import sys\n"
        "from abeja_runtime.styles import style_named\n"
        "style_named('abeja')\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('abeja_runtime.styles.'))))\n"
    )
    assert printed_by(code).split() == ["abeja_runtime.styles.abeja"]


def test_a_def_handler_s_process_imports_neither_aiohttp_nor_asyncio_nor_email():
    """A handler process serving a ``def`` handler stays lean (its template, with
    ``--preload``, holds what every forked process shares): aiohttp alone is 18 MiB and a
    tenth of a second. Only a process on an event loop imports asyncio, for its loop, and the
    head it writes needs none of them."""
    modules = set(
        imported_by(
            "abeja_runtime.worker.process",
            "abeja_runtime.worker.template",
        )
    )
    assert "abeja_runtime.worker.runner" in modules
    heavy = {"aiohttp", "asyncio", "email", "importlib.metadata", "yarl"}
    assert heavy & modules == set()
