"""The front's aiohttp: the server half at once, the client half only when something uses it.

Each check runs in a fresh interpreter: in the test process aiohttp is already imported whole.
The client half in a running front is covered end to end by ``test_arms.py`` (the results of
async requests are sent with it).
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version

#: Modules of aiohttp's client half that the front must not import until it sends a result.
CLIENT = ["aiohttp.client", "aiohttp.connector", "aiohttp.cookiejar", "aiohappyeyeballs"]

FRONT_IMPORTS = """
import importlib, json, pkgutil, sys
from abeja_runtime.front import lean_aiohttp
lean_aiohttp.install()
import abeja_runtime.front as front
for module in pkgutil.iter_modules(front.__path__):
    importlib.import_module(f"abeja_runtime.front.{module.name}")
packages = ("aiohttp", "aiohappyeyeballs")
loaded = sorted(name for name in sys.modules if name.split(".")[0] in packages)
"""


def run(code: str) -> dict[str, object]:
    """Run ``code`` (which leaves its answer in ``answer``) in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", code + "\nprint(json.dumps(answer))"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


#: Modules of aiohttp's application framework (``aiohttp.web``), which the front does not use.
FRAMEWORK = ["aiohttp.web", "aiohttp.web_app", "aiohttp.web_urldispatcher", "aiohttp.web_runner"]


def test_the_front_s_modules_leave_aiohttp_s_client_and_framework_out() -> None:
    answer = run(FRONT_IMPORTS + "answer = {'loaded': loaded}")
    loaded = answer["loaded"]
    assert "aiohttp.web_server" in loaded and "aiohttp.web_protocol" in loaded
    assert not set(CLIENT) & set(loaded)
    assert not set(FRAMEWORK) & set(loaded)


def test_the_client_half_loads_on_first_use_and_the_package_is_then_whole() -> None:
    answer = run(
        FRONT_IMPORTS
        + """
import aiohttp
from aiohttp import ClientSession, web
import aiohttp.client
answer = {
    "version": aiohttp.__version__,
    "session": ClientSession is aiohttp.client.ClientSession,
    "web": web is sys.modules["aiohttp.web"],
    "names": len(aiohttp.__all__),
    "dir": "ClientTimeout" in dir(aiohttp),
}
try:
    aiohttp.NoSuchName
except AttributeError as exc:
    answer["missing"] = str(exc)
"""
    )
    assert answer["version"] == version("aiohttp")
    assert answer["session"] and answer["web"] and answer["dir"]
    assert answer["names"] > 100
    assert "NoSuchName" in answer["missing"]


def test_installing_after_aiohttp_was_imported_changes_nothing() -> None:
    answer = run(
        """
import json, sys
import aiohttp
before = sys.modules["aiohttp"]
from abeja_runtime.front import lean_aiohttp
lean_aiohttp.install()
answer = {"same": sys.modules["aiohttp"] is before, "client": "aiohttp.client" in sys.modules}
"""
    )
    assert answer == {"same": True, "client": True}
