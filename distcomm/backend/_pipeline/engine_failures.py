"""What a communicator does when an operation times out or its engine fails.

Both retire the communicator (an engine cannot cancel a half-done collective) and return an
error that names the operation, its sequence number, the communicator and the ranks that had
not arrived. Those are found out of band, by the backend's :meth:`Failures._peer_progress`: the
sequence number each member has reached (torch's store on gloo and nccl, a side channel on MPI,
the fabric for thread-ranks); a backend that cannot tell says "unknown", never a guess. After a
timeout, :meth:`Failures._peer_stacks` asks those ranks where they are, by the same way, and
the error shows their Python stacks (:mod:`distcomm.backend.stacks`).
``DISTCOMM_ON_TIMEOUT=abort`` turns a timeout into the end of the job
(:mod:`distcomm.backend.aborts`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from distcomm import _divergence as divergence
from distcomm._call_sites import call_site
from distcomm.backend import aborts, stacks
from distcomm.backend._pipeline.history_dumps import minimal_dump, same_communicator
from distcomm.backend.engine_messages import engine_said, lost_peer
from distcomm.backend.stacks import split
from distcomm.errors import CollectiveMismatchError, DistTimeoutError, EngineError

if TYPE_CHECKING:
    from distcomm.backend._pipeline.mismatch_check import MismatchCheck

__all__ = [
    "Diagnosis",
    "Failures",
    "compare",
    "current_dump",
    "missing_ranks",
    "seconds",
]


def missing_ranks(progress: Mapping[int, int], size: int, seq: int) -> list[int]:
    """The ranks of ``range(size)`` that had not reached operation ``seq``: those whose
    sequence number in ``progress`` is lower, and those absent from it (no answer)."""
    return [r for r in range(size) if progress.get(r, -1) < seq]


def _label(op: str, seq: int | None) -> str:
    return f"{op} (operation #{seq})" if seq else op


class Failures:
    """Mixin of BaseCommunicator: timeouts and engine failures (see the module docstring)."""

    _rank: int
    _world_size: int
    unusable: str | None
    timeout: float
    _mismatch_check: MismatchCheck | None
    #: The communicator whose collective this one (its object channel: NCCL's Gloo side
    #: group) checks now: a failure here is that collective's, told and diagnosed there.
    _checking_for: Any = None

    def describe(self) -> str:
        raise NotImplementedError

    # -- for backends ----------------------------------------------------------------------------
    def timed_out(
        self,
        op: str,
        seq: int | None,
        limit: float,
        waiting_for: str = "",
        stalled: str = "",
        ended: Sequence[int] = (),
    ) -> DistTimeoutError | CollectiveMismatchError:
        """Retire this communicator after ``op`` did not complete within ``limit`` seconds and
        return the error to raise; under ``DISTCOMM_ON_TIMEOUT=abort``, end the job instead.

        When the other ranks' calls (asked out of band) show that they did not call the same
        collectives, the error is that :class:`~distcomm.errors.CollectiveMismatchError`,
        naming the first operation where they parted.

        Args:
            op: the operation's name.
            seq: its sequence number (None for point-to-point messages, which have none).
            limit: the seconds waited.
            waiting_for: what a point-to-point operation waited for ("a message from rank 1").
            stalled: why the operation can never complete, when the engine knows it before
                the timeout (an in-process world where every rank waits).
            ended: the ranks the operation waited for whose process has ended, where the
                engine knows them (node memory's pidfds): they are named as the ranks that
                had not arrived, without asking for their stacks.
        """
        behalf = self._checking_for
        if behalf is not None:
            self.unusable = f"the check of {behalf.op} #{behalf.seq} on {behalf.describe()} failed"
            told: DistTimeoutError | CollectiveMismatchError = behalf.timed_out(
                behalf.op, behalf.seq, limit, waiting_for, stalled
            )
            return told
        error, message = self.timeout_error(op, seq, limit, waiting_for, stalled, ended=ended)
        if aborts.on_timeout() == "abort":
            self._abort_job(f"distcomm: rank {self._rank}: {message} (DISTCOMM_ON_TIMEOUT=abort)")
        return error

    def timeout_error(
        self,
        op: str,
        seq: int | None,
        limit: float,
        waiting_for: str = "",
        stalled: str = "",
        *,
        label: str = "",
        consequence: str = "",
        ended: Sequence[int] = (),
    ) -> tuple[DistTimeoutError | CollectiveMismatchError, str]:
        """The one builder of a timeout's error and message: retire this communicator, find
        the ranks that had not arrived (their stacks), or the mismatch that kept them apart.

        :meth:`timed_out` raises what it returns; an engine that cannot cancel a blocking call
        (MPI's watchdog) prints the message and ends the job.

        Args:
            op, seq, limit, waiting_for, stalled: as for :meth:`timed_out`.
            label: what is named instead of ``op (operation #seq)`` (a Work: "irecv from
                rank 1").
            consequence: a sentence said before the HINT ("MPI cannot cancel it, ...").
            ended: as for :meth:`timed_out`.

        Returns:
            The error, and the message to print for it (the mismatch's, after the operation).
        """
        label = label or _label(op, seq)
        if ended:  # no stacks to ask of an ended process; its last words may show a mismatch
            found = self.diagnose(seq, waiting_for, show_stacks=False)
            if found.mismatch is None:
                gone = sorted(ended)
                detail = f"ranks that had not arrived: {gone} (their process ended)"
                found = Diagnosis(gone, detail, {}, " ")
        else:
            found = self.diagnose(seq, waiting_for)
        late = (
            f"can never complete ({stalled})"
            if stalled
            else f"did not complete within {seconds(limit)} s"
        )
        self.unusable = f"{label} {'stalled' if stalled else f'timed out after {seconds(limit)} s'}"
        then = f" {consequence}" if consequence else ""
        if found.mismatch is not None:
            return found.mismatch, f"{label} on {self.describe()} {late}: {found.mismatch}{then}"
        message = (
            f"{label} on {self.describe()} {late}"
            f"{'; ' + found.detail if found.detail else ''}.{found.block}{consequence}"
            f"{' ' if consequence else ''}HINT: a rank is stuck, died or skipped this call; if it "
            "is merely slow, raise init(timeout=...) or DISTCOMM_TIMEOUT."
        )
        error = DistTimeoutError(
            message,
            op=op,
            seq=seq,
            group=self.describe(),
            missing_ranks=found.missing,
            stacks=found.stacks,
        )
        return error, message

    def engine_failed(
        self,
        op: str,
        seq: int | None,
        exc: BaseException,
        limit: float | None = None,
        waiting_for: str = "",
    ) -> EngineError | CollectiveMismatchError | DistTimeoutError:
        """Retire this communicator after the engine raised ``exc`` in ``op``; return the
        distcomm error to raise from it (``raise comm.engine_failed(...) from exc``): the
        :class:`~distcomm.errors.CollectiveMismatchError` when the ranks' calls (asked out of
        band) differ, else an EngineError; or, where the backend's :meth:`_timeout_of` says
        that ``exc`` is the engine's timeout, what :meth:`timed_out` returns (``limit``: the
        seconds waited, default the communicator's timeout; ``waiting_for`` as there).
        """
        stalled = self._timeout_of(exc)
        if stalled is not None:
            waited = self.timeout if limit is None else limit
            return self.timed_out(op, seq, waited, waiting_for, stalled)
        behalf = self._checking_for
        if behalf is not None:
            self.unusable = f"the check of {behalf.op} #{behalf.seq} on {behalf.describe()} failed"
            failed: EngineError | CollectiveMismatchError | DistTimeoutError = behalf.engine_failed(
                behalf.op, behalf.seq, exc
            )
            return failed
        label = _label(op, seq)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        self.unusable = f"{label} failed: {first}"
        found = self.diagnose(seq, show_stacks=False)
        if found.mismatch is not None:
            return found.mismatch
        lost = lost_peer(str(exc))
        what = "a peer went away" if lost else "the engine failed"
        hint = (
            "look above for the traceback of the rank that died (or its launcher's report)"
            if lost
            else "the engine's own error is the cause below"
        )
        message = (
            f"{label} on {self.describe()} failed: {what} ({type(exc).__name__}: {first})"
            f"{'; ' + found.detail if found.detail else ''}. HINT: {hint}.{engine_said(exc)}"
        )
        return EngineError(
            message, op=op, seq=seq, group=self.describe(), missing_ranks=found.missing
        )

    def diagnose(
        self, seq: int | None, waiting_for: str = "", show_stacks: bool = True
    ) -> Diagnosis:
        """What the other ranks were doing while operation ``seq`` (None: a point-to-point
        message, which ``waiting_for`` describes) could not complete, found out of band: the
        ranks that had not arrived, where they are (unless ``show_stacks`` is False), and the
        collective mismatch their calls show, if any. For a backend's own diagnostic (MPI's
        watchdog)."""
        missing, detail = self._arrivals(seq) if seq else (None, waiting_for)
        members = [r for r in range(self._world_size) if r != self._rank]
        answers, failed = self._ask_where(members if seq else [])
        mismatch = self._mismatch(answers)
        if mismatch is not None:
            self.unusable = f"collective mismatch at operation #{mismatch.seq}"
            return Diagnosis(missing, detail, {}, " ", mismatch)
        if not show_stacks or not missing:
            return Diagnosis(missing, detail, {}, " ")
        if failed:
            block = f"The stacks of the ranks that had not arrived are unknown ({failed})."
            return Diagnosis(missing, detail, {}, f"\n{block}\n")
        if answers is None:
            return Diagnosis(missing, detail, {}, " ")
        where = {rank: split(answers[rank])[0] for rank in missing if rank in answers}
        return Diagnosis(missing, detail, where, f"\n{stacks.describe(where, missing)}\n")

    def _timeout_of(self, exc: BaseException) -> str | None:
        """Whether the engine's exception ``exc`` says that the operation ran out of time (the
        one place a backend translates its engine's timeouts): None, it does not (an engine
        failure); ``""``, the engine's own timeout ran out; or why the operation can never
        complete, where the engine sees that before the timeout (fakelink: every rank waits).
        The kit then raises the communicator's DistTimeoutError, naming the ranks that had not
        arrived (or the mismatch that kept them apart), instead of an EngineError.
        """
        return None

    def _peer_progress(self) -> Mapping[int, int] | None:
        """Each member's sequence number (the latest collective it entered), found out of band;
        a member that could not be asked is left out. None: this backend cannot tell.

        Called on the failing rank only, after an operation timed out or failed.
        """
        return None

    def _peer_stacks(self, ranks: list[int]) -> Mapping[int, str] | None:
        """Where each of ``ranks`` (members) is: the text of :func:`distcomm.backend.stacks.answer`
        there (its stack, and what it called: pass it on as it is), found out of band within a
        few seconds; a member that did not answer is left out. None: this
        backend cannot ask.

        Called after an operation timed out or failed, and while a rank waits in a check that
        another rank may never join (from a helper thread then).
        """
        return None

    def _abort_job(self, message: str) -> None:
        """End the job after a timeout under ``DISTCOMM_ON_TIMEOUT=abort`` (thread-ranks end
        their fabric instead, and the caller raises)."""
        aborts.abort_job(message)

    # -- helpers ---------------------------------------------------------------------------------
    def _ask_where(self, ranks: list[int]) -> tuple[Mapping[int, str] | None, str]:
        """``_peer_stacks(ranks)``, and why it failed ("" if it did not)."""
        if not ranks:
            return {}, ""
        try:
            return self._peer_stacks(ranks), ""
        except Exception as exc:  # the side channel failed too: say so, never guess
            return None, str(exc)

    def _mismatch(self, answers: Mapping[int, str] | None) -> CollectiveMismatchError | None:
        """The collective mismatch the histories in peers' ``answers`` show against this
        rank's, if any."""
        return compare(self, current_dump(self), answers)[0] if answers else None

    def _arrivals(self, seq: int) -> tuple[list[int] | None, str]:
        """The ranks that had not reached operation ``seq``, and a sentence saying so."""
        try:
            progress = self._peer_progress()
        except Exception as exc:  # the side channel failed too: say so, never guess
            return None, f"the ranks that had not arrived are unknown ({exc})"
        if progress is None:
            return None, "the ranks that had not arrived are unknown (this backend cannot tell)"
        missing = missing_ranks({**progress, self._rank: seq}, self._world_size, seq)
        if not missing:
            ahead = sorted(r for r, s in progress.items() if s > seq)
            if ahead:
                return [], (
                    f"{'rank' if len(ahead) == 1 else 'ranks'} {ahead} had already gone on to "
                    f"later operations (#{max(progress[r] for r in ahead)}): they completed "
                    "this one without this rank, so the ranks did not call the same collectives"
                )
            return [], (
                f"every rank had reached operation #{seq}, yet it did not complete: the ranks "
                "called different collectives there, or the engine failed"
            )
        where = ", ".join(_where(r, progress) for r in missing)
        return missing, f"ranks that had not arrived: {missing} ({where})"


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """What :meth:`Failures.diagnose` found: ``missing`` (None: unknown) and ``detail`` (a
    sentence), ``stacks`` (rank -> stack) and ``block`` (their text, framed by newlines, or
    " "), and the ``mismatch``, if the ranks' calls differ."""

    missing: list[int] | None
    detail: str
    stacks: dict[int, str]
    block: str
    mismatch: CollectiveMismatchError | None = None


def seconds(value: float) -> str:
    """``value`` seconds for a message: ``1800``, ``2.5``, ``0.02``."""
    if value >= 10 or value == int(value):
        return f"{value:.0f}"
    return f"{value:.2g}"


def compare(
    comm: Any, mine: dict[str, Any], answers: Mapping[int, str] | None
) -> tuple[CollectiveMismatchError | None, dict[int, dict[str, Any]]]:
    """The collective mismatch that the histories in the peers' ``answers`` (member -> the
    text of :func:`distcomm.backend.stacks.answer`) show against this rank's ``mine`` on
    ``comm``, if any, and those peers' histories of ``comm``."""
    theirs: dict[int, dict[str, Any]] = {}
    for rank, answer in (answers or {}).items():
        found = same_communicator(mine, split(answer)[1])
        if found is not None:
            theirs[rank] = found
    if not theirs:
        return None, theirs
    dumps = {comm._rank: mine, **theirs}
    found_at = divergence.find(dumps)
    if found_at is None:
        return None, theirs
    return divergence.mismatch_error(comm.describe(), found_at, dumps), theirs


def current_dump(comm: Any) -> dict[str, Any]:
    """This rank's dump of ``comm``'s history; without one (policy off), its current call."""
    history = comm._mismatch_check
    if history is not None:
        return dict(history.dump(site=call_site()))
    return minimal_dump(comm)


def _where(rank: int, progress: Mapping[int, Any]) -> str:
    if rank not in progress:
        return f"rank {rank} sent no progress report"
    seq = progress[rank]
    return f"rank {rank} is at operation #{seq}" if seq else f"rank {rank} has run no collective"
