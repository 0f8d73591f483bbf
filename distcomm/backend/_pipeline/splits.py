"""The split tables of an uneven all-to-all: checked on each rank, and compared across ranks.

``all_to_all_single(output, input, output_split_sizes, input_split_sizes)`` splits along the
first dimension, as torch's: ``input_split_sizes[r]`` rows go to rank r, ``output_split_sizes[s]``
rows come from rank s. Each rank checks its own lists (one per rank, non-negative ints, summing
to its tensor's rows). That rank r sends s what s expects from r is known to no rank alone: at the
check points of the mismatch check (every call under ``check``; the first 64 collectives and
then every 1024th under ``sample``) the ranks gather their tables and compare them, and a
disagreement is a :class:`~distcomm.errors.CollectiveMismatchError` naming both ranks' entries.
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any

from distcomm import _object_codec as objects
from distcomm.errors import CollectiveMismatchError, InvalidArgumentError

if TYPE_CHECKING:
    from distcomm.backend._pipeline.steps import Steps

__all__ = ["agree", "rows_of", "sizes"]


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
    for r, (mine, _) in enumerate(tables):
        for s, (_, theirs) in enumerate(tables):
            if mine[s] != theirs[r]:
                rows = [
                    {"op": "all_to_all_single", "input_split_sizes": a, "output_split_sizes": b}
                    for a, b in tables
                ]
                listing = "\n".join(
                    f"  rank {k}: input_split_sizes {a}, output_split_sizes {b}"
                    for k, (a, b) in enumerate(tables)
                )
                raise CollectiveMismatchError(
                    f"collective mismatch at operation #{comm.seq} on {comm.describe()}: "
                    f"all_to_all_single's split tables disagree: rank {r} sends rank {s} "
                    f"{mine[s]} rows, rank {s} expects {theirs[r]} from rank {r}:\n{listing}\n"
                    "Nothing was sent. HINT: rank r's input_split_sizes[s] must equal rank s's "
                    "output_split_sizes[r] (exchange the counts first, e.g. with an even "
                    "all_to_all_single of the counts, as MoE routing does).",
                    table=rows,
                    op="all_to_all_single",
                    seq=comm.seq,
                    group=comm.describe(),
                )
