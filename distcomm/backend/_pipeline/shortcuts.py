"""The shortcuts: a blocking collective like one the pipeline took before goes straight to the
backend's plain primitive (``_broadcast_plain``, ... in :mod:`distcomm.backend.primitives`).

A call the pipeline took (validated, counted, recorded) is remembered by its kind, (op, array
class, dtype, byte size, root) -> its fingerprint in the mismatch check's history
(:func:`mark`). A later blocking call of the same kind has nothing new to check or record but
its fingerprint: outside the check points, with no hooks registered, :func:`run` starts the
history's run of that fingerprint if the calls interleave (the ranks have agreed on it before)
and calls the primitive under the call's ``seq`` and "blocked in" mark. The primitive looks only
at what its engine needs (contiguous, in its memory, a dtype it moves) and returns False having
sent nothing otherwise; the pipeline then takes the call.

gather and scatter (:data:`ROOTED`) are of a kind by their tensor and root alike; their list,
given on the root only, must also be what the pipeline takes without a word (:func:`_list_fits`):
world_size arrays of the tensor's class, dtype and byte size, None off the root. Anything else
goes to the pipeline, which says what is wrong with it.

The current run is also kept in the communicator's ``_kit_plain_*`` attributes, which
``all_reduce`` (the commonest call) and the uneven all-to-all (:data:`UNEVEN`) test inline.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from distcomm.errors import DistcommError
from distcomm.protocol import ReduceOp

if TYPE_CHECKING:
    from distcomm.backend._pipeline.steps import Steps
    from distcomm.backend.arrays import Adapter

__all__ = ["ROOTED", "SHORTCUTS", "UNEVEN", "mark", "run"]

#: The operations with a shortcut.
SHORTCUTS = frozenset(
    {
        "all_reduce",
        "broadcast",
        "reduce",
        "all_gather_into_tensor",
        "reduce_scatter_tensor",
        "all_to_all_single",
        "gather",
        "scatter",
    }
)
#: The rooted ops: the list of world_size arrays like the tensor is given on the root only, and
#: the primitive is ``plain(x, parts, root)`` (``parts`` None off the root).
ROOTED = ("gather", "scatter")
#: ``_kit_plain_nbytes`` in a run of uneven all-to-alls (their sizes vary) of a dtype the engine
#: moves: a call of the run's class and dtype takes the shortcut of ``all_to_all_single``
#: (:func:`~distcomm.backend._pipeline.splits.shortcut`) without a record.
UNEVEN = -2
#: The ops with an output beside the input: its byte size for an input of ``n`` bytes.
_OUTPUTS: dict[str, Callable[[int, int], int]] = {
    "all_gather_into_tensor": lambda n, world: n * world,
    "reduce_scatter_tensor": lambda n, world: n // world if n % world == 0 else -1,
    "all_to_all_single": lambda n, world: n,
}
_MARKED_OPS = (None, ReduceOp.SUM)
#: How many kinds of call a communicator remembers (then it starts over).
_REMEMBERED = 256


def mark(
    comm: Steps,
    op: str,
    x: Any,
    adapter: Adapter | None,
    root: int | None,
    reduce_op: ReduceOp | None,
    varies: bool,
    fp: int,
) -> None:
    """Remember collective ``op``, which the pipeline validated and counted (``fp``: its
    fingerprint in the history, 0 without one), as a kind of call the shortcuts may take and as
    the current run. Ops of :data:`SHORTCUTS` only; reductions for SUM only; an uneven
    all-to-all (``varies``) of a dtype the engine moves as the run :data:`UNEVEN`."""
    nbytes = getattr(x, "nbytes", None)
    if varies and adapter is not None:
        nbytes = UNEVEN if adapter.dtype(x) in comm._kit_native_dtypes else None
    if op not in SHORTCUTS or nbytes is None or reduce_op not in _MARKED_OPS:
        comm._kit_plain_op = None  # the run is closed; the kinds remembered stay
        return
    cls, dtype = x.__class__, x.dtype
    comm._kit_plain_op, comm._kit_plain_root = op, root
    comm._kit_plain_cls, comm._kit_plain_dtype, comm._kit_plain_nbytes = cls, dtype, nbytes
    if not varies:
        known = comm._kit_plain_fps
        if len(known) >= _REMEMBERED:
            known.clear()
        known[op, cls, dtype, nbytes, root] = fp


def run(
    comm: Steps, op: str, plain: Callable[..., bool], x: Any, root: Any = None, out: Any = None
) -> bool:
    """Run a blocking ``op`` through the backend's ``plain`` primitive (``plain(x)``,
    ``plain(x, root)``, ``plain(out, x)`` for an op with an output, ``plain(x, out, root)`` for
    a rooted op, whose ``out`` is the list) if the call is of a kind :func:`mark` remembered
    and nothing else need happen (module docstring); the output must have ``x``'s class and
    dtype and the size ``x`` implies, the list be as :func:`_list_fits` says. Returns whether it
    ran; False: nothing was sent, nothing recorded, and the pipeline takes the call (and says
    what is wrong with it)."""
    seq = comm.seq + 1
    if seq >= comm._kit_next_check or comm._kit_observing or comm.unusable is not None:
        return False
    if root is not None and root.__class__ is not int:  # a rank; True is no rank
        return False
    current = (
        op == comm._kit_plain_op
        and x.__class__ is comm._kit_plain_cls
        and x.dtype is comm._kit_plain_dtype
        and x.nbytes == comm._kit_plain_nbytes
        and root == comm._kit_plain_root
    )
    fp = None if current else _known(comm, op, x, root)
    if not current and fp is None:
        return False
    rooted = op in ROOTED
    if rooted:
        if not _list_fits(comm, x, out, root):
            return False
    elif (size := _OUTPUTS.get(op)) is not None and (
        out is None
        or out.__class__ is not x.__class__
        or out.dtype is not x.dtype
        or out.nbytes != size(x.nbytes, comm._kit_world_size)
    ):
        return False
    if fp is not None:
        _start(comm, op, x, root, seq, fp)
    comm.op = op  # the call, inside seq and the "blocked in" mark, as the pipeline's
    comm.blocked_seq = comm.seq = seq
    try:
        if rooted:
            done = plain(x, out, root)
        elif out is not None:
            done = plain(out, x)
        else:
            done = plain(x) if root is None else plain(x, root)
    except DistcommError:  # distcomm's own: never wrapped as an engine's
        raise
    except comm.engine_errors as exc:
        raise comm.engine_failed(op, seq, exc) from exc
    finally:
        comm.blocked_seq = 0
    if not done:
        comm.seq = seq - 1  # nothing was sent: the pipeline counts the call
    return bool(done)


def _list_fits(comm: Steps, x: Any, parts: Any, root: Any) -> bool:
    """Whether a rooted call's list ``parts`` is one the pipeline takes as it is: None off the
    root; on it, a list or tuple of world_size arrays of exactly ``x``'s class and dtype and
    its byte size (so its element count)."""
    if comm._kit_rank != root:
        return parts is None
    cls = parts.__class__
    if (cls is not list and cls is not tuple) or len(parts) != comm._kit_world_size:
        return False
    cls, dtype, nbytes = x.__class__, x.dtype, x.nbytes
    for p in parts:
        if p.__class__ is not cls or p.dtype is not dtype or p.nbytes != nbytes:
            return False
    return True


def _known(comm: Steps, op: str, x: Any, root: Any) -> int | None:
    """The fingerprint of a kind of call ``x`` is of, if it was remembered and (with a history)
    the ranks have agreed on it; None otherwise (the pipeline confirms a kind first)."""
    try:
        fp = comm._kit_plain_fps.get((op, x.__class__, x.dtype, x.nbytes, root))
    except (AttributeError, TypeError):  # not an array
        return None
    h = comm._kit_history
    if fp is None or (h is not None and fp != h.run_fp and fp not in h.agreed):
        return None
    return fp


def _start(comm: Steps, op: str, x: Any, root: Any, seq: int, fp: int) -> None:
    """Call ``seq`` of kind ``fp`` interrupts the current run: start the history's run of ``fp``
    and make it the run the next calls are compared with."""
    h = comm._kit_history
    if h is not None and fp != h.run_fp:
        h.start_run(seq, fp)
    comm._kit_plain_op, comm._kit_plain_root = op, root
    comm._kit_plain_cls, comm._kit_plain_dtype = x.__class__, x.dtype
    comm._kit_plain_nbytes = x.nbytes
