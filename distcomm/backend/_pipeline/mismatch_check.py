"""The mismatch check: the ranks of a group agree that they make the same collectives.

Every collective folds its signature (op, dtype, element count, root, reduce op) into the
communicator's running value (:mod:`~distcomm.backend._pipeline.history`; shapes are shown,
never compared: torch accepts (2, 3) on one rank and (6,) on another). The ranks compare
running values, so that nothing slips through:

- at the check points of the policy, before the collective is issued: one int64 all-reduce of
  16 bytes, ``MIN`` of ``[v, -v]`` (:func:`agree`), at the same ``seq`` on every rank, so that
  the checks' collectives always meet each other in the engine;
- before a call whose signature the ranks have never agreed on (a new size, dtype, op, root; a
  communicator's first ``barrier``), at a ``barrier`` after uneven all-to-alls whose split
  tables wait to be compared, and in ``finalize()``: a vote of point-to-point messages
  (:mod:`~distcomm.backend._pipeline.p2p_vote`), which a rank that called something else
  cannot meet with a collective of its own: the mismatch never reaches the engine;
- when an operation times out or its engine fails: out of band
  (:mod:`~distcomm.backend._pipeline.engine_failures`);
- the split tables of uneven all-to-alls, which differ from rank to rank by design and stay out
  of the running value: compared at a check point, kept between check points and settled at
  the next one, barrier or ``finalize()`` (:mod:`~distcomm.backend._pipeline.routing_ledger`).

Where the values differ, the ranks' histories say which operation came first where they parted
(:mod:`~distcomm._divergence`), and
:class:`~distcomm.errors.CollectiveMismatchError` names it with each rank's call there. Found
before any rank ran it, the operation is not run and the communicator stays usable; otherwise
the error says which operations ran with mismatched calls, and the communicator is retired.

The policy (``DISTCOMM_DEBUG`` or ``init(debug=...)``): ``"sample"`` (the default) has check
points at the first 64 collectives of each communicator and then every 1024th (seq 64 + 1024
k), decided from ``seq`` so that every rank decides alike; ``"check"`` at every collective;
``"off"`` keeps no history and checks nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from distcomm import _divergence as divergence
from distcomm import _settings
from distcomm._call_sites import call_site
from distcomm.backend._pipeline import object_transport as objects
from distcomm.backend._pipeline import p2p_vote, routing_ledger
from distcomm.protocol import ReduceOp

if TYPE_CHECKING:
    from distcomm.backend._pipeline.history import CallHistory
    from distcomm.backend._pipeline.steps import Steps
    from distcomm.backend.arrays import Adapter
    from distcomm.backend.communicator import BaseCommunicator

__all__ = [
    "SAMPLED_FIRST",
    "SAMPLE_EVERY",
    "agree",
    "check",
    "limits",
    "policy",
    "record",
    "shape_of",
    "vote_buffer",
]

#: The default checks collectives 1..SAMPLED_FIRST, then every SAMPLE_EVERY-th after it.
SAMPLED_FIRST = 64
SAMPLE_EVERY = 1024


def policy(value: Any = None, environ: Mapping[str, str] | None = None) -> str:
    """The check policy: ``value`` (from ``init(debug=...)``), else ``DISTCOMM_DEBUG``.

    Raises:
        InvalidArgumentError: a value that is not one of :data:`~distcomm._settings.CHECK_POLICIES`.
    """
    if value is None:
        return str(_settings.read("DISTCOMM_DEBUG", environ))
    return str(_settings.convert("DISTCOMM_DEBUG", value, "debug"))


def limits(name: str) -> tuple[int, bool]:
    """``(checked up to seq, sampled after it)`` for a policy."""
    if name == "check":
        return sys.maxsize, False
    if name == "off":
        return 0, False
    return SAMPLED_FIRST, True


def next_checked(seq: int, until: int, sampling: bool) -> int:
    """The first collective from ``seq`` on that is checked under ``limits`` (``sys.maxsize``:
    none). Communicators keep it, so that a call tests one integer."""
    if seq <= until:
        return seq
    if not sampling:
        return sys.maxsize
    return SAMPLED_FIRST + -(-(seq - SAMPLED_FIRST) // SAMPLE_EVERY) * SAMPLE_EVERY


def check(comm: Steps, x: Any = None) -> None:
    """At a check point (the same ``seq`` on every rank): agree with the other ranks of ``comm``
    on the running value, before the collective (its argument ``x``) is issued.

    Raises:
        CollectiveMismatchError: the ranks' calls differ (every rank raises it).
    """
    h = comm._history
    if h is None:
        return
    seq = comm.seq
    channel = comm._object_channel()
    with channel._checking(comm), h.voting_on(seq):
        if agree(channel, h.value(seq)):
            h.agree(seq)
            routing_ledger.settle(comm, seq - 1, f"operation #{seq}, the next check point")
            return
        mine = h.dump(None if x is None else shape_of(x), site=call_site())
        dumps = dict(enumerate(objects.all_gather_object(channel, mine)))
    found = divergence.find(dumps)
    if found is None:  # older than every history kept
        found = divergence.Divergence(seq, dict.fromkeys(dumps), exact=False)
    error = divergence.mismatch_error(comm.describe(), found, dumps)
    comm._after_mismatch(error)
    raise error


def record(
    comm: Steps,
    h: CallHistory,
    seq: int,
    op: str,
    x: Any,
    adapter: Adapter | None,
    root: int | None,
    reduce_op: ReduceOp | None,
    varies: bool = False,
    layout: tuple[int, ...] | None = None,
) -> int:
    """Fold collective ``seq`` into ``comm``'s history ``h``; returns its fingerprint. A call
    unlike the one before it starts a run; one whose signature the ranks have never agreed on
    is confirmed with them before it is issued (unless ``seq`` is a check point, where it is
    checked anyway).
    ``varies``: the element count may differ from rank to rank (an uneven all-to-all), so it
    is left out of the signature; ``layout`` (the sizes every rank gives an uneven operation
    alike) stands in its place."""
    dtype: str | None = None
    numel: int | tuple[int, ...] | None = layout
    if x is not None and adapter is not None:
        dtype = adapter.dtype(x)
        if layout is None and not varies:
            numel = adapter.numel(x)
    signature = (op, dtype, numel, root, None if reduce_op is None else reduce_op.name)
    fp = h.fingerprint(signature)
    if fp == h.run_fp:
        return fp
    novel = h.start_run(seq, fp)
    if novel:
        shape = None if x is None else shape_of(x)
        h.describe(fp, signature, call_site(), shape)
        if seq < comm._next_check and comm._can_confirm():
            p2p_vote.vote(comm, p2p_vote.CALL, shape)
    return fp


def agree(channel: BaseCommunicator, fingerprint: int) -> bool:
    """Whether every rank has ``fingerprint``: one 16-byte int64 MIN all-reduce of [f, -f]
    where the engine has it, else an object all-gather. The 16 bytes are the channel's own,
    made once (:func:`vote_buffer`, kept by the channel) and written through a memoryview, so
    that a check allocates nothing."""
    vote = channel._vote_pair()
    if vote is False:
        return len(set(objects.all_gather_object(channel, fingerprint))) == 1
    buffer, pair = vote
    pair[0], pair[1] = fingerprint, -fingerprint
    channel._call(channel._all_reduce, False, buffer, ReduceOp.MIN)
    return bool(pair[0] == -pair[1])


def vote_buffer(channel: BaseCommunicator) -> tuple[Any, Any] | bool:
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
