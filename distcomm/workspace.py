"""Gather tensors or objects from a set of ranks to the first of them through files.

The ranks on the first rank's node hand their data over through shared memory (files in
``/dev/shm``); with ``directory=`` (a directory every node sees, such as NFS) every rank writes
a file there. Only a few bytes of description travel through the communicator, so a large
tensor costs one copy on the writer and one on the reader, however slow the engine is.
Ranks on another node than the first, without a shared directory, send their data through the
communicator instead.

What this module promises:

- Every file is named ``distcomm-<job>-c<call>-r<rank>-<random>``, created with mode 0600 and
  ``O_EXCL`` (two jobs on one host never collide), written under a temporary name and renamed
  when complete, so a reader never sees half a file.
- Nothing is left behind: the first rank removes each file once it has read it, each writer
  removes its own after the exchange, and files still there when the process exits or gets
  SIGTERM are removed then. (Not after SIGKILL: nothing can run then.)
- The first rank gets owned copies: CPU tensors or arrays, valid as long as it likes.
- A rank that fails while preparing its data (a bad tensor, a full disk) tells the others:
  every rank raises (the failed one its own exception, the others
  :class:`~distcomm.errors.RankFailedError`), none waits.

Every rank of ``group`` must call, in the same order; ranks not in ``ranks`` get ``[]``.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import itertools
import mmap
import os
import re
import secrets
import signal
import socket
import tempfile
import threading
from collections.abc import Sequence
from typing import Any

from distcomm import _workspace_codec as codecs
from distcomm._files import private_folders
from distcomm._peer_failures import Failure
from distcomm._runtime.collectives import resolve_group
from distcomm.errors import InvalidArgumentError
from distcomm.protocol import Communicator

__all__ = ["gather_objects", "gather_tensors", "live_files", "shared_memory_dir"]

_calls = itertools.count()
_live: set[str] = set()
_live_lock = threading.Lock()
_handler_installed = False


@dataclasses.dataclass(frozen=True)
class _Note:
    """What a writer tells the first rank: where its data is and how to read it."""

    host: str
    path: str
    nbytes: int
    meta: Any
    ranks: tuple[int, ...]


def gather_tensors(
    tensor: Any,
    ranks: Sequence[int] | None = None,
    *,
    group: Any = None,
    directory: str | os.PathLike[str] | None = None,
) -> list[Any]:
    """Gather ``tensor`` from each rank in ``ranks`` to ``ranks[0]``.

    Args:
        tensor: a torch.Tensor (any device; it is copied to host memory) or a numpy array.
            The ranks' tensors may differ in shape and dtype.
        ranks: ranks of ``group``, the first receiving; default: all of them.
        group: the communicator (default: the default communicator).
        directory: a directory all ranks see, for ranks on several nodes; default: shared
            memory on this node.

    Returns:
        On ``ranks[0]``, the tensors in the order of ``ranks``: CPU copies of the same type,
        dtype and shape as each rank's. On every other rank, ``[]``.

    Raises:
        InvalidArgumentError: ``ranks`` is not a list of distinct ranks of the group.
        RankFailedError: another rank failed to hand its tensor over.
    """
    return _gather(tensor, codecs.TENSORS, ranks, group, directory, "gather_tensors")


def gather_objects(
    obj: Any,
    ranks: Sequence[int] | None = None,
    *,
    group: Any = None,
    directory: str | os.PathLike[str] | None = None,
) -> list[Any]:
    """Gather a picklable ``obj`` (a config, a dict of weights) from ``ranks`` to ``ranks[0]``.

    As :func:`gather_tensors`; objects travel pickled (protocol 5), and ``ranks[0]`` gets
    unpickled copies, its own included.
    """
    return _gather(obj, codecs.OBJECTS, ranks, group, directory, "gather_objects")


def live_files() -> list[str]:
    """Paths this process has created and not yet removed (empty between exchanges)."""
    with _live_lock:
        return sorted(_live)


def shared_memory_dir() -> str:
    """Where node-local exchanges put their files: ``/dev/shm``, else the temp directory."""
    shm = "/dev/shm"
    return (
        shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else tempfile.gettempdir()
    )


# -- the exchange --------------------------------------------------------------------------------
def _gather(
    value: Any,
    codec: codecs.Codec,
    ranks: Sequence[int] | None,
    group: Any,
    directory: str | os.PathLike[str] | None,
    where: str,
) -> list[Any]:
    comm = resolve_group(group)
    members = _check_ranks(ranks, comm.world_size)
    folder = shared_memory_dir() if directory is None else os.fspath(directory)
    me, first = comm.rank, members[0]
    if comm.world_size == 1:
        return [codecs.copy(codec, value)]
    note: _Note | Failure | None = None
    own: Any = None
    error: BaseException | None = None
    if me in members:
        try:
            if me == first:
                own = codecs.copy(codec, value)
            else:
                note = _write(codec, value, folder, comm, members, directory is not None)
        except BaseException as exc:
            note, error = Failure.now(me), exc
    try:
        notes = comm.gather_object(note, first)
        if me == first:
            assert notes is not None
            mine = (own, note if isinstance(note, Failure) else None, error)
            return _read_all(comm, codec, members, notes, mine, directory is not None, where)
        failed, remote = comm.broadcast_object(None, first)
        if me in remote:
            assert isinstance(note, _Note)
            comm.gather_object(codec.encode(value)[1].tobytes(), first)
        elif remote:
            comm.gather_object(None, first)
        if error is not None:
            raise error
        if failed is not None:
            raise failed.error(where)
        return []
    finally:
        if isinstance(note, _Note):
            _remove(note.path)


def _read_all(
    comm: Communicator,
    codec: codecs.Codec,
    members: tuple[int, ...],
    notes: list[Any],
    mine: tuple[Any, Failure | None, BaseException | None],
    shared_dir: bool,
    where: str,
) -> list[Any]:
    """On the first rank: read every writer's file, tell the writers, fetch remote data.

    ``mine``: this rank's own copy, or its failure and exception.
    """
    own, failed, error = mine
    values: list[Any] = [own, *[None] * (len(members) - 1)]
    remote: list[int] = []
    failed = failed or next((n for n in notes if isinstance(n, Failure)), None)
    host = _host()
    try:
        if failed is None:
            for index, rank in enumerate(members[1:], 1):
                note = _check_note(notes[rank], rank, members)
                if note.host != host and not shared_dir:
                    remote.append(rank)
                    continue
                try:
                    values[index] = _load(codec, note, shared_dir)
                except FileNotFoundError:
                    if shared_dir:
                        raise
                    remote.append(rank)  # the same host name, but another /dev/shm
    except BaseException as exc:
        error, failed = exc, Failure.now(comm.rank)
    finally:
        for note in notes:
            if isinstance(note, _Note) and (shared_dir or note.host == host):
                _remove(note.path)
    comm.broadcast_object((failed, tuple(remote)), comm.rank)
    if remote:
        sent = comm.gather_object(None, comm.rank)
        assert sent is not None
        for rank in remote:
            note = notes[rank]
            holder, view = codec.allocate(note.meta, note.nbytes)
            view[:] = sent[rank]
            values[members.index(rank)] = codec.finish(holder)
    if error is not None:
        raise error
    if failed is not None:
        raise failed.error(where)
    return values


def _check_note(note: Any, rank: int, members: tuple[int, ...]) -> _Note:
    if not isinstance(note, _Note):
        raise InvalidArgumentError(
            f"rank {rank} wrote nothing, so it was not called with ranks={list(members)}. "
            "HINT: every rank must pass the same ranks."
        )
    if note.ranks != members:
        raise InvalidArgumentError(
            f"rank {rank} was called with ranks={list(note.ranks)}, this rank with "
            f"{list(members)}. HINT: every rank must pass the same ranks."
        )
    return note


def _check_ranks(ranks: Sequence[int] | None, world_size: int) -> tuple[int, ...]:
    if ranks is None:
        return tuple(range(world_size))
    try:
        members = tuple(ranks)
    except TypeError:
        members = ()
    valid = (
        members
        and all(isinstance(r, int) and not isinstance(r, bool) for r in members)
        and all(0 <= r < world_size for r in members)
        and len(set(members)) == len(members)
    )
    if not valid:
        raise InvalidArgumentError(
            f"ranks={ranks!r} must be a non-empty list of distinct ranks in 0..{world_size - 1} "
            "(ranks of the group in use), the first of which receives. HINT: e.g. "
            f"ranks=[0, 1] or ranks=None for all {world_size}."
        )
    return members


# -- files ---------------------------------------------------------------------------------------
def _write(
    codec: codecs.Codec,
    value: Any,
    folder: str,
    comm: Communicator,
    members: tuple[int, ...],
    shared_dir: bool,
) -> _Note:
    meta, data = codec.encode(value)
    if shared_dir:
        private_folders(folder)
    name = f"distcomm-{_job(comm)}-c{next(_calls)}-r{comm.rank}-{secrets.token_hex(4)}"
    path = os.path.join(folder, name)
    temporary = path + ".part"
    _register(temporary, path)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        written = 0
        while written < data.nbytes:
            written += os.write(fd, data[written:])
    finally:
        os.close(fd)
    os.rename(temporary, path)
    _remove(temporary)
    return _Note(_host(), path, data.nbytes, meta, members)


def _load(codec: codecs.Codec, note: _Note, shared_dir: bool) -> Any:
    """The value in a writer's file: a private mapping of shared memory (no copy; the pages
    stay this process's after the file is removed), or a read copy from a shared directory
    (a mapping there would keep a network file system's file alive)."""
    if shared_dir:
        holder, view = codec.allocate(note.meta, note.nbytes)
        _read_into(note.path, view)
        return codec.finish(holder)
    fd = os.open(note.path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size != note.nbytes:
            raise InvalidArgumentError(
                f"{note.path} holds {size} bytes where {note.nbytes} were written. HINT: another "
                "process changed it; do not touch distcomm-* files."
            )
        if not size:
            return codec.from_buffer(note.meta, bytearray())
        prot = mmap.PROT_READ | mmap.PROT_WRITE
        return codec.from_buffer(note.meta, mmap.mmap(fd, size, mmap.MAP_PRIVATE, prot))
    finally:
        os.close(fd)


def _read_into(path: str, view: memoryview) -> None:
    with open(path, "rb", buffering=0) as file:
        got = 0
        while got < view.nbytes:
            n = file.readinto(view[got:])
            if not n:
                raise InvalidArgumentError(
                    f"{path} holds {got} bytes where {view.nbytes} were written. HINT: another "
                    "process changed it; do not touch distcomm-* files."
                )
            got += n


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    with _live_lock:
        _live.discard(path)


def _register(*paths: str) -> None:
    with _live_lock:
        _live.update(paths)
    _install_cleanup()


def _cleanup() -> None:
    for path in live_files():
        _remove(path)


def _install_cleanup() -> None:
    """Remove live files at exit and on SIGTERM (chaining to the handler that was there)."""
    global _handler_installed
    if _handler_installed or threading.current_thread() is not threading.main_thread():
        return
    _handler_installed = True
    atexit.register(_cleanup)
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_IGN:
        return

    def on_sigterm(signum: int, frame: Any) -> None:
        _cleanup()
        if callable(previous):
            previous(signum, frame)
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)


_host_key: str | None = None


def _host() -> str:
    """This machine: host name and boot id (a container's host name alone may repeat)."""
    global _host_key
    if _host_key is None:
        try:
            with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as file:
                boot = file.read().strip()
        except OSError:
            boot = ""
        _host_key = f"{socket.gethostname()}/{boot}"
    return _host_key


def _job(comm: Communicator) -> str:
    launch = getattr(comm, "launch", None)
    job = getattr(launch, "job_id", None) or f"pid{os.getpid()}"
    return re.sub(r"[^A-Za-z0-9_.]", "_", str(job))[:40]
