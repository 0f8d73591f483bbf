"""Ending the whole job from one rank, and the two policies that ask for it.

- ``DISTCOMM_ON_TIMEOUT`` (``raise``, the default, or ``abort``): what a timed-out operation does.
  ``abort`` prints the diagnostic and ends the job with a non-zero status.
- ``DISTCOMM_ABORT_ON_EXCEPTION`` (default on; ``0`` turns it off): under MPI launchers a rank
  that dies of an uncaught exception would otherwise leave the others waiting in their next
  collective (and its own exit blocked in ``MPI_Finalize``). Backends whose job is an MPI job
  call :func:`abort_on_uncaught_exception` at init: the rank's traceback prints once, then the
  whole job ends, as mpi4py's ``python -m mpi4py`` runner does.

How a job is ended is the backend's to say (:func:`set_job_abort`; ``MPI_Abort`` on MPI); by
default the process exits with status 1, which every launcher (``distcomm run``, torchrun, srun)
sees as a failed rank.

An abort leaves no time for ``atexit``: what a process must write before it ends (the flight
recorder's dump) registers with :func:`add_last_words`. Before ending the job, :func:`abort_job`
runs them, then tells the other ranks (:func:`set_abort_notice`; MPI's side channel asks each
rank to run its own and waits a moment for them), so that every rank's dump is there. Where the
launcher ends the other ranks with SIGTERM (``distcomm run``, torchrun, Slurm), their SIGTERM
handler writes them.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping
from typing import NoReturn

from distcomm import _settings
from distcomm.backend import _uncaught

__all__ = [
    "ON_TIMEOUT_CHOICES",
    "abort_job",
    "abort_on_exception",
    "abort_on_uncaught_exception",
    "add_last_words",
    "last_words",
    "on_timeout",
    "set_abort_notice",
    "set_job_abort",
]

ON_TIMEOUT_CHOICES = _settings.ON_TIMEOUT_CHOICES

_job_abort: Callable[[], object] | None = None
_abort_notice: Callable[[], object] | None = None
_last_words: list[Callable[[], object]] = []
#: Seconds for the launcher to forward this rank's last output before the job ends.
_FORWARD = 0.3


def set_job_abort(abort: Callable[[], object]) -> None:
    """Make ``abort`` the way to end every rank of this job (e.g. ``MPI.COMM_WORLD.Abort``)."""
    global _job_abort
    _job_abort = abort


def set_abort_notice(notice: Callable[[], object]) -> None:
    """Make ``notice()`` the way to have the other ranks run their :func:`last_words` before
    this one ends the job (it returns once they did, or after a moment)."""
    global _abort_notice
    _abort_notice = notice


def add_last_words(callback: Callable[[], object]) -> None:
    """Call ``callback()`` before the job is aborted, by this rank or another (once per abort)."""
    _last_words.append(callback)


def last_words() -> None:
    """Run what :func:`add_last_words` registered (a failing one is skipped); a backend calls it
    when another rank says that it is about to end the job."""
    for callback in list(_last_words):
        with contextlib.suppress(Exception):  # last words must not keep the job from ending
            callback()


def abort_job(message: str) -> NoReturn:
    """Print ``message`` on stderr (each line ``[rank N] ``-prefixed in a world of several
    ranks, in one piece; nothing when it is empty), run the last words of this rank and of the
    others (when any are registered here), and end the job: the backend's way, else exit
    status 1."""
    if message:
        _uncaught.write(message)
    if _last_words:
        last_words()
        if _abort_notice is not None:
            with contextlib.suppress(Exception):  # the others not told: end the job all the same
                _abort_notice()
    abort = _job_abort
    if abort is not None:
        time.sleep(_FORWARD)  # a launcher's output forwarding drops what is in flight at abort
        abort()
    os._exit(1)


def on_timeout(environ: Mapping[str, str] | None = None) -> str:
    """The ``DISTCOMM_ON_TIMEOUT`` policy: ``"raise"`` (default) or ``"abort"``.

    Raises:
        InvalidArgumentError: another value.
    """
    return str(_settings.read("DISTCOMM_ON_TIMEOUT", environ))


def abort_on_exception(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``DISTCOMM_ABORT_ON_EXCEPTION`` lets a dying rank end an MPI job (default yes)."""
    return bool(_settings.read("DISTCOMM_ABORT_ON_EXCEPTION", environ))


def abort_on_uncaught_exception(rank: int, abort: Callable[[], object], how: str) -> None:
    """Make an uncaught exception on this rank end the job with ``abort`` (and make ``abort``
    the job's abort), unless ``DISTCOMM_ABORT_ON_EXCEPTION=0``. Installed once per process.

    Args:
        rank: this process's global rank, for the message.
        abort: ends every rank (``MPI.COMM_WORLD.Abort``).
        how: names ``abort`` in the message, e.g. ``"MPI_Abort"``.
    """
    set_job_abort(abort)
    if not abort_on_exception():
        return

    def ending(exc: BaseException) -> str:
        return (
            f"distcomm: rank {rank} died of an uncaught {type(exc).__name__} (traceback above); "
            f"ending the whole job ({how}) so that the other ranks do not wait for it. "
            "HINT: DISTCOMM_ABORT_ON_EXCEPTION=0 keeps the job running (the others then stop "
            "at their timeout)."
        )

    _uncaught.install(rank)
    _uncaught.end_job_with(ending)
