"""KServe's main-script habit: ``python model.py --model_name NAME ...`` on the runtime.

A KServe model file (and every KServe transformer) usually ends with::

    if __name__ == "__main__":
        model = MyModel(args.model_name)
        model.load()
        ModelServer().start([model])

``abeja-runtime kserve model.py [KServe's arguments]`` runs that file unchanged: in each
worker the file runs as ``__main__`` with ``sys.argv`` as KServe's server would have it, so its
own argument parsing (and kserve's, at import) sees ``--model_name``, ``--predictor_host`` and
the rest; ``ModelServer.start`` then hands the runtime the models it was given instead of
starting KServe's servers. What ``ModelServer()`` set up for its models, the predictor of a
transformer (``--predictor_host``, ``--predictor_protocol`` / ``--protocol``, SSL, timeout,
retries), is given to every call of the model, as ``ModelServer`` does.
"""

from __future__ import annotations

import logging
import runpy
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from abeja_runtime.errors import HandlerLoadError
from abeja_runtime.styles._common import require

if TYPE_CHECKING:
    from abeja_runtime.config import Config
    from abeja_runtime.styles import LoadedHandler
    from abeja_runtime.styles.kserve import KserveOptions

__all__ = ["ScriptModels", "load_script", "run_main_script"]

_log = logging.getLogger("abeja_runtime")

#: kserve's loggers, which ``ModelServer()`` gives handlers of their own; their records go to
#: the runtime's JSON log instead.
_KSERVE_LOGGERS = ("kserve", "kserve.trace")


def load_script(config: Config, options: KserveOptions, workdir: Path) -> LoadedHandler:
    """``abeja-runtime kserve model.py ...``: the model that the script starts."""
    from abeja_runtime.styles.kserve.adapter import adapt

    started = run_main_script(options.kserve_script, workdir)
    handler = adapt(
        started.model,
        config=config,
        options=options,
        workdir=workdir,
        predictor=started.predictor_config,
    )
    _log.info(
        "serving %s with the kserve style (the model its __main__ block starts: %s)",
        options.kserve_script[0],
        type(started.model).__name__,
        extra={"fields": {"style": "kserve"}},
    )
    return handler


class _Started(BaseException):
    """Raised by the stand-in ``ModelServer.start``: the script is done setting up. A
    BaseException, so that a script's ``except Exception`` around ``start`` lets it through."""

    def __init__(self, models: Any) -> None:
        super().__init__("ModelServer.start")
        self.models = models


@dataclass(frozen=True)
class ScriptModels:
    """What the script handed to ``ModelServer.start``, and the predictor it configured."""

    model: Any
    predictor_config: Any


def run_main_script(argv: Sequence[str], workdir: Path) -> ScriptModels:
    """Run ``argv[0]`` as ``__main__`` with ``sys.argv = argv`` until it starts its server."""
    script = (workdir / argv[0]).resolve()
    if not script.is_file():
        raise HandlerLoadError(f"the KServe script {argv[0]} does not exist in {workdir}")
    try:
        with _as_main(script, argv):
            # kserve parses sys.argv when it is first imported: only now, with the script's.
            model_server = require("kserve.model_server", "kserve")
            with _start_captured(model_server.ModelServer):
                runpy.run_path(str(script), run_name="__main__")
    except _Started as started:
        models = list(started.models or [])
    except SystemExit as exc:
        raise HandlerLoadError(
            f"the KServe script {argv[0]} exited ({exc.code}) before it called "
            "ModelServer().start([...]); its arguments were: " + " ".join(argv[1:])
        ) from None
    except Exception as exc:
        raise HandlerLoadError(
            f"the KServe script {argv[0]} raised {type(exc).__name__}: {exc}"
        ) from exc
    else:
        raise HandlerLoadError(
            f"the KServe script {argv[0]} never called ModelServer().start([...]) in its "
            '`if __name__ == "__main__":` block, so it names no model to serve'
        )
    if len(models) != 1:
        raise HandlerLoadError(
            f"the KServe script {argv[0]} started {len(models)} models; the runtime serves one "
            "model per process: start one runtime per model"
        )
    for name in _KSERVE_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    context = require("kserve.context", "kserve")
    return ScriptModels(models[0], context.get_predictor_config())


@contextmanager
def _as_main(script: Path, argv: Sequence[str]) -> Iterator[None]:
    """``sys.argv`` and ``sys.path[0]`` as ``python script ARGS`` would have them."""
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [str(script), *argv[1:]]
    sys.path.insert(0, str(script.parent))
    try:
        yield
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path


@contextmanager
def _start_captured(server_class: Any) -> Iterator[None]:
    original = server_class.start

    def start(self: Any, models: Any, *args: Any, **kwargs: Any) -> None:
        raise _Started(models)

    server_class.start = start
    try:
        yield
    finally:
        server_class.start = original
