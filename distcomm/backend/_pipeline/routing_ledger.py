"""The split tables of the uneven all-to-alls between two check points: kept, and settled at the
next check point, blocking barrier or ``finalize()``.

At a check point the ranks compare an uneven all-to-all's tables before it is issued
(:func:`~distcomm.backend._pipeline.routing.agree`). Between check points a call only appends
its tables to this rank's ledger. At the next check point, blocking ``barrier`` or
``finalize()``, once the ranks found that they made the same calls, each rank sums its tables
into a *balance*: for each other rank, the hash of the sequence of rows it sent that rank over
the calls kept (``+``) and of the rows it expected from it (``-``), weighted per pair of ranks,
modulo the prime 2**61 - 1. Where every rank r sent s what s expected from r, the pair's hashes
are equal and cancel, and the ranks' balances sum to 0; where a pair disagreed by any number of
rows in any call, the sum is 0 with a chance of about 2**-60. (A sequence's hash is Python's
hash of a tuple of ints, the same in every process of one Python version; its cost, a few
microseconds for a thousand calls, keeps a settlement cheap: a check point after a thousand
uneven calls costs tens of microseconds, where per-call weights cost a millisecond.) The ranks
gather their balances (one all-gather of an int, only when uneven calls were made since the
last settlement); a sum that is not 0 makes them gather their tables and raise
:class:`~distcomm.errors.CollectiveMismatchError` naming the first call whose tables disagreed,
with every rank's lists. Those calls ran (their results are wrong), so the communicator is
retired, as for any mismatch found after it ran.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from distcomm.backend._pipeline import object_transport as objects
from distcomm.errors import CollectiveMismatchError

if TYPE_CHECKING:
    from distcomm.backend._pipeline.steps import Steps

__all__ = ["Kept", "Ledger", "disagreement", "listing", "rows", "settle"]

_P = (1 << 61) - 1
#: Kept = tuple[list[int], list[int], list[int]]: the calls a ledger kept, as it gives them up
#: (:meth:`Ledger.take`): their ``seq``, then their sent and expected lists one after another.
Kept = tuple[list[int], list[int], list[int]]


def _mix(x: int) -> int:
    """A 64-bit mix of ``x`` (splitmix64's finaliser), reduced modulo the prime: the same in
    every process, unlike ``hash``."""
    x = (x + 0x9E3779B97F4A7C15) * 0xBF58476D1CE4E5B9 & (1 << 64) - 1
    x = (x ^ (x >> 31)) * 0x94D049BB133111EB & (1 << 64) - 1
    return (x ^ (x >> 29)) % _P


class Ledger:
    """One rank's uneven all-to-alls since the last settlement (module docstring): ``seqs``,
    and the calls' ``sent`` and ``expected`` lists one after another (world_size ints a call:
    a column, what went to or came from one rank, is a slice)."""

    __slots__ = ("expected", "receive_weights", "send_weights", "sent", "seqs", "world")

    def __init__(self, rank: int, world: int) -> None:
        self.world = world
        self.send_weights = [_mix(rank * world + s) for s in range(world)]
        self.receive_weights = [_mix(s * world + rank) for s in range(world)]
        self.seqs: list[int] = []
        self.sent: list[int] = []
        self.expected: list[int] = []

    def __len__(self) -> int:
        """The calls kept since the last settlement."""
        return len(self.seqs)

    def keep(self, seq: int, sent: list[int], expected: list[int]) -> None:
        """Keep the tables of uneven all-to-all ``seq``: what this rank sent each rank, and
        what it expected from each (world_size ints each)."""
        self.seqs.append(seq)
        self.sent += sent
        self.expected += expected

    def take(self) -> tuple[int, Kept]:
        """This rank's balance of the calls kept, and the calls, which it forgets."""
        balance = self.balance()
        kept = (self.seqs, self.sent, self.expected)
        self.seqs, self.sent, self.expected = [], [], []
        return balance, kept

    def balance(self) -> int:
        """This rank's share of the balance of the calls kept (0 for none): per rank, the hash
        of the rows sent it call after call, less the hash of the rows expected from it, each
        weighted by its pair (module docstring)."""
        if not self.seqs:
            return 0
        w, total = self.world, 0
        for s in range(w):
            total += self.send_weights[s] * hash(tuple(self.sent[s::w]))
            total -= self.receive_weights[s] * hash(tuple(self.expected[s::w]))
        return total % _P


def settle(comm: Steps, last: int, where: str) -> None:
    """Settle ``comm``'s ledger, if it kept calls: gather the ranks' balances (every rank has
    made the same calls: the caller just saw that their running values agree) and start a new
    ledger. ``last``: the latest operation issued; ``where``: what found it (for the message).

    Raises:
        CollectiveMismatchError: the balances do not cancel: the first call whose tables
            disagree, with every rank's lists; the communicator is retired.
    """
    h = comm._mismatch_check
    if h is None or not h.ledger:
        return
    channel = comm._object_channel()
    mine, kept = h.take_tables()
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
    every: list[Kept],
    last: int,
    where: str,
) -> CollectiveMismatchError:
    """The error naming the first kept call whose tables disagree (``every``: each rank's
    kept calls, the same ``seq`` at each index)."""
    w = len(every)
    for i, seq in enumerate(every[0][0]):
        row = slice(i * w, (i + 1) * w)
        tables = [(sent[row], expected[row]) for _, sent, expected in every]
        pair = disagreement(tables)
        if pair is not None:
            r, s = pair
            sent, expected = tables[r][0][s], tables[s][1][r]
            what = f"rank {r} sent rank {s} {sent} rows, rank {s} expected {expected}"
            return _error(comm, (seq, last), where, what, tables)
    first = every[0][0][0] if every[0][0] else last  # not reached: the balances sum to 0 then
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
