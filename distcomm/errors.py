"""The exception hierarchy of distcomm.

Every error distcomm raises on purpose derives from :class:`DistcommError`. Messages name the
offending value with ``!r``, list the valid choices, and end with a ``HINT:`` saying how to fix it.
Where a standard exception fits too (``LookupError``, ``ValueError``, ``TimeoutError``), the
distcomm error derives from both so that existing ``except`` clauses keep working.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "AlreadyInitializedError",
    "BackendNotFoundError",
    "BackendUnavailableError",
    "CollectiveMismatchError",
    "DistTimeoutError",
    "DistcommError",
    "DistcommWarning",
    "EngineError",
    "EnvironmentDetectionError",
    "InvalidArgumentError",
    "MainOnlyCollectiveError",
    "NotInitializedError",
    "NotSameError",
    "NotSupportedError",
    "ObjectRefusedError",
    "OperationError",
    "PluginConflictError",
    "RankFailedError",
]


class DistcommError(Exception):
    """Base class of every error raised by distcomm.

    Raised itself when a communicator can no longer be used: after ``finalize()``, or after
    one of its operations timed out or failed (the message says why).
    """


class BackendNotFoundError(DistcommError, LookupError):
    """No backend of the requested name is registered, or none is available for this launch.

    The message lists the available names, the first-party distributions that are not
    installed and how to install them, and a did-you-mean.
    """


class BackendUnavailableError(DistcommError):
    """The backend is registered but cannot run here: it is unavailable for this launch, or
    two plugins registered it; ``backend`` names it and ``reason`` says why."""

    def __init__(self, message: str, *, backend: str | None = None, reason: str | None = None):
        super().__init__(message)
        self.backend = backend
        self.reason = reason


class EnvironmentDetectionError(DistcommError):
    """A launcher variable is present but malformed (``variable`` and ``value`` name it), or
    ``method=`` named a launcher that did not start this process (docs/launch.md)."""

    def __init__(self, message: str, *, variable: str | None = None, value: str | None = None):
        super().__init__(message)
        self.variable = variable
        self.value = value


class InvalidArgumentError(DistcommError, ValueError):
    """An argument has a value distcomm cannot use: a bad op, dtype, rank, tag, size, device
    or timeout, an unknown method name, an option the backend does not take, or
    ``group=NON_MEMBER``."""


class NotInitializedError(DistcommError):
    """An operation needs ``distcomm.init()`` first: ``get_communicator()`` before ``init()``,
    or a collective before ``init()`` in a world larger than 1."""


class AlreadyInitializedError(DistcommError):
    """``init()`` was called again with arguments that differ from the running communicator."""


class PluginConflictError(DistcommError):
    """Two plugins registered the same backend or environment name.

    It is recorded when the plugins load and shown by ``distcomm info``, not raised into the
    program: asking for the conflicted backend raises BackendUnavailableError, with the
    conflict as its reason.
    """


class NotSupportedError(DistcommError, NotImplementedError):
    """The backend's engine cannot do this at all (its capabilities say so), e.g. point-to-point
    messages on linklink (``p2p=False``), splitting a linklink sub-group
    (``subgroup_split=False``), ``adopt`` on a backend that cannot. The message names the
    backend and the alternative."""


class OperationError(DistcommError):
    """An operation on a communicator failed; base of DistTimeoutError and EngineError.

    Attributes:
        op: the operation's name, e.g. ``"all_reduce"``.
        seq: the operation's sequence number on its communicator (the count of collectives
            there, the same on every member), when known.
        group: a description of the communicator.
        missing_ranks: ranks (of that communicator) that had not reached the operation, when
            known; None when distcomm could not find out.
        stacks: after a timeout, where each of ``missing_ranks`` that answered was: its
            Python stack (rank -> text, innermost call last), also shown in the message;
            empty when none answered or distcomm could not ask.
    """

    def __init__(
        self,
        message: str,
        *,
        op: str | None = None,
        seq: int | None = None,
        group: str | None = None,
        missing_ranks: Sequence[int] | None = None,
        stacks: Mapping[int, str] | None = None,
    ):
        super().__init__(message)
        self.op = op
        self.seq = seq
        self.group = group
        self.missing_ranks = tuple(missing_ranks) if missing_ranks is not None else None
        self.stacks = dict(stacks or {})


class DistTimeoutError(OperationError, TimeoutError):
    """An operation (or ``init``'s rendezvous) did not complete within its timeout, or
    ``run_threads`` / ``spawn`` did not finish within their own (see OperationError's
    attributes)."""


class EngineError(OperationError, RuntimeError):
    """The engine failed an operation (a peer went away, a transport error); the engine's own
    exception is the ``__cause__`` (see OperationError's attributes)."""


class CollectiveMismatchError(OperationError, ValueError):
    """The ranks of a group called different collectives: another op, dtype, element count,
    root or reduce op, or one rank a collective where another called none. ``seq`` is the
    **first** operation at which they differ (see OperationError's attributes). Found before
    any rank ran it, the operation was not run and the communicator can still be used;
    otherwise ``ran`` says which operations ran with mismatched calls, and the communicator is
    retired.

    Attributes:
        table: one row per rank of the group, in rank order: a dict with ``op``, ``shape``,
            ``dtype``, ``numel``, ``root``, ``reduce_op`` and ``site`` (the call's file:line;
            for calls made earlier, where that call was first made), all None with a ``note``
            for a rank that made no collective there.
        ran: ``(first, last)``: the operations that ran on some rank after the ranks parted
            (their results may be wrong), or None when none did.
    """

    def __init__(
        self,
        message: str,
        *,
        table: Sequence[dict[str, object]],
        op: str | None = None,
        seq: int | None = None,
        group: str | None = None,
        ran: tuple[int, int] | None = None,
    ):
        super().__init__(message, op=op, seq=seq, group=group)
        self.table = [dict(row) for row in table]
        self.ran = ran


class ObjectRefusedError(OperationError, pickle.UnpicklingError):
    """An object a peer sent was refused before anything of it was built: it named a class or
    function that is not on the allow-list (``refused``, e.g. ``"posix.system"``), or its
    message announced more bytes than ``DISTCOMM_MAX_OBJECT_BYTES`` (``size``). ``sender`` is
    the rank that sent it (of the communicator), when known; see OperationError's attributes
    and docs/security.md.
    """

    def __init__(
        self,
        message: str,
        *,
        refused: str | None = None,
        size: int | None = None,
        sender: int | None = None,
        **where: object,
    ):
        super().__init__(message, **where)  # type: ignore[arg-type]
        self.refused = refused
        self.size = size
        self.sender = sender


class MainOnlyCollectiveError(OperationError, RuntimeError):
    """A collective was called inside a region only the main rank runs (the body of
    ``main_process_only``, ``run_on_main``'s function, ``zero_first``'s block on main): the
    other ranks would never join it. It was not run (see OperationError's attributes).

    Attributes:
        site: ``file:line`` of the collective's call.
        region: what the region is and ``file:line`` where it was entered.
    """

    def __init__(self, message: str, *, site: str, region: str, **where: object):
        super().__init__(message, **where)  # type: ignore[arg-type]
        self.site = site
        self.region = region


class NotSameError(OperationError, AssertionError):
    """``assert_same`` found that the ranks hold different values (see OperationError's
    attributes).

    Attributes:
        ranks: the ranks whose value differs from the majority's (ties: from rank 0's).
        keys: the keys or item paths whose values differ, e.g. ``"['layer.weight']"``
            (``""``: the value itself).
    """

    def __init__(self, message: str, *, ranks: Sequence[int], keys: Sequence[str], **where: object):
        super().__init__(message, **where)  # type: ignore[arg-type]
        self.ranks = list(ranks)
        self.keys = list(keys)


class RankFailedError(DistcommError):
    """A rank of a multi-rank run (``run_threads``, ``spawn``) raised; ``rank`` and
    ``traceback`` (text) say which and where."""

    def __init__(self, rank: int, traceback: str, message: str | None = None):
        self.rank = rank
        self.traceback = traceback
        super().__init__(message or f"rank {rank} failed:\n{traceback.rstrip()}")

    def __reduce__(self) -> tuple[type[RankFailedError], tuple[int, str, str]]:
        return (type(self), (self.rank, self.traceback, str(self)))


def did_you_mean(value: str, choices: Iterable[str]) -> str:
    """Return ``"did you mean 'x'?"`` for the closest choice, or ``""``."""
    import difflib

    close = difflib.get_close_matches(value.lower(), [c.lower() for c in choices], n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else ""


class DistcommWarning(UserWarning):
    """A warning distcomm issues: the program runs, but probably not as the user meant.

    Issued for a Slurm batch script that runs Python without ``srun`` (docs/launch.md), CUDA
    tensors staged through host memory on a CPU-only backend (docs/backends.md), a
    ``dist_init(device_id=)`` naming a GPU other than the one the GPU backend's communicator
    uses, and a ``finalize()`` that could not confirm the calls with the other ranks or left
    Works that had not completed. Turn it into an error with
    ``warnings.simplefilter("error", distcomm.DistcommWarning)``.
    """
