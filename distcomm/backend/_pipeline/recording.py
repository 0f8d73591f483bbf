"""What a communicator tells the flight recorder (``DISTCOMM_TRACE``): an entry per public
collective, appended to the recorder's ring by the communicator itself, on the pipeline and on
the plans alike (no hook: a recorded communicator keeps its plans).

An entry is a list of :data:`FIELDS` made when the call is numbered (:func:`opened`) or runs a
plan (:meth:`~distcomm.backend._pipeline.steps.Steps._planned`, which builds it in place):
the operation, its ``seq``, the group's global ranks, shape, dtype (its name), bytes, root, the
call site (the first frame outside distcomm, as ``(code, instruction)``:
:func:`~distcomm._call_sites.user_site`, which resolves each code object's file once), and
``issued``, ``completed`` and ``error``, set as the call goes. ``issued`` is read when the engine
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

__all__ = ["COMPLETED", "ERROR", "FIELDS", "ISSUED", "Recorder", "opened", "stamp"]

#: An entry's fields, in order.
FIELDS = (
    "op",
    "seq",
    "group",
    "shape",
    "dtype",
    "bytes",
    "root",
    "site",
    "issued",
    "completed",
    "error",
)
ISSUED, COMPLETED, ERROR = 8, 9, 10


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
        op,
        seq,
        comm._global_ranks,
        shape,
        dtype,
        nbytes,
        root,
        user_site(),
        None,
        None,
        None,
    ]
