"""The frames between the front and its handler processes, and how they travel (:data:`VERSION`).

The front (:mod:`abeja_runtime.front`) speaks HTTP and gRPC; a handler process
(:mod:`abeja_runtime.worker.process`) only runs the handler. They talk over one Unix stream
socket pair per handler process (the front's end: ``front/processes.py``; what the front does
with the frames it reads: ``front/pool.py``), in frames::

    mark (1 byte, 0xAB) | kind (1 byte) | has_fd (1 byte) | length (4 bytes, big endian)
    | payload (length bytes)

The kind is the frame's class, numbered by :class:`FrameKind` (each class is given its number
where it is defined: ``@_kind(FrameKind.CALL)``); a new frame takes a new number, and a
number that changes changes :data:`VERSION`.

The mark makes bytes that are not a frame (a handler that writes to this socket's descriptor)
a :class:`ProtocolError` at once, where a length read from them would have made the front
wait for gigabytes that never come.

The payload is the frame's fields as a pickled tuple (both ends are this package, over a
private socket; a tuple pickles in well under a microsecond, a dataclass in several). A frame
may carry one file descriptor (``SCM_RIGHTS``, on its first byte): a body above
:data:`INLINE_LIMIT` travels as a memfd (or, above the spool threshold, as the front's spool
file), never byte by byte through the socket: 1 MiB through the socket took five round trips
of wake-ups and four copies, and halved the rate of 1 MiB requests.

The conversation: the front sends :class:`Start`; the handler process loads the handler and
answers :class:`Ready` (once warmed up, with ``--warmup``) or :class:`LoadFailed` (or exits
with :data:`EXIT_WARMUP_FAILED` when its warm-up failed). Then the front sends :class:`Call` and
:class:`RpcCall` frames, each with an id; the handler process answers each with :class:`Answer`
(followed, for a streamed body, by :class:`Chunk` frames and an :class:`End`) or
:class:`RpcAnswer`; a ``def`` handler's process at ``--concurrency 1`` writes each answer
**before** it reads the next call, so that a crash can lose only the call that was running
(with threads or an event loop, the calls that were running). A streamed body runs at most
:data:`STREAM_WINDOW` chunks and :data:`STREAM_WINDOW_BYTES` bytes (plus the chunk that crossed
them) ahead of its client: the front gives :class:`Credit` for the chunks the client took, and a
stream that has none left waits (its generator is not asked for more). A chunk above
:data:`INLINE_LIMIT` travels as a memfd, as a big body does. A process whose calls run on an
event loop says so (``Ready.writes_streams``); the front's direct path then sends each call with
its client's connection (:class:`Client`, just before the :class:`Call`), and the process
writes a streamed answer to the client itself (``Answer.written``, then only the :class:`End`,
with what it wrote: ``worker/client_streams.py``), a chunk never crossing the front.
The front may take back a call the process has not started (:class:`Cancel`,
:class:`GiveBack`): the process then answers :class:`GivenBack` instead. A closed socket tells
either side that the other is gone: the handler process finishes (the handler's teardown runs),
the front fails the calls that were running and sends the others to another process.
"""

from __future__ import annotations

import array
import contextlib
import enum
import mmap
import os
import pickle
import socket
import struct
import tempfile
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, NamedTuple, NoReturn, TypeVar

if TYPE_CHECKING:  # for the type only: config imports every style, and mapped.py imports this
    from abeja_runtime.config import Config
    from abeja_runtime.stream_limits import StreamEnd

__all__ = [
    "CREDIT_STEP",
    "CREDIT_STEP_BYTES",
    "EXIT_WARMUP_FAILED",
    "FDS_PER_WRITE",
    "INLINE_LIMIT",
    "STREAM_WINDOW",
    "STREAM_WINDOW_BYTES",
    "VERSION",
    "Answer",
    "BlockingChannel",
    "Call",
    "Cancel",
    "Chunk",
    "Client",
    "Credit",
    "End",
    "Fork",
    "Forked",
    "Frame",
    "FrameDecoder",
    "FrameKind",
    "GiveBack",
    "GivenBack",
    "LoadFailed",
    "Loaded",
    "ProtocolError",
    "Ready",
    "RpcAnswer",
    "RpcCall",
    "RunBatch",
    "Start",
    "Written",
    "anonymous_file",
    "encode_frame",
    "header_text",
    "memfd",
    "read_fd",
]

VERSION: Final = 10
#: A handler process's exit code when its warm-up failed (``worker/warmup.py``; EX_TEMPFAIL of
#: sysexits.h): the front replaces it with back-off, even before any process was ready.
EXIT_WARMUP_FAILED: Final = 75
#: Bodies (of calls and of answers) above this many bytes travel as a file descriptor.
INLINE_LIMIT: Final = 64 * 1024
_HEAD: Final = struct.Struct("!BBBI")
_HEAD_SIZE: Final = _HEAD.size
_MARK: Final = 0xAB
#: How much one read asks for: a few small requests at once, or a big piece of one.
READ_SIZE: Final = 256 * 1024
#: The most descriptors one write may carry (the frames of one loop iteration go in one write),
#: and room for them in a read: descriptors beyond a read's room would be lost.
FDS_PER_WRITE: Final = 32
_FD_SPACE: Final = socket.CMSG_SPACE(array.array("i", [0]).itemsize * FDS_PER_WRITE)
#: ``recvmsg``'s flags as plain ints: each read pays no ``enum.IntFlag`` operator.
_CLOEXEC: Final = int(getattr(socket, "MSG_CMSG_CLOEXEC", 0))  # Linux's; macOS has none
_CTRUNC: Final = int(socket.MSG_CTRUNC)
_DONTWAIT: Final = int(socket.MSG_DONTWAIT)
#: How many chunks a streamed body may run ahead of its client: what the front holds of a
#: stream whose client reads slowly (the generator waits), per stream, so that one slow reader
#: holds up its own stream and no other call of its process.
STREAM_WINDOW: Final = 8
#: ... and how many bytes: a chunk may still be sent while fewer than these are ahead, so the
#: front holds at most this plus one chunk of a stream (HTTP/2's default window is 64 KiB,
#: Envoy buffers 1 MiB a connection). Counted in chunks alone, four clients that read nothing
#: of streams of 32 MiB chunks held 1 GiB in the front.
STREAM_WINDOW_BYTES: Final = 1024 * 1024
#: The front gives credit back in steps of this many chunks, or of this many bytes, whichever
#: comes first (a frame per chunk would double the frames of a stream).
CREDIT_STEP: Final = STREAM_WINDOW // 2
CREDIT_STEP_BYTES: Final = STREAM_WINDOW_BYTES // 2


class FrameKind(enum.IntEnum):
    """The kind byte of each frame class: its number on the wire (see :data:`VERSION`)."""

    START = 0
    READY = 1
    LOAD_FAILED = 2
    CALL = 3
    RPC_CALL = 4
    CANCEL = 5
    ANSWER = 6
    CHUNK = 7
    END = 8
    RPC_ANSWER = 9
    GIVE_BACK = 10
    GIVEN_BACK = 11
    CREDIT = 12
    RUN_BATCH = 13
    LOADED = 14
    FORK = 15
    FORKED = 16
    CLIENT = 17


_F = TypeVar("_F", bound=type[tuple[Any, ...]])
#: Each frame class's kind (plain ints: what ``encode_frame`` packs), and each kind's class.
_KIND_OF: Final[dict[type[Any], int]] = {}
_CLASS_OF: Final[dict[FrameKind, type[Any]]] = {}


def _kind(kind: FrameKind) -> Callable[[_F], _F]:
    """Gives the frame class it decorates its kind (a kind given twice fails at import)."""

    def give(cls: _F) -> _F:
        if kind in _CLASS_OF:
            raise RuntimeError(f"{kind!r} is {_CLASS_OF[kind].__name__}'s, not {cls.__name__}'s")
        _KIND_OF[cls] = int(kind)
        _CLASS_OF[kind] = cls
        return cls

    return give


@_kind(FrameKind.START)
class Start(NamedTuple):
    """Front → handler process, first: the settings."""

    version: int
    config: Config
    #: The process is the template that handler processes are forked from
    #: (``worker/template.py``), not one itself.
    template: bool = False


@_kind(FrameKind.READY)
class Ready(NamedTuple):
    """Handler process → front: the handler is loaded (and warmed up, with ``--warmup``);
    requests may come."""

    version: int
    style: str
    #: Paths of the service port that the front answers itself for this style (KServe's
    #: ``/metrics``).
    front_paths: tuple[str, ...]
    #: gRPC methods the style serves (full names); empty when it has no gRPC protocol.
    rpc_methods: tuple[str, ...]
    #: The handler's own batch size and wait (``@abeja_runtime.batched``), when it declared
    #: them and the settings did not turn batching on.
    batch: tuple[int, float] | None = None
    #: Seconds the handler's import took, in this process or in the template it was forked
    #: from (``forked``).
    load_seconds: float = 0.0
    forked: bool = False
    #: It writes streamed answers to their clients itself (:class:`Client`): its calls run on
    #: an event loop, not in batches.
    writes_streams: bool = False


@_kind(FrameKind.LOAD_FAILED)
class LoadFailed(NamedTuple):
    """Handler process → front: the handler could not be loaded; the process exits."""

    text: str
    details: str


@_kind(FrameKind.CALL)
class Call(NamedTuple):
    """Front → handler process: one HTTP request, its body read whole by the front.

    ``body`` is the body itself, or ``None`` when it travels as the frame's descriptor: the
    first ``body_size`` bytes of a memfd the front reuses, or a spool file whose name
    ``spool_path`` gives the handler's file object.
    """

    id: int
    method: str
    raw_path: str
    raw_query: str
    #: The header lines as they came, every one of them (a name sent twice is two pairs), in
    #: bytes: the front passes on its parser's own (aiohttp's ``raw_headers``), and the handler
    #: process decodes them (:func:`header_text`).
    headers: tuple[tuple[bytes, bytes], ...]
    request_id: str
    requester_id: str | None
    body: bytes | None
    spool_path: str
    body_size: int
    #: The front's server span, as the handler span's parent (``traceparent`` and its kin:
    #: :mod:`abeja_runtime.tracing`); empty while tracing is off.
    trace: tuple[tuple[str, str], ...] = ()
    #: The latest its handler may start (``time.time()``; 0: any time): its deadline less the
    #: time a call takes (``Scheduler.start_by``). The handler process answers ``504`` without
    #: starting its handler after it: no answer could come in time.
    start_by: float = 0.0


def header_text(headers: tuple[tuple[bytes, bytes], ...]) -> list[tuple[str, str]]:
    """:attr:`Call.headers` as text, decoded as aiohttp decodes the headers it parses (UTF-8,
    a byte that is not kept as a lone surrogate). Decoded here rather than in the front, whose
    work is the service's limit: passing the parser's bytes on costs it nothing, where
    making ``str`` pairs of aiohttp's ``istr`` names cost 0.3 µs a request (and pickling the
    names as ``istr`` six times that)."""
    return [
        (name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape"))
        for name, value in headers
    ]


@_kind(FrameKind.RPC_CALL)
class RpcCall(NamedTuple):
    """Front → handler process: one unary gRPC call, its message as the client's bytes.

    ``payload`` is the message, or empty when it travels as the frame's descriptor: the first
    ``size`` bytes of a memfd the front reuses, as a :class:`Call`'s body above
    :data:`INLINE_LIMIT` (a 50 MiB message pickled into the frame was copied three times).
    """

    id: int
    method: str
    payload: bytes
    metadata: tuple[tuple[str, str], ...]
    request_id: str
    size: int = 0
    #: As :attr:`Call.trace` and :attr:`Call.start_by`.
    trace: tuple[tuple[str, str], ...] = ()
    start_by: float = 0.0


@_kind(FrameKind.CANCEL)
class Cancel(NamedTuple):
    """Front → handler process: nobody waits for call ``id`` any more (its deadline passed, its
    client left). A call not started yet is :class:`GivenBack`; a running ``async def``
    handler's call is cancelled (and answered, the answer dropped); a running ``def`` handler's
    call cannot be stopped and runs to its end."""

    id: int


@_kind(FrameKind.GIVE_BACK)
class GiveBack(NamedTuple):
    """Front → handler process: if call ``id`` has not started, do not run it but give it back
    (:class:`GivenBack`), for another process. The front asks for the calls waiting in a
    process behind one that turned out slow; a call that started already is answered as usual.
    """

    id: int


@_kind(FrameKind.GIVEN_BACK)
class GivenBack(NamedTuple):
    """Handler process → front: call ``id`` was not run (see :class:`GiveBack`, :class:`Cancel`)."""

    id: int


@_kind(FrameKind.ANSWER)
class Answer(NamedTuple):
    """Handler process → front: the answer to :class:`Call` ``id``.

    ``body`` is the body, or ``None`` when it travels as the frame's descriptor (a memfd) or,
    with ``streamed``, as the :class:`Chunk` frames that follow until :class:`End`.
    """

    id: int
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes | None
    streamed: bool
    #: The handler raised (the body is the runtime's 500): an async request reports a failure.
    failed: bool = False
    #: A streamed answer that the process writes to the client itself (its :class:`Client`):
    #: no :class:`Chunk` follows, only the :class:`End`, with what was written.
    written: bool = False


@_kind(FrameKind.CHUNK)
class Chunk(NamedTuple):
    """Handler process → front: the next piece of streamed answer ``id``'s body; ``None``
    when it is above :data:`INLINE_LIMIT` and came as the frame's memfd."""

    id: int
    data: bytes | None


@_kind(FrameKind.CREDIT)
class Credit(NamedTuple):
    """Front → handler process: the client of streamed answer ``id`` took ``chunks`` more of its
    chunks, ``size`` bytes in all, so that as many more may come (see :data:`STREAM_WINDOW`)."""

    id: int
    chunks: int
    size: int


@_kind(FrameKind.RUN_BATCH)
class RunBatch(NamedTuple):
    """Front → handler process: run the calls ``ids`` (sent just before) as one batch, one
    call of the handler (``--max-batch-size``); each is answered on its own."""

    ids: tuple[int, ...]


@_kind(FrameKind.END)
class End(NamedTuple):
    """The end of a streamed body; ``failed`` when the handler's generator raised."""

    id: int
    failed: bool
    #: What the process wrote to the client itself (an :attr:`Answer.written` stream).
    written: Written | None = None


class Written(NamedTuple):
    """What a handler process wrote of a stream to its client (:attr:`End.written`)."""

    #: How it ended.
    end: StreamEnd
    #: The body's bytes written (its chunks, without their framing), and its chunks.
    size: int
    chunks: int
    #: When its head and first chunk were written (``time.time()``; 0: nothing was), and the
    #: seconds between each chunk and the one before.
    first_chunk_at: float
    gaps: tuple[float, ...]


@_kind(FrameKind.CLIENT)
class Client(NamedTuple):
    """Front → handler process, just before the :class:`Call` ``id`` it belongs to: the call's
    client connection (the frame's descriptor), so that the process writes a streamed answer to
    the client itself, a :class:`Chunk` never crossing the front (``Answer.written``). Only to
    a process that said it can (``Ready.writes_streams``). ``close``: the answer ends the
    connection (``Connection: close`` in its head)."""

    id: int
    close: bool


@_kind(FrameKind.RPC_ANSWER)
class RpcAnswer(NamedTuple):
    """Handler process → front: the answer to :class:`RpcCall` ``id``: ``code`` 0 (OK) and the
    response message's bytes (above :data:`INLINE_LIMIT`, in the frame's descriptor, a memfd,
    as an :class:`Answer`'s body), or a gRPC status code's value and its message."""

    id: int
    code: int
    payload: bytes
    message: str
    #: The HTTP status the access log and the metrics count for it.
    http_status: int


@_kind(FrameKind.LOADED)
class Loaded(NamedTuple):
    """Template → front: the handler is loaded; workers may be forked from it, unless
    ``hazard`` says why a fork would not be safe (the template exits then)."""

    hazard: str


@_kind(FrameKind.FORK)
class Fork(NamedTuple):
    """Front → template: fork a handler process whose end of its socket with the front is the
    frame's descriptor, with these variables added to its environment (``--devices``)."""

    environment: tuple[tuple[str, str], ...]


@_kind(FrameKind.FORKED)
class Forked(NamedTuple):
    """Template → front, one for each :class:`Fork`, in order: the new process's pid, or 0 and
    why the fork failed."""

    pid: int
    error: str


Frame = (
    Start | Ready | LoadFailed | Call | RpcCall | Cancel | GiveBack
    | Answer | Chunk | End | RpcAnswer | GivenBack | Credit | RunBatch
    | Loaded | Fork | Forked | Client
)  # fmt: skip
#: The frame class of each kind byte, by index (every kind has one: a gap fails at import).
_KINDS: Final[tuple[type[Any], ...]] = tuple(_CLASS_OF[kind] for kind in FrameKind)
_KIND_COUNT: Final = len(_KINDS)


def encode_frame(frame: Frame, *, has_fd: bool = False) -> bytes:
    payload = pickle.dumps(tuple(frame), pickle.HIGHEST_PROTOCOL)
    return _HEAD.pack(_MARK, _KIND_OF[type(frame)], has_fd, len(payload)) + payload


class ProtocolError(Exception):
    """What arrived on a channel is not this protocol's frames (bytes a handler wrote to the
    channel's descriptor), or lost part of itself on the way (descriptors a process had no
    room for): nothing read after it can be trusted, and the process at the other end is
    replaced."""


class FrameDecoder:
    """Bytes and descriptors in, frames out, whatever pieces they arrive in."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._fds: deque[int] = deque()

    def feed(self, data: bytes | memoryview, fds: list[int]) -> list[tuple[Frame, int | None]]:
        """The frames completed by ``data``, each with its descriptor (or None). On a
        :class:`ProtocolError` the descriptors of the frames read before it are closed (the
        rest are :meth:`close`'s)."""
        self._fds.extend(fds)
        frames: list[tuple[Frame, int | None]] = []
        try:
            self._decode(data, frames)
        except ProtocolError:
            for _, fd in frames:
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            raise
        return frames

    def _decode(self, data: bytes | memoryview, frames: list[tuple[Frame, int | None]]) -> None:
        """The whole frames of what was kept plus ``data``; the rest is kept. When nothing was
        kept (the usual case: a read ends on a frame's end), the frames are read from ``data``
        itself, not from a copy. Hot: every answer passes here."""
        buffer = self._buffer
        if not buffer:
            read = self._read_frames(data, frames)
            if read < len(data):
                buffer += data[read:]
            return
        buffer += data
        read = self._read_frames(buffer, frames)
        if read:
            del buffer[:read]

    def _read_frames(
        self, source: bytes | bytearray | memoryview, frames: list[tuple[Frame, int | None]]
    ) -> int:
        """Append the whole frames at the start of ``source`` to ``frames``; how many bytes
        they took."""
        end = len(source)
        start = 0
        view = memoryview(source)
        try:
            while end - start >= _HEAD_SIZE:
                mark, kind, has_fd, length = _HEAD.unpack_from(source, start)
                if mark != _MARK or kind >= _KIND_COUNT or has_fd > 1:
                    raise ProtocolError(
                        f"bytes that are not a frame: {bytes(source[start : start + 24])!r}"
                    )
                stop = start + _HEAD_SIZE + length
                if stop > end:
                    break
                try:
                    frame = _KINDS[kind]._make(pickle.loads(view[stop - length : stop]))
                except Exception as exc:
                    raise ProtocolError(
                        f"a {_KINDS[kind].__name__} frame that cannot be read: {exc}"
                    ) from None
                if has_fd and not self._fds:
                    raise ProtocolError(
                        f"a {_KINDS[kind].__name__} frame came without its descriptor"
                    )
                frames.append((frame, self._fds.popleft() if has_fd else None))
                start = stop
        finally:
            view.release()  # else a bytearray cannot be resized
        return start

    def close(self) -> None:
        """Close descriptors that arrived for frames never completed."""
        while self._fds:
            with contextlib.suppress(OSError):
                os.close(self._fds.popleft())


def read_buffer() -> memoryview:
    """The buffer :func:`receive` reads into, one per socket, reused for every read (a fresh
    256 KiB object per read cost an mmap, an mremap and a munmap each time). Anonymous memory,
    not a ``bytearray``: its pages are resident only once a frame reached them (a bytearray
    is zeroed, all of it, when it is made), so small frames keep 4 KiB of it, not 256."""
    return memoryview(mmap.mmap(-1, READ_SIZE))


def receive(sock: socket.socket, into: memoryview, flags: int = 0) -> tuple[memoryview, list[int]]:
    """One read into ``into``: the bytes (a view of ``into``, valid until the next read; empty:
    closed) and any descriptors that came with them. ``flags``: ``recvmsg``'s."""
    # (Not inherited by what a handler runs: a client's connection kept open by a child.)
    size, ancillary, flags, _ = sock.recvmsg_into([into], _FD_SPACE, flags | _CLOEXEC)
    data = into[:size]
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            received = array.array("i")
            received.frombytes(payload[: len(payload) - len(payload) % received.itemsize])
            fds.extend(received)
    if flags & _CTRUNC:  # descriptors were dropped: their frames are lost
        for fd in fds:  # and those that came are of no use
            with contextlib.suppress(OSError):
                os.close(fd)
        raise ProtocolError(
            "descriptors sent with frames were lost: this process has no room for more open "
            f"files (ulimit -n is {_open_files_limit()}; a handler that opens files and never "
            "closes them runs out)"
        )
    return data, fds


def _open_files_limit() -> str:
    try:
        import resource  # not on every system

        return str(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    except (ImportError, OSError, ValueError):
        return "unknown"


def anonymous_file() -> int:
    """A file with no name, in memory where the system has memfds (Linux), else an unlinked
    temporary file (macOS, for the CLI's local engine)."""
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is not None:
        fd: int = memfd_create("abeja-body", os.MFD_CLOEXEC)
        return fd
    fd, path = tempfile.mkstemp(prefix="abeja-body-")
    os.unlink(path)
    return fd


def memfd(chunks: list[bytes]) -> int:
    """A file in memory holding ``chunks``, at offset 0 (the caller closes it)."""
    fd = anonymous_file()
    try:
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_fd(fd: int) -> bytes:
    """All of a memfd's bytes; the descriptor is closed."""
    with os.fdopen(fd, "rb") as file:
        return file.read()


class BlockingChannel:
    """The handler process's end: blocking reads of whole frames, writes with descriptors."""

    def __init__(
        self,
        sock: socket.socket,
        broken: Callable[[ProtocolError], NoReturn] | None = None,
        cancelled: Callable[[int], None] | None = None,
        granted: Callable[[int, int, int], None] | None = None,
    ) -> None:
        self._sock = sock
        #: Called with what broke the protocol, on whichever thread read it (else raised).
        self._broken = broken
        #: Called with the id of each :class:`Cancel` as it is read, whichever thread reads it:
        #: a call that runs stops if it can (one waiting here is taken back: :meth:`taken_back`).
        self._cancelled = cancelled
        #: Called with each :class:`Credit` as it is read, which no reader is given: a stream
        #: waiting for its client goes on whoever reads.
        self._granted = granted
        self._decoder = FrameDecoder()
        self._into = read_buffer()
        self._ready: deque[tuple[Frame, int | None]] = deque()
        self._write_lock = threading.Lock()  # handler threads answer on their own
        #: Held while reading (and while waiting for frames): :meth:`taken_back` runs on a
        #: thread of its own while the main thread runs a call.
        self._read_lock = threading.Lock()

    def close_pending(self) -> None:
        """Close the descriptors of the frames read and not taken yet (a process forked from
        the template must not hold the sockets of the forks asked after its own)."""
        while self._ready:
            _, fd = self._ready.popleft()
            if fd is not None:
                os.close(fd)

    def detach(self) -> int:
        """The socket's descriptor, which the channel no longer uses or closes (a process forked
        from the template takes its number for its own channel)."""
        return self._sock.detach()

    def read(self) -> tuple[Frame, int | None] | None:
        """The next frame and its descriptor; ``None`` once the front has closed the socket."""
        with self._read_lock:
            while not self._ready:
                if not self._take_in(0):
                    return None
            return self._ready.popleft()

    def fileno(self) -> int:
        return self._sock.fileno()

    def read_ready(self) -> tuple[deque[tuple[Frame, int | None]], bool]:
        """The frames that have come, read without waiting (by an event loop that saw the
        socket readable), all the socket holds; and whether it is still open (``False`` once
        the front has closed it, or it failed: then after the frames that came before)."""
        with self._read_lock:
            still_open = True
            with contextlib.suppress(BlockingIOError, InterruptedError):
                while still_open:
                    still_open = self._take_in(_DONTWAIT)
            ready, self._ready = self._ready, deque()
            return ready, still_open

    def wait_until(
        self,
        done: Callable[[], bool],
        give_back: Callable[[Call | RpcCall, int | None], None],
    ) -> bool:
        """Read frames as they come until ``done()`` (checked with the reading lock held, so
        that no other reader takes in what would make it true unseen); ``False`` once the
        front has closed the socket. For a stream on the thread that reads the frames itself,
        waiting for its :class:`Credit` (or its :class:`Cancel`). The calls the front takes
        back meanwhile go to ``give_back`` (:meth:`taken_back` cannot run while this holds the
        lock); what else comes waits in order for :meth:`read`."""
        with self._read_lock:
            while not done():
                if not self._take_in(0):
                    return False
                for frame, fd in self._taken_back():
                    give_back(frame, fd)
            return True

    def _take_in(self, flags: int) -> bool:
        """One read's frames into the ready ones (credits granted, cancels said); ``False``
        when the socket is closed."""
        try:
            data, fds = receive(self._sock, self._into, flags)
            if not data:
                return False
            frames = self._decoder.feed(data, fds)
        except ConnectionError:
            return False
        except ProtocolError as exc:
            if self._broken is None:
                raise
            self._broken(exc)
        for item in frames:
            frame = item[0]
            if isinstance(frame, Credit) and self._granted is not None:
                self._granted(frame.id, frame.chunks, frame.size)
                continue
            if isinstance(frame, Cancel) and self._cancelled is not None:
                self._cancelled(frame.id)
            self._ready.append(item)
        return True

    def taken_back(self) -> list[tuple[Call | RpcCall, int | None]]:
        """The calls read and not started that the front took back since (a :class:`Cancel`
        or :class:`GiveBack` came behind them): :meth:`read` will not return them. Reads what
        the socket holds now, without waiting; nothing while another thread reads."""
        if not self._read_lock.acquire(blocking=False):
            return []
        try:
            return self._taken_back()
        finally:
            self._read_lock.release()

    def _taken_back(self) -> list[tuple[Call | RpcCall, int | None]]:
        with contextlib.suppress(BlockingIOError, InterruptedError):
            self._take_in(_DONTWAIT)
        wanted = {frame.id for frame, _ in self._ready if isinstance(frame, Cancel | GiveBack)}
        if not wanted:
            return []
        taken: list[tuple[Call | RpcCall, int | None]] = []
        kept: deque[tuple[Frame, int | None]] = deque()
        for item in self._ready:
            frame = item[0]
            if isinstance(frame, Call | RpcCall) and frame.id in wanted:
                taken.append((frame, item[1]))
            elif not isinstance(frame, Cancel | GiveBack):  # those of calls run already: spent
                kept.append(item)
        self._ready = kept
        return taken

    def write(self, frame: Frame, fd: int | None = None) -> None:
        data = encode_frame(frame, has_fd=fd is not None)
        with self._write_lock:
            if fd is None:
                self._sock.sendall(data)
                return
            sent = self._sock.sendmsg([data], [_rights(fd)])
            if sent < len(data):
                self._sock.sendall(data[sent:])


def _rights(fd: int) -> tuple[int, int, bytes]:
    return (socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]).tobytes())
