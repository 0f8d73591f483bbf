"""The mismatch check: the ranks of a group agree that they make the same collectives.

It is one object per communicator, :class:`MismatchCheck` (``comm._mismatch_check``; None where the
policy is off or in a world of 1), and nothing else changes its state: the history of this
rank's calls and its running value, the fingerprints the ranks agreed on, the split tables'
ledger, the check points of the policy. The communicator keeps only a copy of the next check
point (``_next_check``, from :meth:`MismatchCheck.next_point`), so that a call that is not
checked tests one integer.

Every collective has a *signature*: op, dtype, element count, root and reduce op (shapes are
shown, never compared: torch accepts (2, 3) on one rank and (6,) on another). Its fingerprint
is 62 bits of blake2b over the signature's text, the same in every process. Consecutive calls
with one fingerprint form a *run*, and the running value folds each run (fingerprint and
length) into one integer: two ranks have equal values when they made the same calls in the
same order (barring an accident of 2**-62), and a call like the one before it, where the
ranks agreed that it may be, costs nothing to record (:meth:`MismatchCheck.record`). The ranks
compare running values, so that nothing slips through:

- at the check points of the policy, before the collective is issued
  (:meth:`MismatchCheck.check`): one int64 all-reduce of 16 bytes, ``MIN`` of ``[v, -v]``
  (:func:`agree`), at the same ``seq`` on every rank, so that the checks' collectives always
  meet each other in the engine;
- before a call whose signature the ranks have never agreed on (a new size, dtype, op, root; a
  communicator's first ``barrier``), at a ``barrier`` after uneven all-to-alls whose split
  tables wait to be compared, and in ``finalize()``: a vote of point-to-point messages
  (:mod:`~distcomm.backend._pipeline.p2p_vote`), which a rank that called something else
  cannot meet with a collective of its own: the mismatch never reaches the engine;
- the same vote before a call that follows the call before it in a way the ranks never agreed
  on (a *step*: which fingerprint followed which, learnt at each agreement into
  :attr:`MismatchCheck.follow`, so the same on every rank); and the check points' 16 bytes
  before a call after which the ranks agreed on calls of its op in more than one size, decided
  from what they agreed on so that every rank making that op there checks it. A call that is
  a step the ranks agreed on, where they agreed on no other call of its op, is the only one
  that reaches the engine unconfirmed (:meth:`MismatchCheck.unchecked`; the compiled path reads
  :attr:`MismatchCheck.free_fp`): a call whose size could differ from rank to rank never does;
- when an operation times out or its engine fails: out of band
  (:mod:`~distcomm.backend._pipeline.engine_failures`);
- the split tables of uneven all-to-alls, which differ from rank to rank by design and stay out
  of the running value: compared at a check point, kept between check points in the check's
  ledger and settled at the next one, barrier or ``finalize()``
  (:mod:`~distcomm.backend._pipeline.routing_ledger`).

Where the values differ, the ranks' histories say which operation came first where they parted:
the runs since the last agreement (a ring of at most :data:`RING`) and the signature of each
fingerprint with the call site where it was first seen (:meth:`MismatchCheck.dump`; a peer
asked out of band, the answer of :func:`distcomm.backend.stacks.where`, sends it too).
:mod:`~distcomm._divergence` finds the first operation where they parted, and
:class:`~distcomm.errors.CollectiveMismatchError` names it with each rank's call there. Found
before any rank ran it, the operation is not run and the communicator stays usable; otherwise
the error says which operations ran with mismatched calls, and the communicator is retired.

The policy (``DISTCOMM_DEBUG`` or ``init(debug=...)``): ``"sample"`` (the default) has check
points at the first 64 collectives of each communicator and then every 1024th (seq 64 + 1024
k), decided from ``seq`` so that every rank decides alike; ``"check"`` at every collective;
``"off"`` keeps no history and checks nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
import weakref
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from distcomm import _divergence as divergence
from distcomm import _settings
from distcomm._call_sites import call_site
from distcomm.backend._pipeline import history_dumps, p2p_vote, routing_ledger
from distcomm.backend._pipeline import object_transport as objects
from distcomm.backend._pipeline.history_dumps import RING
from distcomm.backend._pipeline.routing_ledger import Kept, Ledger
from distcomm.protocol import ReduceOp

if TYPE_CHECKING:
    from distcomm.backend._pipeline.steps import Steps
    from distcomm.backend.arrays import Adapter
    from distcomm.backend.communicator import BaseCommunicator

__all__ = [
    "NEUTRAL",
    "SAMPLED_FIRST",
    "SAMPLE_EVERY",
    "MismatchCheck",
    "agree",
    "fingerprint",
    "limits",
    "next_checked",
    "policy",
    "shape_of",
    "vote_buffer",
]

#: The default checks collectives 1..SAMPLED_FIRST, then every SAMPLE_EVERY-th after it.
SAMPLED_FIRST = 64
SAMPLE_EVERY = 1024
#: Fingerprints remembered as agreed, and signatures remembered as described, per communicator.
_REMEMBERED = 4096
_BITS = (1 << 62) - 1
_MULTIPLIER = 0x9E3779B97F4A7C15 & _BITS | 1
_NO_RUN = -1
_NOT_FREE = -2


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


def fingerprint(signature: tuple[Any, ...]) -> int:
    """62 bits of blake2b over ``signature``'s canonical text (stable across processes)."""
    text = "|".join(map(str, signature)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") & _BITS


#: The fingerprint a call takes when the ranks found it mismatched before any of them ran it,
#: so that their histories agree again and the communicator stays usable.
NEUTRAL = fingerprint(("not run: the ranks disagreed",))


def _mix(value: int, fp: int, length: int) -> int:
    return ((value ^ fp) * _MULTIPLIER + length) & _BITS


class MismatchCheck:
    """The mismatch check of one rank's communicator ``comm`` under check ``policy`` (module
    docstring): what this rank called on it since the ranks last agreed, the fingerprints they
    agreed on, the split tables kept since the last check point, and the check points."""

    __slots__ = (
        "__weakref__",
        "agreed",
        "agreed_seq",
        "check_at",
        "closed",
        "described",
        "ended",
        "follow",
        "fps",
        "free_fp",
        "keep_tables",
        "ledger",
        "limits",
        "owner",
        "run_fp",
        "run_start",
        "runs",
        "steps",
        "voting",
    )

    def __init__(self, comm: Any, policy: str) -> None:
        self.owner = weakref.ref(comm)
        #: ``(checked up to seq, sampled after it)``: the policy's check points (:func:`limits`).
        self.limits = limits(policy)
        self.closed = 0  # the running value of the runs before the current one
        self.run_fp, self.run_start = _NO_RUN, 1
        self.runs: list[tuple[int, int]] = []  # closed runs since the last agreement
        #: The latest ``seq`` the ranks agreed on (a check made mid-way starts at its ``seq``).
        self.agreed_seq = comm.seq
        self.agreed: set[int] = set()
        #: fingerprint -> the fingerprints of the calls that followed a call of it (itself: a
        #: run of two or more) in what the ranks agreed on: the same on every rank.
        self.follow: dict[int, set[int]] = {}
        #: The steps (fingerprint, the next one, the next one's seq) made since the last
        #: agreement that :attr:`follow` lacks: known good once the ranks agree.
        self.steps: list[tuple[int, int, int]] = []
        #: The current run's fingerprint where a call may repeat it unchecked (the ranks agreed
        #: that such a run goes on, and on no other call of its op after it), else
        #: :data:`_NOT_FREE`: the compiled path reads it.
        self.free_fp = _NOT_FREE
        #: The ``seq`` of the call that :meth:`record` found must be checked first (0: none).
        self.check_at = 0
        self.fps: dict[tuple[Any, ...], int] = {}  # signature -> fingerprint
        self.described: dict[int, tuple[Any, ...]] = {}  # fingerprint -> signature and site
        self.ended = False
        #: The ``seq`` of the call whose vote this rank is in, before it reaches the engine.
        self.voting = 0
        #: The uneven all-to-alls' split tables since the last check point
        #: (:class:`~distcomm.backend._pipeline.routing_ledger.Ledger`).
        self.ledger = Ledger(comm.rank, comm.world_size)
        #: ``keep_tables(seq, sent, expected)``: keep the split tables of uneven all-to-all
        #: ``seq`` (not a check point) until the next settlement (the ledger's own ``keep``,
        #: bound: an uneven call between check points makes one call for it).
        self.keep_tables = self.ledger.keep
        history_dumps.register(self)

    def take_tables(self) -> tuple[int, Kept]:
        """This rank's balance of the split tables kept, and the tables, which the ledger
        forgets (a settlement's)."""
        return self.ledger.take()

    def set_policy(self, policy: str) -> None:
        """Check at the check points of ``policy`` from now on (the history goes on)."""
        self.limits = limits(policy)

    def next_point(self, seq: int) -> int:
        """The first call from ``seq`` on that is a check point (``sys.maxsize``: none)."""
        return next_checked(seq, *self.limits)

    def record(
        self,
        comm: Steps,
        seq: int,
        op: str,
        x: Any,
        adapter: Adapter | None,
        root: int | None,
        reduce_op: ReduceOp | None,
        varies: bool = False,
        layout: tuple[int, ...] | None = None,
    ) -> int:
        """Fold collective ``seq`` of ``comm`` (this check's communicator) into the history;
        returns its fingerprint. A call unlike the one before it starts a run; one whose
        signature the ranks have never agreed on is confirmed with them before it is issued
        (unless ``seq`` is a check point, where it is checked anyway). ``varies``: the element
        count may differ from rank to rank (an uneven all-to-all), so it is left out of the
        signature; ``layout`` (the sizes every rank gives an uneven operation alike) stands in
        its place."""
        dtype: str | None = None
        numel: int | tuple[int, ...] | None = layout
        if x is not None and adapter is not None:
            dtype = adapter.dtype(x)
            if layout is None and not varies:
                numel = adapter.numel(x)
        signature = (op, dtype, numel, root, None if reduce_op is None else reduce_op.name)
        fp = self.fingerprint(signature)
        if fp == self.free_fp or (fp == self.run_fp and seq == self.run_start):
            return fp  # (the latter: a plan that declined began its run, a step known good)
        before = self.run_fp
        novel = False
        if fp == before:  # a repeat not agreed on, or after which its op may differ
            if not self.steps or self.steps[-1][:2] != (fp, fp):  # (once until agreed)
                self.steps.append((fp, fp, seq))
        else:
            novel = self.start_run(seq, fp)
        shape = None if x is None else shape_of(x)
        if novel:
            self.describe(fp, signature, call_site(), shape)
        if self.next_point(seq) == seq:
            return fp  # a check point: checked anyway
        if self._ambiguous(before, op):
            self.check_at = seq  # every rank making this op here checks it (collectively)
        elif (novel or fp not in self.follow.get(before, ())) and comm._can_confirm():
            p2p_vote.vote(comm, p2p_vote.CALL, shape)
        return fp

    def unchecked(self, fp: int, op: str) -> bool:
        """Whether a call of ``op`` with fingerprint ``fp`` may reach the engine without the
        pipeline's confirmation or check (:meth:`record`'s): a repeat of the current run that
        :attr:`free_fp` allows, or a call the ranks agreed on, which they agreed follows the
        current run, where they agreed on no other call of ``op`` after it."""
        if fp == self.free_fp:
            return True
        state = self.run_fp
        return (
            fp != state
            and fp in self.agreed
            and fp in self.follow.get(state, ())
            and not self._ambiguous(state, op)
        )

    def _ambiguous(self, state: int, op: str) -> bool:
        """Whether the ranks agreed on more than one call of ``op`` following ``state`` (a
        fingerprint): such a call could differ from rank to rank, unseen."""
        known = self.follow.get(state)
        if known is None or len(known) < 2:
            return False
        same = 0
        for fp in known:
            call = self.described.get(fp)
            if call is not None and call[0] == op:
                same += 1
        return same > 1

    def _free_repeat(self) -> int:
        """:attr:`free_fp` for the current run."""
        fp = self.run_fp
        call = self.described.get(fp)
        if fp not in self.follow.get(fp, ()) or call is None or self._ambiguous(fp, call[0]):
            return _NOT_FREE
        return fp

    def check(self, comm: Steps, x: Any = None) -> None:
        """At a check point (the same ``seq`` on every rank): agree with the other ranks of
        ``comm`` (this check's communicator) on the running value, before the collective (its
        argument ``x``) is issued.

        Raises:
            CollectiveMismatchError: the ranks' calls differ (every rank raises it).
        """
        seq = comm.seq
        channel = comm._object_channel()
        if self._agrees(channel, comm, seq):
            self.agree(seq)
            if self.ledger:
                routing_ledger.settle(comm, seq - 1, f"operation #{seq}, the next check point")
            return
        with channel._checking(comm), self.voting_on(seq):
            mine = self.dump(None if x is None else shape_of(x), site=call_site())
            dumps = dict(enumerate(objects.all_gather_object(channel, mine)))
        found = divergence.find(dumps)
        if found is None:  # older than every history kept
            found = divergence.Divergence(seq, dict.fromkeys(dumps), exact=False)
        error = divergence.mismatch_error(comm.describe(), found, dumps)
        comm._after_mismatch(error)
        raise error

    def _agrees(self, channel: BaseCommunicator, comm: Steps, seq: int) -> bool:
        """:func:`agree` on the running value at ``seq`` (the latest call of ``comm``), over
        ``channel`` (``comm``'s object channel) and in the vote on ``seq``, as
        :meth:`voting_on` (with no context manager: it runs before every checked call)."""
        self.voting = seq
        try:
            if channel is comm:
                return agree(channel, self.value(seq))
            with channel._checking(comm):
                return agree(channel, self.value(seq))
        finally:
            self.voting = 0

    @contextlib.contextmanager
    def voting_on(self, seq: int) -> Iterator[None]:
        """While this rank is in the vote on call ``seq``, before the call reaches the engine
        (a peer asking where it is hears that ``seq`` was not issued)."""
        self.voting = seq
        try:
            yield
        finally:
            self.voting = 0

    def end(self) -> None:
        """finalize began: the calls end here."""
        self.ended = True

    def fingerprint(self, signature: tuple[Any, ...]) -> int:
        """``signature``'s fingerprint (remembered)."""
        fp = self.fps.get(signature)
        if fp is None:
            if len(self.fps) >= _REMEMBERED:
                self.fps.clear()
            fp = self.fps[signature] = fingerprint(signature)
        return fp

    def start_run(self, seq: int, fp: int) -> bool:
        """Call ``seq`` has fingerprint ``fp``, unlike the one before: close that run, start
        one. Returns whether the ranks have never agreed on ``fp`` (a call to confirm)."""
        before = self.run_fp
        if before != _NO_RUN:
            self.closed = _mix(self.closed, before, seq - self.run_start)
            self.runs.append((self.run_start, before))
            if len(self.runs) > RING:
                del self.runs[: len(self.runs) - RING]
        if fp not in self.follow.get(before, ()):
            self.steps.append((before, fp, seq))
        self.run_fp, self.run_start = fp, seq
        self.free_fp = self._free_repeat()
        return fp not in self.agreed

    def describe(self, fp: int, signature: tuple[Any, ...], site: str, shape: Any) -> None:
        """Remember what ``fp`` is (the first time it is seen), for the table of a mismatch."""
        if fp not in self.described:
            if len(self.described) >= _REMEMBERED:
                self.described.clear()
            self.described[fp] = (*signature, site, shape)

    def value(self, seq: int) -> int:
        """The running value of calls 1 to ``seq`` (``seq`` is the latest)."""
        if self.run_fp == _NO_RUN:
            return self.closed
        return _mix(self.closed, self.run_fp, seq - self.run_start + 1)

    def agree(self, seq: int) -> None:
        """The ranks agreed on calls 1 to ``seq``: their fingerprints, and which followed
        which, are known good."""
        if len(self.agreed) >= _REMEMBERED:
            self.agreed.clear()
        self.agreed.update(fp for _, fp in self.runs)
        self.agreed.add(self.run_fp)
        self.runs.clear()
        if len(self.follow) >= _REMEMBERED:
            self.follow.clear()
        for before, after, _ in self.steps:
            self.follow.setdefault(before, set()).add(after)
        self.steps.clear()
        if seq > self.run_start:  # the current run's calls follow each other
            self.follow.setdefault(self.run_fp, set()).add(self.run_fp)
        self.free_fp = self._free_repeat()
        self.agreed_seq = seq

    def neutralise(self, seq: int) -> None:
        """Call ``seq`` (the latest) was found mismatched before any rank ran it: it counts as
        :data:`NEUTRAL` on every rank, so that the ranks' histories agree again."""
        if self.run_start != seq:
            self.start_run(seq, NEUTRAL)
        while self.steps and self.steps[-1][2] == seq:  # no rank made them: none is learnt
            self.steps.pop()
        self.run_fp, self.free_fp = NEUTRAL, _NOT_FREE

    def dump(
        self, shape: Any = None, keep: int = RING + 1, site: str | None = None
    ) -> dict[str, Any]:
        """What this rank called since the last agreement, as plain data (JSON, compact: a peer
        sends it out of band): the communicator (``ranks``, ``name``, ``lineage``), its
        ``seq``, current ``op``, ``agreed`` (the last agreement's seq), ``issued`` (the latest
        call that reached the engine) and ``ended`` (finalize began); ``first``, the seq the
        first run starts at, and ``runs``, ``[index, length]`` each (the current run last, up
        to ``seq``), where ``index`` picks the fingerprint in ``fps`` and its call in
        ``calls``: ``[op, dtype, numel, root, reduce_op, site, shape]`` (site: where it was
        first made; shape: the current call's, when given), and ``site``, where the current
        call is being made (when known: the rank is in it). Only the newest ``keep`` runs are
        in it."""
        comm = self.owner()
        seq, op = (0, "") if comm is None else (comm.seq, comm.op)
        runs = [*self.runs, (self.run_start, self.run_fp)] if self.run_fp != _NO_RUN else []
        runs = runs[-keep:] if keep > 0 else []
        fps: list[int] = []
        index: dict[int, int] = {}
        encoded = []
        for i, (start, fp) in enumerate(runs):
            end = runs[i + 1][0] if i + 1 < len(runs) else seq + 1
            if fp not in index:
                index[fp] = len(fps)
                fps.append(fp)
            encoded.append([index[fp], end - start])
        calls = [list(self.described.get(fp) or (None,) * 7) for fp in fps]
        if shape is not None and calls:
            calls[index[runs[-1][1]]][6] = list(shape)
        return {
            "ranks": [] if comm is None else list(comm.global_ranks),
            "name": "" if comm is None else comm.name,
            "lineage": "" if comm is None else getattr(comm, "_lineage", ""),
            "seq": seq,
            "op": op,
            "agreed": self.agreed_seq,
            "issued": seq - 1 if self.voting == seq else seq,
            "ended": self.ended,
            "first": runs[0][0] if runs else seq + 1,
            "runs": encoded,
            "fps": fps,
            "calls": calls,
            "site": site,
        }


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
