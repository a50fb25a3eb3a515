"""``abeja-runtime batch``: the handler run once per input, with no server (contract Part B 1.9).

The inputs are the platform's ``INPUT`` variable (JSON, or a DataLake file: :mod:`.datalake`),
answered to stdout or uploaded to the channel ``OUTPUT`` names as ``<ABEJA_RUN_ID>_0<ext>``; or
files and folders (hidden files skipped), one ``POST`` each, each answer written under
``--output`` as the input's path plus its content type's extension. Each is invoked as a handler
process invokes it (``worker/invoke.py``), within the timeout, ``concurrency`` at a time; the
exit code is 1 when an answer's status is above 299 or the handler cannot be loaded.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO

import aiohttp
import click

from abeja_runtime.access_log import AccessLog
from abeja_runtime.batch_job.datalake import DATALAKE_KEY, DataLake, DataLakeError, datalake_target
from abeja_runtime.config import Config
from abeja_runtime.encode import EncodedResponse, status_reply
from abeja_runtime.errors import AbejaRuntimeError, HandlerLoadError, HandlerTimeout
from abeja_runtime.logs import capture_prints, configure_logging, new_request_id, request_id_var
from abeja_runtime.media import extension_for, guess_content_type
from abeja_runtime.pixels import limit_image_pixels
from abeja_runtime.project import install_dependencies, prepare_workdir
from abeja_runtime.worker.invoke import Invoker, chunks, finish
from abeja_runtime.worker.loader import load_handler
from abeja_runtime.worker.request import Content, Request

__all__ = ["BatchJobError", "collect_files", "run_batch_job"]

_log = logging.getLogger("abeja_runtime")

#: How many failed inputs the summary names.
_NAMED_FAILURES: Final = 10


class BatchJobError(AbejaRuntimeError):
    """The inputs or the platform's answers make the batch impossible; the text says why."""


def collect_files(paths: Sequence[Path]) -> list[tuple[Path, Path]]:
    """Every input file as (absolute path, name of its output): a file by its name, a folder's
    files (hidden ones skipped, sorted) by their path inside it."""
    found: list[tuple[Path, Path]] = []
    for given in paths:
        path = given.resolve()
        if path.is_file():
            found.append((path, Path(path.name)))
        elif path.is_dir():
            found.extend(
                (file, file.relative_to(path))
                for file in sorted(path.rglob("*"))
                if file.is_file()
                and not any(part.startswith(".") for part in file.relative_to(path).parts)
            )
        else:
            raise BatchJobError(f"{given}: no such file or folder")
    if not found:
        raise BatchJobError(f"no input files in {', '.join(map(str, paths))}")
    names = Counter(name for _, name in found)
    twice = sorted(str(name) for name, count in names.items() if count > 1)
    if twice:
        raise BatchJobError(
            f"two inputs would write the same output ({', '.join(twice[:3])}); name folders, "
            "or files with different names"
        )
    return found


@dataclass
class _Tally:
    """What the summary says."""

    statuses: Counter[int] = field(default_factory=Counter)
    failed: list[str] = field(default_factory=list)

    def add(self, name: str, status: int) -> None:
        self.statuses[status] += 1
        if status > 299:
            self.failed.append(name)

    def summary(self, seconds: float, where: str) -> str:
        total = sum(self.statuses.values())
        text = f"{total} input(s): {total - len(self.failed)} answered 2xx"
        if self.failed:
            codes = ", ".join(
                f"{status}: {count}"
                for status, count in sorted(self.statuses.items())
                if status > 299
            )
            named = ", ".join(self.failed[:_NAMED_FAILURES])
            more = len(self.failed) - _NAMED_FAILURES
            text += f", {len(self.failed)} failed ({codes}): {named}"
            text += f" and {more} more" if more > 0 else ""
        return f"{text}, in {seconds:.1f} s{where}"


def run_batch_job(config: Config, inputs: Sequence[Path], output: Path) -> int:
    """The command's body: returns its exit code."""
    configure_logging(
        config.log_level,
        config.platform.log_fields(),
        log_format=config.log_format,
        stream=sys.__stderr__,
    )
    files = collect_files(inputs) if inputs else None
    output = output.resolve()
    workdir = prepare_workdir(config.user_model_root, config.training_result_dir, config.handler)
    try:
        if config.install_requirements:
            install_dependencies(workdir)
    except HandlerLoadError as exc:
        _log.error("failed to setup model: %s", exc)
        return 1
    capture_prints()  # the handler's print() becomes log records, off stdout
    limit_image_pixels(config.max_image_pixels)
    return asyncio.run(_BatchJob(config).run(files, output, os.environ))


class _BatchJob:
    def __init__(self, config: Config) -> None:
        self._config = config
        self._access_log = AccessLog(config.platform.log_fields())

    async def run(
        self, files: list[tuple[Path, Path]] | None, output: Path, environ: Mapping[str, str]
    ) -> int:
        config = self._config
        self._threads = ThreadPoolExecutor(config.concurrency, thread_name_prefix="abeja-handler")
        try:
            handler = await asyncio.get_running_loop().run_in_executor(
                self._threads, load_handler, config
            )
        except Exception as exc:
            _log.error(
                "failed to setup model: %s", exc, exc_info=not isinstance(exc, HandlerLoadError)
            )
            self._threads.shutdown(wait=False)
            return 1
        self._invoker = Invoker(config, handler)
        began = time.monotonic()
        tally = _Tally()
        where = "" if files is None else f"; answers in {output}"
        try:
            if files is None:
                await self._platform_input(environ, tally)
            else:
                await self._files(files, output, tally)
        except (BatchJobError, DataLakeError) as exc:
            _log.error("batch failed: %s", exc)
            return 1
        finally:
            self._threads.shutdown(wait=False)
        summary = tally.summary(time.monotonic() - began, where)
        _log.info("batch finished: %s", summary)
        if _terminal().isatty():  # for a person; a log collector has the record
            click.echo(f"batch: {summary}", file=_terminal())
        return 1 if tally.failed else 0

    async def _answer(self, request: Request, name: str) -> EncodedResponse:
        """The handler's answer to ``request`` with its body in memory, within the timeout,
        recorded in the access log under ``name``; the request is closed."""
        received = time.time()
        token = request_id_var.set(request.request_id)
        invoker = self._invoker
        try:
            if invoker.handler.is_async:
                work: Any = _collected(invoker, request)
            else:  # a def handler on a thread, where no event loop runs
                work = asyncio.get_running_loop().run_in_executor(
                    self._threads, lambda: finish(_collected(invoker, request))
                )
            reply: EncodedResponse
            try:
                reply = await asyncio.wait_for(work, self._config.timeout or None)
            except asyncio.TimeoutError:
                timeout = HandlerTimeout(self._config.timeout)
                reply = status_reply(timeout.status, timeout.message)
            self._access_log.record(
                "POST", name, reply.status, received, time.time(), request.request_id
            )
            return reply
        finally:
            request.close()
            request_id_var.reset(token)

    async def _files(self, files: list[tuple[Path, Path]], output: Path, tally: _Tally) -> None:
        pending: Iterator[tuple[Path, Path]] = iter(files)
        with _progress(_terminal(), len(files)) as bar:

            async def work() -> None:
                for source, name in pending:  # shared: each input is taken once
                    reply = await self._answer(_file_request(source), str(name))
                    extension = extension_for(reply.header("Content-Type"))
                    target = output / f"{name}{extension}"
                    target.parent.mkdir(parents=True, exist_ok=True)
                    assert isinstance(reply.body, bytes)
                    target.write_bytes(reply.body)
                    tally.add(str(name), reply.status)
                    bar.update(1)

            await asyncio.gather(*(work() for _ in range(self._config.concurrency)))

    async def _platform_input(self, environ: Mapping[str, str], tally: _Tally) -> None:
        text = environ.get("INPUT", "")
        target = datalake_target(environ.get("OUTPUT", ""))
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            lake = DataLake(session, environ)
            request = await _input_request(text, lake)
            reply = await self._answer(request, "INPUT")
            tally.add("INPUT", reply.status)
            assert isinstance(reply.body, bytes)
            if target is None:
                sys.__stdout__.buffer.write(reply.body)  # type: ignore[union-attr]
                sys.__stdout__.flush()  # type: ignore[union-attr]
            else:
                run_id = environ.get("ABEJA_RUN_ID", "")
                extension = extension_for(reply.header("Content-Type"))
                name = f"{run_id}_0{extension}"
                await lake.upload(target, name, reply)


async def _collected(invoker: Invoker, request: Request) -> EncodedResponse:
    """The handler's answer with a streamed body gathered, sync or async."""
    [reply] = await invoker.answer([request])
    if isinstance(reply.body, bytes):
        return reply
    try:
        body = b"".join([chunk async for chunk in chunks(reply.body)])
    except Exception as exc:
        return invoker.error_reply(exc)
    return EncodedResponse(reply.status, reply.headers, body)


def _progress(terminal: TextIO, length: int) -> Any:
    """A progress bar on a terminal; elsewhere one written where nobody reads it (click's
    ``hidden=`` is only in click 8.2: seldon-core's environments have 8.0)."""
    file = terminal if terminal.isatty() else io.StringIO()
    return click.progressbar(length=length, label="batch", file=file, show_pos=True)


def _terminal() -> TextIO:
    """Where the progress bar and the summary go: the real stderr, not the captured one."""
    stream = sys.__stderr__
    assert stream is not None
    return stream


def _request(content_type: str, contents: list[Content], headers: list[tuple[str, str]]) -> Request:
    return Request(
        http_method="POST",
        content_type=content_type,
        headers=headers,
        contents=contents,
        request_id=new_request_id(),
    )


def _file_request(path: Path) -> Request:
    """What an HTTP POST of the file would give the handler."""
    content_type = guess_content_type(path.name)
    headers = [("content-type", content_type), ("content-length", str(path.stat().st_size))]
    return _request(content_type, [Content(path.open("rb"))], headers)


async def _input_request(text: str, lake: DataLake) -> Request:
    """``INPUT`` as ABEJA Platform turns it into a request."""
    if not text.strip():
        return _request("", [], [])
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BatchJobError(f"INPUT is not JSON ({exc}); give a JSON object or array") from None
    if not isinstance(value, dict | list):
        raise BatchJobError(f"INPUT must be a JSON object or array, not {type(value).__name__}")
    if isinstance(value, dict) and DATALAKE_KEY in value:
        data, content_type, metadata = await lake.download(str(value[DATALAKE_KEY]))
        content = Content(io.BytesIO(data), metadata=metadata)
        return _request(content_type, [content], [("content-type", content_type)])
    body = io.BytesIO(text.encode())
    return _request("application/json", [Content(body)], [("content-type", "application/json")])
