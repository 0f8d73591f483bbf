"""The ranks confirm that they made the same calls, at a point the program chooses: a vote of
point-to-point messages, safe when they disagree.

A check at a barrier that settles split tables, in ``finalize`` or before a call whose
signature the ranks have never agreed on cannot be a collective: if one rank called something
else there, the check's collective would meet that rank's collective in the engine (MPICH aborts
the job on a size mismatch, Gloo's background thread ends the process). So it is a vote of
point-to-point messages of distcomm's own
(:meth:`~distcomm.backend.BaseCommunicator._control_isend`: a tag kept from users, or torch's
store), which never meet a collective. Every member sends (kind, ``seq``, running value) to
member 0 of the communicator, which compares and answers each; a vote is also a barrier. When
the messages differ, every member sends its history
(:meth:`~distcomm.backend._pipeline.mismatch_check.MismatchCheck.dump`) to member 0, which
finds where they parted and sends every member the same error to raise.

A member that does not take part (it called a collective whose signature the others had
agreed on, so it is in the engine while the others vote) is found out of band while they wait:
a helper thread asks the members that have not voted where they are, and the histories in their
answers (:func:`distcomm.backend.stacks.answer`) show the mismatch, raised at once instead of at
the timeout. Otherwise the vote ends with the communicator's timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import threading
import time
from typing import TYPE_CHECKING, Any

from distcomm import _divergence as divergence
from distcomm._call_sites import call_site
from distcomm.backend import monitor
from distcomm.backend._pipeline.engine_failures import compare, seconds
from distcomm.errors import CollectiveMismatchError, DistTimeoutError

if TYPE_CHECKING:
    from distcomm.backend._pipeline.steps import Steps
    from distcomm.backend.communicator import BaseCommunicator
    from distcomm.protocol import Work

__all__ = ["BARRIER", "CALL", "FINALIZE", "vote"]

#: What a vote confirms: a call about to be issued, a barrier, the end (finalize).
CALL, BARRIER, FINALIZE = 1, 2, 3
_KINDS = {CALL: "call", BARRIER: "barrier", FINALIZE: "finalize"}
_VOTE = struct.Struct("<qqq")  # kind, seq, running value
_SIZE = struct.Struct("<q")
_AGREED, _DIFFER = 1, 2
#: Seconds a vote waits before asking out of band, then between two questions.
_FIRST_LOOK = 0.2
_LOOK_EVERY = 1.0
#: Seconds a vote polls without sleeping, before it backs off.
_SPIN = 0.002


def vote(comm: Steps, kind: int, shape: Any = None) -> None:
    """Confirm with the other members of ``comm`` that they made the same calls up to its
    ``seq`` and are at the same point (``kind``); record the agreement.

    Raises:
        CollectiveMismatchError: they did not (every member that votes raises the same).
        DistTimeoutError: not every member voted within the communicator's timeout.
    """
    h = comm._mismatch_check
    assert h is not None, "a vote needs the call history (a policy other than off)"
    seq = comm.seq
    mine = _VOTE.pack(kind, seq, h.value(seq))
    channel = comm._object_channel()
    others = range(1, channel.world_size)
    # the call is not issued yet while its vote runs (finalize's is no call's)
    # the call is not issued yet while its vote runs (finalize's is no call's)
    with contextlib.nullcontext() if kind == FINALIZE else h.voting_on(seq):
        lookout = _Lookout(comm, shape, comm.op if kind == CALL else _KINDS[kind], kind)
        try:
            if channel.rank == 0:
                votes = _receive(lookout, channel, dict.fromkeys(others, _VOTE.size))
                agreed = all(bytes(v) == mine for v in votes.values())
                answer = bytearray(_SIZE.pack(_AGREED if agreed else _DIFFER))
                _send(lookout, channel, dict.fromkeys(others, answer))
            else:
                _send(lookout, channel, {0: bytearray(mine)})
                answer = _receive(lookout, channel, {0: _SIZE.size})[0]
                agreed = _SIZE.unpack(bytes(answer))[0] == _AGREED
            if agreed:
                h.agree(seq)
                return
            raise _settle(lookout, channel, h.dump(shape, site=lookout.site))
        finally:
            lookout.stop()


def _look(
    comm: Steps, mine: dict[str, Any], ranks: list[int]
) -> tuple[CollectiveMismatchError | None, dict[int, dict[str, Any]]]:
    """Ask ``ranks`` (members of ``comm``) out of band what they called: the mismatch their
    calls show against this rank's history ``mine``, if any, and their histories."""
    try:
        answers = comm._peer_stacks(ranks)
    except Exception:  # the side channel failed too: nothing is known
        return None, {}
    return compare(comm, mine, answers)


class _Lookout:
    """Asks the members that have not voted where they are, from a helper thread, while this
    rank waits (module docstring); ``found`` is the mismatch their answers show."""

    def __init__(self, comm: Steps, shape: Any, op: str, kind: int) -> None:
        self.comm, self.shape, self.op, self.kind = comm, shape, op, kind
        self.site = call_site() if kind == CALL else None  # the call voted on
        self.found: CollectiveMismatchError | None = None
        self.seen: dict[int, dict[str, Any]] = {}  # the latest history of each member asked
        self.silent: list[int] = []  # the members whose message has not come
        self._stop: threading.Event | None = None  # made with the thread: most votes need none
        self._thread: threading.Thread | None = None

    def watch(self, silent: list[int]) -> None:
        """Look at ``silent`` (members) from now on, starting the helper thread if needed."""
        self.silent = silent
        if self._thread is None:
            self._stop = threading.Event()
            self._thread = monitor.helper(self._run, "distcomm-vote-lookout")

    def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    def _run(self) -> None:
        h = self.comm._mismatch_check
        stop = self._stop
        if h is None or stop is None:
            return
        mine = h.dump(self.shape, site=self.site)  # the voting thread waits: it stands still
        while not stop.is_set() and not monitor.stopping():
            silent = list(self.silent)
            found, seen = _look(self.comm, mine, silent) if silent else (None, {})
            self.seen.update(seen)
            if found is not None and not stop.is_set():
                self.found = found
                return
            stop.wait(_LOOK_EVERY)


def _wait(lookout: _Lookout, works: dict[int, Work]) -> None:
    """Wait for ``works`` (by member), watching the members they wait for; raise the mismatch
    the lookout finds, or the timeout."""
    comm = lookout.comm
    start = time.monotonic()
    deadline, look_at, spin = start + comm.timeout, start + _FIRST_LOOK, start + _SPIN
    pause = 0.0001
    while True:
        for rank, work in list(works.items()):
            if work.is_completed():
                del works[rank]
        if not works:
            return
        found = lookout.found
        if found is not None:
            comm.unusable = f"collective mismatch at operation #{found.seq}"
            raise found
        now = time.monotonic()
        if now >= look_at:  # member 0 knows who has not voted; the others do not
            everyone = [r for r in range(comm._world_size) if r != comm._rank]
            lookout.watch(sorted(works) if comm._rank == 0 else everyone)
            look_at = float("inf")
        if now >= deadline:
            if lookout.kind == FINALIZE:  # the communicator is being released: no retiring
                raise _not_finalizing(lookout, sorted(works), now - start)
            raise comm.timed_out(lookout.op, comm.seq, now - start)
        if now < spin:  # the others are usually there already: a vote takes microseconds
            os.sched_yield()  # (time.sleep(0) costs the timer's slack, 50-100 us)
            continue
        time.sleep(pause)
        pause = min(pause * 2, 0.01)


def _not_finalizing(lookout: _Lookout, waited_for: list[int], waited: float) -> DistTimeoutError:
    """The error of a ``finalize`` whose vote timed out: who had not called finalize, where
    they were (from their last answers), and that the calls could not be confirmed."""
    comm = lookout.comm
    ended = {r for r, d in lookout.seen.items() if d.get("ended")}
    if comm._rank == 0:
        late = [r for r in waited_for if r not in ended]
    else:
        late = [r for r in range(comm._world_size) if r != comm._rank and r not in ended]
    where = [
        f"rank {r} at operation #{lookout.seen[r]['seq']} ({lookout.seen[r]['op'] or '-'})"
        if r in lookout.seen
        else f"rank {r} did not answer"
        for r in late
    ]
    who = f"{'rank' if len(late) == 1 else 'ranks'} {', '.join(map(str, late))}"
    said = f"{who} had not called finalize ({'; '.join(where)})" if late else "no answer"
    return DistTimeoutError(
        f"finalize on {comm.describe()}: {said} after {seconds(waited)} s, so the ranks could "
        "not confirm that they made the same collectives.",
        op="finalize",
        group=comm.describe(),
        missing_ranks=late or None,
    )


def _receive(
    lookout: _Lookout, channel: BaseCommunicator, sizes: dict[int, int]
) -> dict[int, bytearray]:
    """A message of ``sizes[r]`` bytes from each member ``r`` on the vote tag."""
    buffers = {r: bytearray(n) for r, n in sizes.items()}
    _wait(lookout, {r: channel._control_irecv(b, r) for r, b in buffers.items()})
    return buffers


def _send(lookout: _Lookout, channel: BaseCommunicator, messages: dict[int, bytearray]) -> None:
    """Each of ``messages`` to its member on the vote tag."""
    _wait(lookout, {r: channel._control_isend(m, r) for r, m in messages.items()})


def _settle(
    lookout: _Lookout, channel: BaseCommunicator, mine: dict[str, Any]
) -> CollectiveMismatchError:
    """The votes differed: member 0 gathers every member's history, finds where they parted
    and sends each the same error; returned to raise."""
    comm = lookout.comm
    others = range(1, channel.world_size)
    if channel.rank == 0:
        sizes = _receive(lookout, channel, dict.fromkeys(others, _SIZE.size))
        texts = _receive(lookout, channel, {r: _SIZE.unpack(bytes(n))[0] for r, n in sizes.items()})
        dumps = {0: mine, **{r: json.loads(bytes(t)) for r, t in texts.items()}}
        found = divergence.find(dumps)
        if found is None:  # older than every history kept: say where they are
            found = divergence.Divergence(comm.seq, dict.fromkeys(dumps), exact=False)
        error = divergence.mismatch_error(comm.describe(), found, dumps)
        verdict = bytearray(json.dumps(_as_data(error)).encode())
        _send(lookout, channel, dict.fromkeys(others, bytearray(_SIZE.pack(len(verdict)))))
        _send(lookout, channel, dict.fromkeys(others, verdict))
    else:
        text = bytearray(json.dumps(mine).encode())
        _send(lookout, channel, {0: bytearray(_SIZE.pack(len(text)))})
        _send(lookout, channel, {0: text})
        size = _SIZE.unpack(bytes(_receive(lookout, channel, {0: _SIZE.size})[0]))[0]
        error = _from_data(json.loads(bytes(_receive(lookout, channel, {0: size})[0])))
    comm._after_mismatch(error)
    return error


def _as_data(error: CollectiveMismatchError) -> dict[str, Any]:
    return {
        "message": str(error),
        "table": [
            {k: (list(v) if isinstance(v, tuple) else v) for k, v in row.items()}
            for row in error.table
        ],
        "op": error.op,
        "seq": error.seq,
        "group": error.group,
        "ran": None if error.ran is None else list(error.ran),
    }


def _from_data(data: dict[str, Any]) -> CollectiveMismatchError:
    table = [
        {k: (tuple(v) if k == "shape" and v is not None else v) for k, v in row.items()}
        for row in data["table"]
    ]
    ran = data["ran"]
    return CollectiveMismatchError(
        data["message"],
        table=table,
        op=data["op"],
        seq=data["seq"],
        group=data["group"],
        ran=None if ran is None else (int(ran[0]), int(ran[1])),
    )
