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

from collections.abc import Mapping
from typing import Any

from distcomm.backend import aborts, stacks
from distcomm.errors import DistTimeoutError, EngineError

__all__ = ["Failures", "lost_peer", "missing_ranks"]

#: Engine messages that mean a peer process went away (gloo, MPI, sockets).
_LOST_PEER = (
    "connection closed",
    "connection reset",
    "connection refused",
    "broken pipe",
    "closed by peer",
    "socket closed",
    "end of file",
)


def lost_peer(message: str) -> bool:
    """Whether an engine's error message means that a peer process went away."""
    text = message.lower()
    return any(phrase in text for phrase in _LOST_PEER)


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

    def describe(self) -> str:
        raise NotImplementedError

    # -- for backends ----------------------------------------------------------------------------
    def timed_out(
        self, op: str, seq: int | None, limit: float, waiting_for: str = "", stalled: str = ""
    ) -> DistTimeoutError:
        """Retire this communicator after ``op`` did not complete within ``limit`` seconds and
        return the error to raise; under ``DISTCOMM_ON_TIMEOUT=abort``, end the job instead.

        Args:
            op: the operation's name.
            seq: its sequence number (None for point-to-point messages, which have none).
            limit: the seconds waited.
            waiting_for: what a point-to-point operation waited for ("a message from rank 1").
            stalled: why the operation can never complete, when the engine knows it before
                the timeout (an in-process world where every rank waits).
        """
        label = _label(op, seq)
        missing, detail = self._arrivals(seq) if seq else (None, waiting_for or "")
        where, shown = self._stacks(missing)
        gap = f"\n{shown}\n" if shown else " "
        late = (
            f"can never complete ({stalled})" if stalled else f"did not complete within {limit:g} s"
        )
        self.unusable = f"{label} {'stalled' if stalled else f'timed out after {limit:g} s'}"
        message = (
            f"{label} on {self.describe()} {late}{'; ' + detail if detail else ''}."
            f"{gap}HINT: a rank is stuck, died or "
            "skipped this call; if it is merely slow, raise init(timeout=...) or DISTCOMM_TIMEOUT."
        )
        error = DistTimeoutError(
            message, op=op, seq=seq, group=self.describe(), missing_ranks=missing, stacks=where
        )
        if aborts.on_timeout() == "abort":
            self._abort_job(f"distcomm: rank {self._rank}: {message} (DISTCOMM_ON_TIMEOUT=abort)")
        return error

    def engine_failed(self, op: str, seq: int | None, exc: BaseException) -> EngineError:
        """Retire this communicator after the engine raised ``exc`` in ``op``; return the
        distcomm error to raise from it (``raise comm.engine_failed(...) from exc``)."""
        label = _label(op, seq)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        self.unusable = f"{label} failed: {first}"
        lost = lost_peer(str(exc))
        missing, detail = self._arrivals(seq) if seq else (None, "")
        what = "a peer went away" if lost else "the engine failed"
        hint = (
            "look above for the traceback of the rank that died (or its launcher's report)"
            if lost
            else "the engine's own error is the cause below"
        )
        message = (
            f"{label} on {self.describe()} failed: {what} ({type(exc).__name__}: {first})"
            f"{'; ' + detail if detail else ''}. HINT: {hint}."
        )
        return EngineError(message, op=op, seq=seq, group=self.describe(), missing_ranks=missing)

    def _peer_progress(self) -> Mapping[int, int] | None:
        """Each member's sequence number (the latest collective it entered), found out of band;
        a member that could not be asked is left out. None: this backend cannot tell.

        Called on the failing rank only, after an operation timed out or failed.
        """
        return None

    def _peer_stacks(self, ranks: list[int]) -> Mapping[int, str] | None:
        """Where each of ``ranks`` (members) is: the text of :func:`distcomm.backend.stacks.where`
        there, found out of band within a few seconds; a member that did not answer is left
        out. None: this backend cannot ask.

        Called on the timed-out rank only, after :meth:`_peer_progress`.
        """
        return None

    def _abort_job(self, message: str) -> None:
        """End the job after a timeout under ``DISTCOMM_ON_TIMEOUT=abort`` (thread-ranks end
        their fabric instead, and the caller raises)."""
        aborts.abort_job(message)

    # -- helpers ---------------------------------------------------------------------------------
    def _stacks(self, missing: list[int] | None) -> tuple[dict[int, str], str]:
        """Where each of ``missing`` is, asked out of band, and the block that shows it ("" when
        none was missing or the backend cannot ask)."""
        if not missing:
            return {}, ""
        try:
            found = self._peer_stacks(missing)
        except Exception as exc:  # the side channel failed too: say so, never guess
            return {}, f"The stacks of the ranks that had not arrived are unknown ({exc})."
        if found is None:
            return {}, ""
        where = {rank: found[rank] for rank in missing if rank in found}
        return where, stacks.describe(where, missing)

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
            return [], "every rank had arrived (the engine itself did not complete it)"
        where = ", ".join(_where(r, progress) for r in missing)
        return missing, f"ranks that had not arrived: {missing} ({where})"


def _where(rank: int, progress: Mapping[int, Any]) -> str:
    if rank not in progress:
        return f"rank {rank} sent no progress report"
    seq = progress[rank]
    return f"rank {rank} is at operation #{seq}" if seq else f"rank {rank} has run no collective"
