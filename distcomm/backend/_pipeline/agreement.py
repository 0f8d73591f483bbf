"""The mismatch check: before a collective, the ranks of the group agree they call the same one.

Each rank digests what it is about to call (op, dtype, element count, root, reduce op; shapes are
shown, never compared: torch accepts (2, 3) on one rank and (6,) on another) into a 62-bit
fingerprint with blake2b (stable across processes, unlike ``hash()``), and one int64
all-reduce of 16 bytes, ``MIN`` of ``[f, -f]``, tells every rank the smallest and the largest
fingerprint. Equal: the call goes ahead. Different: the ranks gather their rows (op, shape,
dtype, root, call site) and every rank raises :class:`~distcomm.errors.CollectiveMismatchError`
with the table; the user's operation is not run and the communicator stays usable. A rank that
called no collective at all leaves the others in the check until the communicator's timeout,
which names it.

Which calls are checked (``DISTCOMM_DEBUG`` or ``init(debug=...)``): by default (``"sample"``)
the first 64 collectives of each communicator and then every 1024th (seq 64 + 1024 k), decided
from ``seq``, so every rank decides alike: the typical bug is there from the first step, but a
late, rare mismatch can be missed. ``"check"``: every collective. ``"off"``: none.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from distcomm.backend._pipeline import objects
from distcomm.errors import CollectiveMismatchError, InvalidArgumentError
from distcomm.protocol import ReduceOp

if TYPE_CHECKING:
    from distcomm.backend._pipeline.steps import Steps
    from distcomm.backend.arrays import Adapter
    from distcomm.backend.communicator import BaseCommunicator

__all__ = [
    "POLICIES",
    "SAMPLED_FIRST",
    "SAMPLE_EVERY",
    "agree",
    "check",
    "limits",
    "policy",
    "shape_of",
]

#: The values of ``DISTCOMM_DEBUG`` and ``init(debug=...)`` (unset: ``"sample"``).
POLICIES = ("sample", "check", "off")
#: The default checks collectives 1..SAMPLED_FIRST, then every SAMPLE_EVERY-th after it.
SAMPLED_FIRST = 64
SAMPLE_EVERY = 1024
_BITS = (1 << 62) - 1
_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep


def policy(value: Any = None, environ: Mapping[str, str] | None = None) -> str:
    """The check policy: ``value`` (from ``init(debug=...)``), else ``DISTCOMM_DEBUG``.

    Raises:
        InvalidArgumentError: a value that is not one of :data:`POLICIES`.
    """
    source = "debug"
    if value is None:
        value = (os.environ if environ is None else environ).get("DISTCOMM_DEBUG", "")
        source = "DISTCOMM_DEBUG"
        if not value.strip():
            return "sample"
    text = value.strip().lower() if isinstance(value, str) else value
    if text not in POLICIES:
        raise InvalidArgumentError(
            f"{source}={value!r} is not a check policy; valid: {', '.join(POLICIES)}. HINT: "
            "'check' checks every collective, 'off' none, 'sample' (the default) the first "
            f"{SAMPLED_FIRST} and every {SAMPLE_EVERY}th after."
        )
    return str(text)


def limits(name: str) -> tuple[int, bool]:
    """``(checked up to seq, sampled after it)`` for a policy."""
    if name == "check":
        return sys.maxsize, False
    if name == "off":
        return 0, False
    return SAMPLED_FIRST, True


def is_checked(seq: int, until: int, sampling: bool) -> bool:
    """Whether collective ``seq`` is checked under ``limits``."""
    return seq <= until or (sampling and not (seq - SAMPLED_FIRST) % SAMPLE_EVERY)


def next_checked(seq: int, until: int, sampling: bool) -> int:
    """The first collective from ``seq`` on that is checked under ``limits`` (``sys.maxsize``:
    none). Communicators keep it, so that a call tests one integer."""
    if seq <= until:
        return seq
    if not sampling:
        return sys.maxsize
    return SAMPLED_FIRST + -(-(seq - SAMPLED_FIRST) // SAMPLE_EVERY) * SAMPLE_EVERY


def check(
    comm: Steps,
    op: str,
    x: Any = None,
    adapter: Adapter | None = None,
    root: int | None = None,
    reduce_op: ReduceOp | None = None,
) -> None:
    """Agree with the other ranks of ``comm`` on the call about to be made (module docstring).

    Raises:
        CollectiveMismatchError: a rank called something else; every rank raises it.
    """
    dtype = numel = None
    if x is not None and adapter is not None:
        dtype, numel = adapter.dtype(x), adapter.numel(x)
    name = None if reduce_op is None else reduce_op.name
    fingerprint = _fingerprint(op, dtype, numel, root, name)
    channel = comm._object_channel()
    if not agree(channel, fingerprint):
        shape = None if x is None else shape_of(x)
        row = {"op": op, "shape": shape, "dtype": dtype, "numel": numel, "root": root}
        row.update(reduce_op=name, site=call_site())
        table = objects.all_gather_object(channel, row)
        raise CollectiveMismatchError(
            _message(comm, table), table=table, op=op, seq=comm.seq, group=comm.describe()
        )


@functools.lru_cache(maxsize=256)
def _fingerprint(*call: object) -> int:
    """62 bits of blake2b over the call's canonical text (stable across processes)."""
    digest = hashlib.blake2b("|".join(map(str, call)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _BITS


def agree(channel: BaseCommunicator, fingerprint: int) -> bool:
    """Whether every rank has ``fingerprint``: one 16-byte int64 MIN all-reduce of [f, -f]
    where the engine has it, else an object all-gather. The 16 bytes are the channel's own,
    made once (``_vote``) and written through a memoryview, so that a check allocates nothing."""
    vote = channel._vote
    if vote is None:
        vote = channel._vote = _vote_buffer(channel)
    if vote is False:
        return len(set(objects.all_gather_object(channel, fingerprint))) == 1
    buffer, pair = vote
    pair[0], pair[1] = fingerprint, -fingerprint
    channel._call(channel._all_reduce, False, buffer, ReduceOp.MIN)
    return bool(pair[0] == -pair[1])


def _vote_buffer(channel: BaseCommunicator) -> tuple[Any, Any] | bool:
    """A CPU int64 array of 2 of the array library the program uses, and a view to set and
    read it as Python ints; False where the engine has no int64 MIN or no array library is
    loaded."""
    if "int64" not in channel._native_dtypes or ReduceOp.MIN not in channel._native_ops:
        return False
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        buffer = numpy.zeros(2, dtype=numpy.int64)
        return buffer, memoryview(buffer).cast("B").cast("q")
    torch = sys.modules.get("torch")
    if torch is not None:
        buffer = torch.zeros(2, dtype=torch.int64)
        return buffer, buffer
    return False


def shape_of(x: Any) -> tuple[int, ...] | None:
    """``x``'s shape as a tuple of ints (None: it has none)."""
    shape = getattr(x, "shape", None)
    return None if shape is None else tuple(int(n) for n in shape)


def call_site(skip: tuple[str, ...] = ()) -> str:
    """``file:line`` of the innermost frame outside distcomm (and the files ``skip``): the
    user's call."""
    frame = sys._getframe(1)
    while frame is not None and (
        os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE)
        or frame.f_code.co_filename in skip
    ):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return "?"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _message(comm: Steps, table: list[dict[str, Any]]) -> str:
    lines = []
    for rank, row in enumerate(table):
        parts = [row["op"]]
        if row["dtype"] is not None:
            parts += [f"shape {row['shape']}", row["dtype"], f"{row['numel']} elements"]
        if row["root"] is not None:
            parts.append(f"root {row['root']}")
        if row["reduce_op"] is not None:
            parts.append(f"op {row['reduce_op']}")
        lines.append(f"  rank {rank}: {', '.join(map(str, parts))}  at {row['site']}")
    return (
        f"collective mismatch at operation #{comm.seq} on {comm.describe()}: the ranks did not "
        "call the same collective:\n" + "\n".join(lines) + "\nThe operation was not run; the "
        "communicator can still be used. HINT: every rank calls the same collectives in the "
        "same order, with the same element count, dtype, root and reduce op (look for a "
        "collective inside an if that only some ranks take)."
    )
