"""The routing of uneven all-to-alls (their split tables): checked on each rank, compared across
ranks.

``all_to_all_single(output, input, output_split_sizes, input_split_sizes)`` splits along the
first dimension, as torch's: ``input_split_sizes[r]`` rows go to rank r, ``output_split_sizes[s]``
rows come from rank s. Each rank checks its own lists (one per rank, non-negative ints, summing
to its tensor's rows). That rank r sends s what s expects from r is known to no rank alone: at the
check points of the mismatch check (every call under ``check``; the first 64 collectives and
then every 1024th under ``sample``) the ranks gather their tables and compare them, and a
disagreement is a :class:`~distcomm.errors.CollectiveMismatchError` naming both ranks' entries.
Between check points each rank keeps its tables in a ledger, settled at the next check point
(:mod:`~distcomm.backend._pipeline.routing_ledger`).

The commonest call, blocking, with lists of ints, contiguous arrays the engine moves as they are
(:func:`row_of_plain`) and a dtype like the calls before it (nothing new to record), goes from
:meth:`Movement._uneven_planned <distcomm.backend._pipeline.movement.Movement._uneven_planned>`
straight to the engine's plan for its class and dtype (where it has none, its ``all_to_all_v``
or the kit's).
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Any

from distcomm.backend._pipeline import object_transport as objects
from distcomm.backend._pipeline import routing_ledger
from distcomm.backend.arrays import cached_adapter
from distcomm.errors import CollectiveMismatchError, InvalidArgumentError

if TYPE_CHECKING:
    from distcomm.backend._pipeline.mismatch_check import MismatchCheck
    from distcomm.backend._pipeline.steps import Steps

__all__ = ["agree", "keep", "row_of_plain", "rows_of", "sizes"]


def rows_of(shape: tuple[int, ...], what: str) -> tuple[int, int]:
    """``(rows, elements per row)`` of an array of ``shape`` split along its first dimension."""
    if not shape:
        raise InvalidArgumentError(
            f"{what} is a 0-d array: an uneven all-to-all splits along the first dimension. "
            "HINT: pass an array of at least one dimension."
        )
    per_row = 1
    for n in shape[1:]:
        per_row *= n
    return shape[0], per_row


def sizes(given: Any, name: str, rows: int, world: int) -> list[int]:
    """``given`` (None: ``rows`` split equally) checked as a split of ``rows`` rows in
    ``world`` parts.

    Raises:
        InvalidArgumentError: not ``world`` non-negative ints summing to ``rows``, or None
            where ``rows`` does not divide equally.
    """
    if given is None:
        if rows % world:
            raise InvalidArgumentError(
                f"{name}=None splits the first dimension equally, but {rows} rows do not divide "
                f"into {world} ranks. HINT: pass {name} (rows per rank)."
            )
        return [rows // world] * world
    if (  # the common call: a list of ints (counts.tolist()), checked without conversions
        type(given) is list
        and len(given) == world
        and all(type(n) is int for n in given)
        and sum(given) == rows
        and min(given) >= 0
    ):
        return given
    try:
        split = list(given)
    except TypeError:
        split = []
    exact = all(isinstance(n, numbers.Integral) and not isinstance(n, bool) for n in split)
    if not exact or len(split) != world or min(split, default=-1) < 0 or sum(split) != rows:
        example = [rows // world] * (world - 1) + [rows - rows // world * (world - 1)]
        raise InvalidArgumentError(
            f"{name}={given!r} must be {world} non-negative ints (one per rank) summing to the "
            f"{rows} rows of the tensor's first dimension. HINT: rows per rank, e.g. {example} "
            "(a tensor of counts: pass counts.tolist())."
        )
    return [int(n) for n in split]


def agree(comm: Steps, sent: list[int], expected: list[int]) -> None:
    """Compare every rank's split table: what rank r sends s (``sent``) must be what s
    expects from r (``expected``).

    Raises:
        CollectiveMismatchError: on every rank, naming the first pair that disagrees and each
            rank's lists. Nothing was sent: the communicator stays usable.
    """
    tables = objects.all_gather_object(comm._object_channel(), (sent, expected))
    pair = routing_ledger.disagreement(tables)
    if pair is None:
        return
    r, s = pair
    raise CollectiveMismatchError(
        f"collective mismatch at operation #{comm.seq} on {comm.describe()}: "
        f"all_to_all_single's split tables disagree: rank {r} sends rank {s} "
        f"{tables[r][0][s]} rows, rank {s} expects {tables[s][1][r]} from rank {r}:"
        f"{routing_ledger.listing(tables)}\n"
        "Nothing was sent. HINT: rank r's input_split_sizes[s] must equal rank s's "
        "output_split_sizes[r] (exchange the counts first, e.g. with an even "
        "all_to_all_single of the counts, as MoE routing does).",
        table=routing_ledger.rows(tables),
        op="all_to_all_single",
        seq=comm.seq,
        group=comm.describe(),
    )


def keep(comm: Steps, h: MismatchCheck, sent: list[int], expected: list[int]) -> None:
    """Keep the tables of call ``comm.seq`` (not a check point) in ``h``'s ledger."""
    h.keep_tables(comm.seq, sent, expected)
    comm._plans.drop_barrier()  # the next barrier settles them


def row_of_plain(comm: Steps, output: Any, input: Any, expected: Any, sent: Any) -> int:
    """The elements of a row when the call needs no more than a look: two contiguous arrays of
    one class and dtype (the kit found it native) that share no memory, on a device it moves,
    rows of the same size, split lists of ints summing to their rows, a usable communicator of
    more than one rank; else -1."""
    world = comm._world_size
    if (
        sent.__class__ is not list
        or expected.__class__ is not list
        or len(sent) != world
        or len(expected) != world
        or output.__class__ is not input.__class__
        or output.dtype is not input.dtype
        or comm.unusable is not None
        or world == 1
    ):
        return -1
    adapter = cached_adapter(input)
    if adapter is None:
        return -1
    # (an input over the output: the pipeline copies it; a read-only output: it refuses it)
    if not adapter.plain_pair(output, input, comm.devices, comm.bound_device):
        return -1
    shape, rows_out = input.shape, output.shape
    if len(shape) == 2 and len(rows_out) == 2 and shape[1] == rows_out[1]:
        row = shape[1]  # (an int: numpy's shapes and torch.Size hold ints)
    elif shape and rows_out and rows_out[1:] == shape[1:]:
        row = math.prod(shape[1:])
    else:
        return -1
    for n in sent:
        if n.__class__ is not int or n < 0:
            return -1
    for n in expected:
        if n.__class__ is not int or n < 0:
            return -1
    if sum(sent) != shape[0] or sum(expected) != rows_out[0]:
        return -1
    return row
