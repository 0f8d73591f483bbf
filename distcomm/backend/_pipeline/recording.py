"""What a communicator tells the flight recorder (``DISTCOMM_TRACE``): an entry per public
collective, appended to the recorder's ring by the communicator itself, on the pipeline and on
the plans alike (no hook: a recorded communicator keeps its plans).

An entry is a list: its kind, the tuple :data:`HEAD` (the operation, the group's global ranks,
the dtype's name, bytes and root: one object shared by every planned call of the kind, made when
the kind is learnt), then its ``seq``, shape, the call site (the first frame outside distcomm,
as ``(code, instruction)``: :func:`~distcomm._call_sites.user_site`, which resolves each code
object's file once), and ``issued``, ``completed`` and ``error``, set as the call goes
(:data:`FIELDS` names them all, as a dump's record has them). It is made when the call is
numbered (:func:`opened`) or runs a plan (:meth:`~distcomm.backend._pipeline.steps.Steps._planned`,
which builds it in place). ``issued`` is read when the engine
is first called for it, ``completed`` when it returned (for a call answered without the engine,
a world of 1, both at once), both on the wall clock after :func:`~distcomm._device_clock.now`:
for a blocking call on a CUDA tensor, once the device finished the work queued before the call,
then the call's own. An async call is never synchronised (its times are the times to issue it).
The recorder (:class:`Recorder`, the runtime's flight recorder) turns entries into its dump's
records.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

from distcomm import _device_clock as device_clock
from distcomm._call_sites import user_site
from distcomm.backend._pipeline.mismatch_check import shape_of

if TYPE_CHECKING:
    from distcomm.backend._pipeline.steps import Steps
    from distcomm.backend.arrays import Adapter

__all__ = [
    "COMPLETED",
    "ERROR",
    "FIELDS",
    "HEAD",
    "ISSUED",
    "KIND",
    "OWN",
    "Recorder",
    "head",
    "opened",
    "stamp",
]

#: The fields of an entry's kind (its first item, a tuple), and the entry's own after it.
HEAD = ("op", "group", "dtype", "bytes", "root")
OWN = ("seq", "shape", "site", "issued", "completed", "error")
#: The fields of a record, in the order the dump writes them.
FIELDS = HEAD + OWN
#: Where the entry keeps its kind, and its times and error.
KIND, ISSUED, COMPLETED, ERROR = 0, 4, 5, 6


def head(
    op: str, group: tuple[int, ...], dtype: str | None, nbytes: int | None, root: int | None
) -> tuple[Any, ...]:
    """An entry's kind (:data:`HEAD`)."""
    return (op, group, dtype, nbytes, root)


class Recorder(Protocol):
    """Where a communicator's entries go: the flight recorder of this process's rank."""

    #: The global rank whose calls it keeps (a communicator of another thread-rank keeps none).
    rank: int

    def add(self, entry: list[Any]) -> None:
        """Keep ``entry`` (its last fields are filled in later, in place)."""

    def retract(self, entry: list[Any]) -> None:
        """Forget ``entry``, the last one added: its call was not made (a plan declined it)."""

    def failed(self, entry: list[Any], error: BaseException) -> None:
        """``entry``'s call raised ``error`` (a timeout's makes the recorder dump)."""


def stamp(device: str | None) -> float:
    """The wall clock, read after ``device`` finished its queued work (None: at once)."""
    if device is not None and device != "cpu":
        device_clock.now(device)
    return time.time()


def opened(
    comm: Steps, op: str, seq: int, x: Any, adapter: Adapter | None, root: int | None
) -> list[Any]:
    """The entry of call ``seq`` of ``op`` on ``comm`` (its array ``x`` and adapter, if any),
    with nothing issued yet."""
    shape = dtype = nbytes = None
    if adapter is not None:
        shape, dtype, nbytes = shape_of(x), adapter.dtype(x), getattr(x, "nbytes", None)
    return [
        head(op, comm._global_ranks, dtype, nbytes, root),
        seq,
        shape,
        user_site(),
        None,
        None,
        None,
    ]
