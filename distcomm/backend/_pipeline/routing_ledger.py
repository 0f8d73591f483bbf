"""The split tables of the uneven all-to-alls between two check points: kept, and settled at the
next check point, blocking barrier or ``finalize()``.

At a check point the ranks compare an uneven all-to-all's tables before it is issued
(:func:`~distcomm.backend._pipeline.routing.agree`). Between check points a call only appends
its tables to this rank's ledger. At the next check point, blocking ``barrier`` or
``finalize()``, once the ranks found that they made the same calls, each rank sums its tables
into a *balance*: a random linear form over what it sent each rank (``+``) and expected from
each (``-``), weighted per pair of ranks and per call, modulo the prime 2**61 - 1. Where every
rank r sent s what s expected from r, the terms cancel and the ranks' balances sum to 0; where
a pair disagreed by any number of rows in any call, the sum is 0 with a chance of about 2**-30
at most. The ranks gather their balances (one all-gather of an int, only when uneven calls were
made since the last settlement); a sum that is not 0 makes them gather their tables and raise
:class:`~distcomm.errors.CollectiveMismatchError` naming the first call whose tables disagreed,
with every rank's lists. Those calls ran (their results are wrong), so the communicator is
retired, as for any mismatch found after it ran.
"""

from __future__ import annotations

from operator import mul
from typing import TYPE_CHECKING

from distcomm.backend._pipeline import object_transport as objects
from distcomm.errors import CollectiveMismatchError

if TYPE_CHECKING:
    from distcomm.backend._pipeline.steps import Steps

__all__ = ["Ledger", "Table", "disagreement", "listing", "rows", "settle"]

_P = (1 << 61) - 1
#: Table = tuple[int, tuple[int, ...], tuple[int, ...]]: (seq, sent, expected) of one call.
Table = tuple[int, tuple[int, ...], tuple[int, ...]]


def _mix(x: int) -> int:
    """A 64-bit mix of ``x`` (splitmix64's finaliser), reduced modulo the prime: the same in
    every process, unlike ``hash``."""
    x = (x + 0x9E3779B97F4A7C15) * 0xBF58476D1CE4E5B9 & (1 << 64) - 1
    x = (x ^ (x >> 31)) * 0x94D049BB133111EB & (1 << 64) - 1
    return (x ^ (x >> 29)) % _P


#: The weight of the i-th call since the last settlement (grown as needed): 30 bits, so that
#: Python multiplies them fast; two calls' errors cancel with a chance of about 2**-30, and the
#: pairs' 61-bit weights then make any other disagreement show.
_CALL_WEIGHTS: list[int] = []


def _call_weights(n: int) -> list[int]:
    while len(_CALL_WEIGHTS) < n:
        _CALL_WEIGHTS.append(_mix(len(_CALL_WEIGHTS) + (1 << 40)) >> 31 | 1)
    return _CALL_WEIGHTS


class Ledger:
    """One rank's uneven all-to-alls since the last settlement (module docstring): ``calls``,
    a list of :data:`Table` a call appends to."""

    __slots__ = ("calls", "receive_weights", "send_weights")

    def __init__(self, rank: int, world: int) -> None:
        self.send_weights = [_mix(rank * world + s) for s in range(world)]
        self.receive_weights = [_mix(s * world + rank) for s in range(world)]
        self.calls: list[Table] = []

    def __len__(self) -> int:
        """The calls kept since the last settlement."""
        return len(self.calls)

    def keep(self, seq: int, sent: list[int], expected: list[int]) -> None:
        """Keep the tables of uneven all-to-all ``seq``: what this rank sent each rank, and
        what it expected from each."""
        self.calls.append((seq, tuple(sent), tuple(expected)))

    def take(self) -> tuple[int, list[Table]]:
        """This rank's balance of the calls kept, and the calls, which it forgets."""
        balance = self.balance()
        kept, self.calls = self.calls, []
        return balance, kept

    def balance(self) -> int:
        """This rank's share of the balance of the calls kept (0 for none)."""
        if not self.calls:
            return 0
        weights = _call_weights(len(self.calls))
        _, sent, expected = zip(*self.calls, strict=True)
        total = 0
        for w, column in zip(self.send_weights, zip(*sent, strict=True), strict=True):
            total += w * sum(map(mul, weights, column))
        for w, column in zip(self.receive_weights, zip(*expected, strict=True), strict=True):
            total -= w * sum(map(mul, weights, column))
        return total % _P


def settle(comm: Steps, last: int, where: str) -> None:
    """Settle ``comm``'s ledger, if it kept calls: gather the ranks' balances (every rank has
    made the same calls: the caller just saw that their running values agree) and start a new
    ledger. ``last``: the latest operation issued; ``where``: what found it (for the message).

    Raises:
        CollectiveMismatchError: the balances do not cancel: the first call whose tables
            disagree, with every rank's lists; the communicator is retired.
    """
    h = comm._history
    if h is None or not h.ledger:
        return
    channel = comm._object_channel()
    mine, kept = h.ledger.take()
    if sum(objects.all_gather_object(channel, mine)) % _P == 0:
        return
    every = objects.all_gather_object(channel, kept)
    error = _mismatch(comm, every, last, where)
    comm._after_mismatch(error)
    raise error


def disagreement(tables: list[tuple[list[int], list[int]]]) -> tuple[int, int] | None:
    """The first pair ``(r, s)`` whose entries disagree in every rank's ``(sent, expected)``
    (rank r sends s ``tables[r][0][s]`` rows, s expects ``tables[s][1][r]``), or None."""
    for r, (mine, _) in enumerate(tables):
        for s, (_, theirs) in enumerate(tables):
            if mine[s] != theirs[r]:
                return r, s
    return None


def listing(tables: list[tuple[list[int], list[int]]]) -> str:
    """Every rank's split sizes, a line each (each line starts with a newline)."""
    return "".join(
        f"\n  rank {k}: input_split_sizes {a}, output_split_sizes {b}"
        for k, (a, b) in enumerate(tables)
    )


def rows(tables: list[tuple[list[int], list[int]]]) -> list[dict[str, object]]:
    """Every rank's split sizes as the rows of ``CollectiveMismatchError.table``."""
    return [
        {"op": "all_to_all_single", "input_split_sizes": a, "output_split_sizes": b}
        for a, b in tables
    ]


def _mismatch(
    comm: Steps,
    every: list[list[Table]],
    last: int,
    where: str,
) -> CollectiveMismatchError:
    """The error naming the first kept call whose tables disagree (``every``: each rank's
    kept calls, the same ``seq`` at each index)."""
    for i, (seq, _, _) in enumerate(every[0]):
        tables = [(list(calls[i][1]), list(calls[i][2])) for calls in every]
        pair = disagreement(tables)
        if pair is not None:
            r, s = pair
            sent, expected = tables[r][0][s], tables[s][1][r]
            what = f"rank {r} sent rank {s} {sent} rows, rank {s} expected {expected}"
            return _error(comm, (seq, last), where, what, tables)
    first = every[0][0][0] if every[0] else last  # not reached: the balances sum to 0 then
    return _error(comm, (first, last), where, "the tables kept do not show where", [])


def _error(
    comm: Steps,
    ran: tuple[int, int],
    where: str,
    what: str,
    tables: list[tuple[list[int], list[int]]],
) -> CollectiveMismatchError:
    seq, last = ran
    return CollectiveMismatchError(
        f"collective mismatch at operation #{seq} on {comm.describe()}: all_to_all_single's "
        f"split tables disagreed ({what}):{listing(tables)}\nOperations #{seq} to #{last} ran: "
        f"their results may be wrong, and the communicator is retired. Found at {where}. "
        "HINT: rank r's input_split_sizes[s] must equal rank s's output_split_sizes[r] "
        "(exchange the counts first, e.g. with an even all_to_all_single of the counts, as MoE "
        "routing does); DISTCOMM_DEBUG=check compares the tables before every call.",
        table=rows(tables),
        op="all_to_all_single",
        seq=seq,
        group=comm.describe(),
        ran=ran,
    )
