"""gloo's plans of blocking calls (``TorchEngine.plan``, :mod:`distcomm_torch.plans`),
in one program of 2 ranks run once for the module.

Past the first 64 collectives (all checked: the pipeline only), a blocking call of a kind the
pipeline took before runs the engine's plan for that kind (``distcomm.backend._pipeline.plans``);
the program then turns the mismatch check off, so that each call's way is the plan's alone.
The program counts what the plans did, by wrapping the engine's ``plan`` that the world's
``_plans`` asks (each plan it returns counted), and checks every result: runs of one op and
interleaved ops, numpy arrays and torch tensors of float32, int64 and float64; gather and scatter
to and from either rank, the root's list views of one buffer and arrays of their own. Arrays the
engine does not take as they are (not contiguous, overlapping, a root's list holding its tensor
or transposed entries) make the plan raise NotPlanned and go through the pipeline; a dtype gloo
lacks (int16) is never planned, a SUM of bools (an OR) has no plan; a wrong-size output, a bool
root and bad lists never reach a plan: the pipeline refuses them. The barrier holds a plan too,
the kit's own (``Steps._barrier_plan``): gloo's ``plan`` has none for it.
Blocking messages alike (planned from the first message of a kind): ping-pongs of numpy arrays
and torch tensors of five dtypes on three tags, rank 0 receiving from any rank; strided views
(NotPlanned) and int16 (never planned) through the pipeline; bad ranks and tags refused by the
pipeline, sending nothing; a group of split whose ranks are not the world's.
Last, rank 1 skips an all_reduce: rank 0's plan ends in distcomm's DistTimeoutError naming
rank 1, not in torch's error and not in a hang; in a run of its own, rank 0's recv from rank 1,
which never sends, ends the same way.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import distcomm
from distcomm.backend import NotPlanned
from distcomm.testing import WarmWorld

pytestmark = pytest.mark.timeout(150)

#: The world's timeout (DISTCOMM_TIMEOUT), in seconds: the skipped all_reduce waits that long.
TIMEOUT = 3
#: The planned collectives, as the kit names them.
COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "gather",
    "scatter",
)
#: The planned blocking messages.
MESSAGES = ("send", "recv")
LIBS = ("numpy", "torch")
DTYPES = ("float32", "int64", "float64")
#: The dtypes of the messages (gloo moves them all as they are), and their tags.
MESSAGE_DTYPES = ("float32", "int64", "float64", "uint8", "bool")
TAGS = (0, 7, 2**30 - 1)
#: Calls in each run of one kind of call.
RUN = 4
#: The collectives checked first, where no plan runs (mismatch_check.SAMPLED_FIRST).
CHECKED = 64

Call = Callable[[], Any]


# -- the program every rank runs ----------------------------------------------------------------
class Ledger:
    """What the plans of ``comm`` did, in order, in :attr:`said`: (op, what the plan's run
    did): True (it moved the call), False (NotPlanned: the pipeline took it), "raised"
    (another exception), or a recv's sender (what its run returned). And in :attr:`asked`,
    each kind the kit asked a plan for: (op, class, dtype, byte size, root, tag, whether the
    engine planned it); the barrier's array, which has no dtype, has None for it.
    The kit asks the engine's ``plan`` that its kinds (``comm._plans``, kept for the
    communicator's life) were given when the communicator was made: the ledger puts the
    counted one there and forgets the kinds known so far."""

    def __init__(self, comm: Any) -> None:
        self.said: list[tuple[str, Any]] = []
        self.asked: list[tuple[Any, ...]] = []
        kinds = comm._plans
        kinds.ask_through(self._planner(kinds.engine_plan))

    def _planner(self, plan: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def planner(kind: Any) -> Any:
            run = plan(kind)
            x = kind.array
            dtype = None if x.dtype is None else str(x.dtype).removeprefix("torch.")
            kept = (kind.op, type(x).__name__, dtype, x.nbytes, kind.root, kind.tag)
            self.asked.append((*kept, run is not None))
            return None if run is None else self._counted(kind.op, run)

        return planner

    def _counted(self, op: str, run: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        def counted(x: Any, y: Any) -> Any:
            self.said.append((op, "raised"))
            try:
                done = run(x, y)
            except NotPlanned:
                self.said[-1] = (op, False)
                raise
            self.said[-1] = (op, True if done is None else done)
            return done

        return counted


def array(lib: str, values: np.ndarray) -> Any:
    """``values`` (a new C-contiguous numpy array) as an array of ``lib``, sharing memory."""
    return torch.from_numpy(values) if lib == "torch" else values


def host(x: Any) -> np.ndarray:
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def case(op: str, lib: str, dtype: str, i: int) -> tuple[Call, Any, np.ndarray | None]:
    """Call ``i`` of ``op`` on this rank: the call, the array its result is in, and the result
    expected there (None off a reduce's root: not defined)."""
    rank, size = distcomm.get_rank(), distcomm.get_world_size()
    total = size * (size + 1) // 2  # the sum of rank + 1 over the ranks
    base = np.arange(6, dtype=dtype).reshape(2, 3) + 1000 * i
    big = np.arange(6 * size, dtype=dtype).reshape(2 * size, 3) + 1000 * i
    if op == "all_reduce":
        x = array(lib, base * (rank + 1))
        return lambda: distcomm.all_reduce(x), x, base * total
    if op == "broadcast":
        src = i % size
        x = array(lib, base + 100 * rank)
        return lambda: distcomm.broadcast(x, src=src), x, base + 100 * src
    if op == "reduce":
        dst = (i + 1) % size
        x = array(lib, base * (rank + 1))
        return lambda: distcomm.reduce(x, dst=dst), x, base * total if rank == dst else None
    if op in ("gather", "scatter"):
        return rooted_case(op, lib, base, i)
    out = array(lib, np.zeros((2 * size, 3) if op != "reduce_scatter_tensor" else (2, 3), dtype))
    if op == "all_gather_into_tensor":
        x = array(lib, base + 100 * rank)
        want = np.concatenate([base + 100 * r for r in range(size)])
        return lambda: distcomm.all_gather_into_tensor(out, x), out, want
    if op == "reduce_scatter_tensor":
        x = array(lib, big * (rank + 1))
        return lambda: distcomm.reduce_scatter_tensor(out, x), out, (big * total)[2 * rank :][:2]
    x = array(lib, big + 100 * rank)
    want = np.concatenate([big[2 * rank : 2 * rank + 2] + 100 * r for r in range(size)])
    return lambda: distcomm.all_to_all_single(out, x), out, want


def listed(lib: str, arrays: list[np.ndarray], shared: bool) -> list[Any]:
    """Copies of ``arrays`` (of one shape) as a root's list: views of one buffer (``shared``),
    or arrays of their own."""
    if not shared:
        return [array(lib, a.copy()) for a in arrays]
    whole = array(lib, np.concatenate(arrays))
    rows = arrays[0].shape[0]
    return [whole[r * rows : (r + 1) * rows] for r in range(len(arrays))]


def rooted_case(op: str, lib: str, base: np.ndarray, i: int) -> tuple[Call, Any, Any]:
    """Call ``i`` of gather (to rank (i + 1) % size) or scatter (from rank i % size), as
    :func:`case`; the root's list views of one buffer at even ``i``, of their own at odd ones.
    A gather's result is its list (None off the root), stacked."""
    rank, size = distcomm.get_rank(), distcomm.get_world_size()
    shared = i % 2 == 0
    if op == "gather":
        dst = (i + 1) % size
        zeros = [np.zeros_like(base) for _ in range(size)]
        parts = listed(lib, zeros, shared) if rank == dst else None
        want = np.stack([base + 100 * r for r in range(size)]) if rank == dst else None
        x = array(lib, base + 100 * rank)
        return lambda: distcomm.gather(x, parts, dst=dst), parts, want
    src = i % size
    given = [base + 100 * r + 10 * src for r in range(size)]
    parts = listed(lib, given, shared) if rank == src else None
    out = array(lib, np.zeros_like(base))
    return lambda: distcomm.scatter(out, parts, src=src), out, given[rank]


class Program:
    """The checks of one rank, each result a dict (:meth:`checked`)."""

    def __init__(self) -> None:
        self.comm: Any = distcomm.get_communicator()
        self.ledger = Ledger(self.comm)
        self.rank, self.size = self.comm.rank, self.comm.world_size

    def checked(self, label: str, call: Call, got: Any = None, want: Any = None) -> dict[str, Any]:
        """Run ``call``: what the plans did meanwhile, whether ``got`` holds ``want`` (None:
        nothing to compare), the operations counted, and the distcomm error it raised, if any."""
        seq, start = self.comm.seq, len(self.ledger.said)
        error = None
        try:
            call()
        except distcomm.DistcommError as exc:
            error = type(exc).__name__
        return {
            "label": label,
            "said": self.ledger.said[start:],
            "right": want is None or bool(np.array_equal(host(got), want)),
            "got": None if got is None else host(got).tolist(),
            "want": None if want is None else np.asarray(want).tolist(),
            "counted": self.comm.seq - seq,
            "error": error,
        }

    def runs(self) -> list[dict[str, Any]]:
        """RUN calls of each kind, one kind after the other."""
        done = []
        for op in COLLECTIVES:
            for lib in LIBS:
                for dtype in DTYPES:
                    for i in range(RUN):
                        call, got, want = case(op, lib, dtype, i)
                        done.append(self.checked(f"{op} {lib} {dtype} #{i}", call, got, want))
        return done

    def interleaved(self) -> list[dict[str, Any]]:
        """RUN rounds of every op in turn, each of its own library and dtype."""
        done = []
        for i in range(RUN):
            for k, op in enumerate(COLLECTIVES):
                lib, dtype = LIBS[k % 2], DTYPES[k % 3]
                call, got, want = case(op, lib, dtype, i)
                done.append(self.checked(f"interleaved {op} {lib} {dtype} #{i}", call, got, want))
        return done

    def run(self, op: str, lib: str, dtype: str, label: str, i: int = 0) -> list[dict[str, Any]]:
        """Two calls of a kind (``case``): the run the next call is like."""
        done = []
        for n in range(2):
            call, got, want = case(op, lib, dtype, i)
            done.append(self.checked(f"{label} #{n}", call, got, want))
        return done

    def not_planned(self) -> list[dict[str, Any]]:
        """Calls like the two before them (the same class, dtype and size) whose arrays gloo
        does not take as they are: the plan raises NotPlanned and the pipeline runs them. Then
        int16 (gloo moves none: never planned) and bool (a SUM is an OR: no plan)."""
        rank, size = self.rank, self.size
        base = np.arange(6, dtype="float32").reshape(2, 3)
        done = []
        for lib in LIBS:  # a (3, 2) array transposed: (2, 3), not contiguous
            done += self.run("all_reduce", lib, "float32", f"{lib} sum")
            t = array(lib, np.ascontiguousarray(base.T) * (rank + 1)).T
            call = functools.partial(distcomm.all_reduce, t)
            done.append(self.checked(f"{lib} transposed", call, t, base * 3))
        done += self.run("all_gather_into_tensor", "torch", "float32", "gather")
        out = torch.zeros(2 * size, 3)  # in place: the input is this rank's chunk of the output
        mine = out[2 * rank : 2 * rank + 2]
        mine.copy_(torch.from_numpy(base + 100 * rank))
        call = functools.partial(distcomm.all_gather_into_tensor, out, mine)
        want = np.concatenate([base + 100 * r for r in range(size)])
        done.append(self.checked("gather in place", call, out, want))
        done += self.rooted_not_planned(base)
        for dtype in ("int16", "bool"):  # gloo moves no int16; a sum of bools is their OR
            for i in range(3):
                z = np.array([rank + 1, 0, rank], dtype=dtype)
                call = functools.partial(distcomm.all_reduce, z)
                done.append(self.checked(f"{dtype} #{i}", call, z, np.array([3, 0, 1], dtype)))
        return done

    def rooted_not_planned(self, base: np.ndarray) -> list[dict[str, Any]]:
        """Rooted calls (to and from rank 0) whose root's list gloo does not take as it is: the
        tensor is one of its entries (in place), or an entry is transposed. The root's plan
        raises NotPlanned, the other rank's takes the call, and the pipeline's results are
        right."""
        rank, size = self.rank, self.size
        done = self.run("gather", "torch", "float32", "gather", i=1)  # to rank 0
        done += self.run("scatter", "torch", "float32", "scatter", i=0)  # from rank 0
        every = np.stack([base + 100 * r for r in range(size)])
        parts = listed("torch", list(np.zeros_like(every)), True) if rank == 0 else None
        x = parts[0] if parts is not None else torch.from_numpy(base + 100 * rank)
        if parts is not None:
            x.copy_(torch.from_numpy(base))
        call = functools.partial(distcomm.gather, x, parts, dst=0)
        done.append(self.checked("gather in its list", call, parts, every if rank == 0 else None))
        given = listed("torch", list(every), True) if rank == 0 else None
        out = given[0] if given is not None else torch.zeros(2, 3)
        call = functools.partial(distcomm.scatter, out, given, src=0)
        done.append(self.checked("scatter in its list", call, out, every[rank]))
        turned = [torch.from_numpy(np.ascontiguousarray(e.T)).T for e in every]
        out = torch.zeros(2, 3)
        call = functools.partial(distcomm.scatter, out, turned if rank == 0 else None, src=0)
        done.append(self.checked("scatter of transposed entries", call, out, every[rank]))
        return done

    def refused(self) -> list[dict[str, Any]]:
        """Calls no plan may take after a run like them: the pipeline refuses them
        (InvalidArgumentError on every rank, nothing sent, the world usable after)."""
        x, wrong = torch.zeros(2, 3), torch.zeros(2 * self.size + 1, 3)
        done = self.run("all_gather_into_tensor", "torch", "float32", "gather")
        wrong_size = functools.partial(distcomm.all_gather_into_tensor, wrong, x)
        done.append(self.checked("wrong-size output", wrong_size))
        done += self.run("broadcast", "torch", "float32", "broadcast", i=1)  # from rank 1
        done.append(self.checked("bool root", functools.partial(distcomm.broadcast, x, src=True)))
        done += self.run("gather", "torch", "float32", "gather", i=1)  # to rank 0
        short = [torch.zeros(2, 3) for _ in range(self.size - 1)]  # a list off the root too
        call = functools.partial(distcomm.gather, x, short, dst=0)
        done.append(self.checked("gather list one short", call))
        done += self.run("scatter", "torch", "float32", "scatter", i=0)  # from rank 0
        ints = [torch.zeros(2, 3, dtype=torch.int32) for _ in range(self.size)]  # everywhere
        call = functools.partial(distcomm.scatter, x, ints, src=0)
        done.append(self.checked("scatter list of int32", call))
        call, got, want = case("broadcast", "torch", "float32", 1)
        done.append(self.checked("broadcast after", call, got, want))
        return done

    def skipped(self, signal: Path) -> dict[str, Any]:
        """Rank 1 skips an all_reduce like the two before it; rank 0 waits in the plan.
        Rank 1 waits for rank 0's error (``signal``, a file), then finalizes: its vote may see
        the all_reduce it skipped (the mismatch), or rank 0, retired, never votes (a warning)."""
        x = np.ones(3, dtype="float32")
        for _ in range(2):
            distcomm.all_reduce(x)
        if self.rank == 1:
            deadline = time.monotonic() + 6 * TIMEOUT
            while not signal.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            signalled = signal.exists()
            with contextlib.suppress(distcomm.CollectiveMismatchError):
                distcomm.finalize()
            return {"skipped": True, "signalled": signalled}
        seq, start, began = self.comm.seq, len(self.ledger.said), time.monotonic()
        try:
            distcomm.all_reduce(x)
        except Exception as exc:  # which one is the point
            found = {
                "error": type(exc).__name__,
                "op": getattr(exc, "op", None),
                "seq": getattr(exc, "seq", None),
                "missing": getattr(exc, "missing_ranks", None),
                "cause": type(exc.__cause__).__name__,
                "message": str(exc),
            }
        else:
            found = {"error": None}
        found.update(elapsed=time.monotonic() - began, unusable=self.comm.unusable)
        found.update(expected_seq=seq + 1, said=self.ledger.said[start:])
        signal.touch()
        with contextlib.suppress(distcomm.DistcommError):  # a world still usable would vote
            distcomm.finalize()
        return found


def payload(dtype: str, sender: int, i: int) -> np.ndarray:
    """What rank ``sender`` sends in message ``i``: sender-dependent (bools mixed)."""
    return ((np.arange(5) * 3 + 10 * sender + i) % 7).astype(dtype)


def spread(lib: str, values: np.ndarray) -> tuple[Any, Any]:
    """``values`` as every other element (a strided view) of an array twice its size, 99
    between: (the whole array, the view)."""
    holder = np.full(2 * values.size, 99, values.dtype)
    holder[::2] = values
    whole = array(lib, holder)
    return whole, whole[::2]


def as_is(lib: str, values: np.ndarray) -> tuple[Any, Any]:
    made = array(lib, values)
    return made, made


class Messages:
    """Blocking messages between ranks 0 and 1 of ``comm``, whose plans ``ledger`` counts;
    each result a dict (:meth:`checked`)."""

    def __init__(self, comm: Any, ledger: Ledger) -> None:
        self.comm, self.ledger = comm, ledger

    def checked(
        self, label: str, call: Call, got: Any = None, want: Any = None, source: Any = None
    ) -> dict[str, Any]:
        """Run ``call``: what the plans did, whether ``got`` holds ``want`` (a strided
        view's holder: the elements between kept), what it returned against ``source``, its
        distcomm error, and the "blocked in" mark after it."""
        start, error, returned = len(self.ledger.said), None, None
        try:
            returned = call()
        except distcomm.DistcommError as exc:
            error = type(exc).__name__
        right = want is None or bool(np.array_equal(host(got), want))
        return {
            "label": label,
            "said": self.ledger.said[start:],
            "right": right,
            "got": None if got is None else host(got).tolist(),
            "want": None if want is None else np.asarray(want).tolist(),
            "returned": returned,
            "source": source,
            "error": error,
            "blocked": (self.comm.blocked_seq, self.comm.blocked_op),
        }

    def ping(
        self, label: str, lib: str, dtype: str, tag: int, i: int, place: Any = as_is
    ) -> list[dict[str, Any]]:
        """Rank 0 sends to rank 1, which receives from rank 0, then sends back; rank 0 receives
        from any rank. Arrays placed by ``place`` (the received one's holder is checked)."""
        comm, rank = self.comm, self.comm.rank
        peer = 1 - rank
        x = place(lib, payload(dtype, rank, i))[1]
        theirs = payload(dtype, peer, i)
        holder, out = place(lib, np.zeros_like(theirs))
        want = theirs if holder is out else np.stack([theirs, np.full_like(theirs, 99)], 1).ravel()
        send = functools.partial(
            self.checked, f"{label} send", functools.partial(comm.send, x, peer, tag)
        )
        src = None if rank == 0 else 0
        recv = functools.partial(
            self.checked,
            f"{label} recv",
            functools.partial(comm.recv, out, src, tag),
            holder,
            want,
            peer,
        )
        return [send(), recv()] if rank == 0 else [recv(), send()]

    def planned(self) -> list[dict[str, Any]]:
        """Ping-pongs of every library, dtype and tag: the plans take them all."""
        done = []
        for lib in LIBS:
            for dtype in MESSAGE_DTYPES:
                for i, tag in enumerate(TAGS):
                    done += self.ping(f"{lib} {dtype} tag {tag}", lib, dtype, tag, i)
        return done

    def not_planned(self) -> list[dict[str, Any]]:
        """Strided views (sent, received into: the plans raise NotPlanned) and int16 (gloo moves
        none: never planned): the pipeline moves them."""
        done = []
        for lib in LIBS:
            done += self.ping(f"{lib} strided", lib, "float32", 3, 1, spread)
            done += self.ping(f"{lib} int16", lib, "int16", 3, 2)
        return done

    def refused(self) -> list[dict[str, Any]]:
        """Bad ranks and tags (``True`` is rank 1's equal): the pipeline's InvalidArgumentError,
        no plan asked or run; then a ping-pong on tag 0 gets its own data (nothing was sent)."""
        comm, peer = self.comm, 1 - self.comm.rank
        bad = np.full(5, -1.0, np.float32)
        calls = {
            "send: dst=2": functools.partial(comm.send, bad, 2),
            "send: dst=-1": functools.partial(comm.send, bad, -1),
            "send: dst=True": functools.partial(comm.send, bad, True),
            "send: tag=-1": functools.partial(comm.send, bad, peer, -1),
            "send: tag=2**30": functools.partial(comm.send, bad, peer, 2**30),
            "recv: src=2": functools.partial(comm.recv, bad, 2),
            "recv: src=True": functools.partial(comm.recv, bad, True),
            "recv: tag=-1": functools.partial(comm.recv, bad, peer, -1),
            "recv: tag=2**30": functools.partial(comm.recv, bad, None, 2**30),
        }
        done = [self.checked(label, call) for label, call in calls.items()]
        return done + self.ping("after", "numpy", "float32", 0, 4)


def message_program(comm: Any, ledger: Ledger) -> dict[str, Any]:
    """The messages' checks on ``comm`` (the world, then a group of split whose rank 0 is the
    world's rank 1)."""
    m = Messages(comm, ledger)
    found: dict[str, Any] = {"planned": m.planned(), "not planned": m.not_planned()}
    found["refused"] = m.refused()
    group = comm.split(0, key=-comm.rank)
    try:
        g = Messages(group, Ledger(group))
        found["group"] = g.ping("group", "torch", "float32", 5, 3) + g.planned()[:10]
        found["group ranks"] = (group.rank, list(group.global_ranks))
    finally:
        group.finalize()
    return found


def program(workdir: str) -> dict[str, Any]:
    """Every check, in order, on one rank (module docstring)."""
    p = Program()
    while p.comm.seq < CHECKED:  # the checked collectives: the pipeline's alone
        distcomm.barrier()
    # From here each call's way is gloo's plan's alone: which calls the mismatch check has the
    # pipeline confirm or check first (a step from one call to the next the ranks never made,
    # a call after which they made its op in more than one size) is tested on fakelink
    # (tests/backend/test_plans.py) and on mpi (mpi_tests/test_mpi_plans.py).
    # The change forgets the kinds: the kit asks again from here (the barrier's too).
    p.comm.debug = "off"
    p.ledger.asked.clear()
    distcomm.barrier()
    return {
        "warm-up": list(p.ledger.said),
        "runs": p.runs(),
        "interleaved": p.interleaved(),
        "not planned": p.not_planned(),
        "refused": p.refused(),
        "last seq": p.comm.seq,
        "messages": message_program(p.comm, p.ledger),
        "asked": list(p.ledger.asked),
        "planned ops": sorted({k[0] for k, v in p.comm._plans.kinds.items() if v[0]}),
        "skipped": p.skipped(Path(workdir) / "rank-0-timed-out"),
    }


def never_sent(workdir: str) -> dict[str, Any]:
    """A ping-pong (the plans taken), then rank 0 receives from rank 1, which never sends:
    it waits for rank 0's error (``signal``), then finalizes (rank 0, retired, never votes)."""
    comm: Any = distcomm.get_communicator()
    ledger = Ledger(comm)
    found: dict[str, Any] = {"ping": Messages(comm, ledger).ping("ping", "numpy", "int64", 3, 0)}
    signal = Path(workdir) / "rank-0-timed-out"
    if comm.rank == 1:
        deadline = time.monotonic() + 6 * TIMEOUT
        while not signal.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        found["signalled"] = signal.exists()
        with contextlib.suppress(distcomm.DistcommError):
            distcomm.finalize()
        return found
    start, began = len(ledger.said), time.monotonic()
    try:
        comm.recv(np.zeros(3), 1, 3)
    except Exception as exc:  # which one is the point
        found.update(error=type(exc).__name__, message=str(exc), op=getattr(exc, "op", None))
        found.update(seq=getattr(exc, "seq", None), cause=type(exc.__cause__).__name__)
    found.update(elapsed=time.monotonic() - began, said=ledger.said[start:])
    found.update(unusable=comm.unusable, blocked=(comm.blocked_seq, comm.blocked_op))
    signal.touch()
    return found


# -- the tests ----------------------------------------------------------------------------------
def _run(
    factory: pytest.TempPathFactory, world: WarmWorld, fn: Callable[..., Any], timeout: float
) -> list[dict[str, Any]]:
    """``fn``'s results on 2 gloo ranks, with no DISTCOMM_* setting of the caller's and the
    module's short timeout."""
    workdir = factory.mktemp(fn.__name__)
    with pytest.MonkeyPatch.context() as env:
        for name in list(os.environ):
            if name.startswith("DISTCOMM_"):
                env.delenv(name)
        env.setenv("DISTCOMM_TIMEOUT", str(TIMEOUT))
        # Gloo's plans, not node memory's (docs/backends.md#node-memory): read by the ranks
        # when the world starts, at its first run
        env.setenv("DISTCOMM_NODE_MEMORY", "off")
        return world.run(fn, str(workdir), timeout=timeout)


@pytest.fixture(scope="module")
def gloo_world() -> Iterator[WarmWorld]:
    """2 gloo ranks whose collectives Gloo carries (node memory off), for this module."""
    with WarmWorld(2, backend="gloo") as world:
        yield world


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory, gloo_world: WarmWorld) -> list[dict[str, Any]]:
    """The program's results on ranks 0 and 1 (one run for the module)."""
    return _run(tmp_path_factory, gloo_world, program, 120)


@pytest.fixture(scope="module")
def silent(tmp_path_factory: pytest.TempPathFactory, gloo_world: WarmWorld) -> list[dict[str, Any]]:
    """:func:`never_sent`'s results on ranks 0 and 1 (a run of its own)."""
    return _run(tmp_path_factory, gloo_world, never_sent, 60)


def said(check: dict[str, Any]) -> list[tuple[str, Any]]:
    return [tuple(entry) for entry in check["said"]]


def problems(checks: list[dict[str, Any]]) -> list[str]:
    """What went wrong in ``checks``: a wrong result, a call not counted as one operation, or
    a distcomm error."""
    found = []
    for c in checks:
        if not c["right"]:
            found.append(f"{c['label']}: got {c['got']}, expected {c['want']}")
        if c["counted"] != 1 or c["error"] is not None:
            found.append(f"{c['label']}: {c['counted']} operations counted, error {c['error']}")
    return found


def test_the_checked_collectives_never_run_a_plan(ranks: list[dict[str, Any]]) -> None:
    for rank, seen in enumerate(ranks):
        assert seen["warm-up"] == [], f"rank {rank} ran a plan at a check point"
        # every call below came before the next check point (seq 64 + 1024)
        assert CHECKED < seen["last seq"] < CHECKED + 1024, seen["last seq"]


def test_every_op_is_planned_once_per_kind(ranks: list[dict[str, Any]]) -> None:
    """The world holds a plan for each of the ten ops and for the barrier, whose plan is the
    kit's (``Steps._barrier_plan``: torch has none of its own). The kit asked the engine
    once per kind (op, class, dtype, size, root, tag), the barrier's too, and gloo planned
    every kind of a dtype it sums or moves: the barrier alone has no plan of torch's (its
    ``plan`` returns None: the kit's plan is kept); bool's SUM (an OR: the pipeline's) and
    int16 (not gloo's) were never asked."""
    for rank, seen in enumerate(ranks):
        planned = sorted((*COLLECTIVES, *MESSAGES, "barrier"))
        assert seen["planned ops"] == planned, f"rank {rank}"
        asked = [tuple(entry) for entry in seen["asked"]]
        assert len(set(asked)) == len(asked), f"rank {rank}: a kind asked twice: {asked}"
        unplanned = {entry for entry in asked if not entry[-1]}
        barrier = ("barrier", "_NoArray", None, 0, None, 0, False)
        assert unplanned == {barrier}, f"rank {rank}: {asked}"
        assert not [e for e in asked if e[2] == "int16"], f"rank {rank}: {asked}"
        summed_bools = [e for e in asked if e[0] == "all_reduce" and e[2] == "bool"]
        assert not summed_bools, f"rank {rank}: a bool SUM was asked: {asked}"
        ops = {entry[0] for entry in asked}
        assert ops == {*COLLECTIVES, *MESSAGES, "barrier"}, f"rank {rank}: {sorted(ops)}"


def test_runs_of_one_op_take_each_plan_with_right_results(
    ranks: list[dict[str, Any]],
) -> None:
    """The first calls of a run go through the pipeline (a new kind of call, confirmed with
    the other ranks; broadcast's and reduce's roots alternate); the last two run the plan. No
    plan refuses an array here, and every result is right."""
    for rank, seen in enumerate(ranks):
        assert problems(seen["runs"]) == [], f"rank {rank}"
        for check in seen["runs"]:
            op, number = check["label"].split()[0], int(check["label"].split("#")[1])
            took = [(op, True)]
            assert said(check) in ([], took), f"rank {rank}: {check['label']}: {said(check)}"
            if number >= RUN - 2:
                assert said(check) == took, f"rank {rank}: {check['label']} missed the plan"


def test_interleaved_ops_each_run_their_plan(ranks: list[dict[str, Any]]) -> None:
    for rank, seen in enumerate(ranks):
        assert problems(seen["interleaved"]) == [], f"rank {rank}"
        for check in seen["interleaved"]:
            took = [(check["label"].split()[1], True)]
            assert said(check) == took, f"rank {rank}: {check['label']}: {said(check)}"


#: The rooted calls the root's plan declines (:meth:`Program.rooted_not_planned`).
ROOTED_DECLINED = {
    "gather in its list": "gather",
    "scatter in its list": "scatter",
    "scatter of transposed entries": "scatter",
}


def test_arrays_gloo_does_not_take_as_they_are_go_through_the_pipeline(
    ranks: list[dict[str, Any]],
) -> None:
    """Not contiguous (numpy, torch), overlapping (an all-gather in place): the plan raises
    NotPlanned, having sent nothing, and the pipeline's result is right. int16 (not moved by
    gloo) and bool (a sum is an OR) have no plan: the pipeline takes every call. A root's list
    gloo does not take (its tensor in it, transposed entries): the root's plan raises
    NotPlanned, the other rank's takes the call."""
    declined = {"numpy transposed": "all_reduce", "torch transposed": "all_reduce"}
    declined["gather in place"] = "all_gather_into_tensor"
    for rank, seen in enumerate(ranks):
        assert problems(seen["not planned"]) == [], f"rank {rank}"
        by_label = {check["label"]: check for check in seen["not planned"]}
        for label, op in sorted(declined.items()):
            ways = said(by_label[label])
            assert ways == [(op, False)], f"rank {rank}: {label}: {ways}"
        for label in (f"{dtype} #{i}" for dtype in ("int16", "bool") for i in range(3)):
            assert said(by_label[label]) == [], f"rank {rank}: {label}: {said(by_label[label])}"
        for label, op in ROOTED_DECLINED.items():  # by the root, rank 0, alone
            ways = said(by_label[label])
            assert ways == [(op, rank != 0)], f"rank {rank}: {label}: {ways}"


def test_a_wrong_size_output_and_a_bool_root_get_the_pipelines_error(
    ranks: list[dict[str, Any]],
) -> None:
    for rank, seen in enumerate(ranks):
        by_label = {check["label"]: check for check in seen["refused"]}
        refused = ("wrong-size output", "bool root", "gather list one short")
        for label in (*refused, "scatter list of int32"):
            check = by_label.pop(label)
            assert check["error"] == "InvalidArgumentError", f"rank {rank}: {label}: {check}"
            assert said(check) == [] and check["counted"] == 0, f"rank {rank}: {label}: {check}"
        assert problems(list(by_label.values())) == [], f"rank {rank}"
        assert said(by_label["broadcast after"]) == [("broadcast", True)], rank


def test_a_skipped_all_reduce_past_the_check_points_times_out_in_the_plan(
    ranks: list[dict[str, Any]],
) -> None:
    """Rank 0's all_reduce waits in the plan for rank 1, which skipped it: after the world's
    timeout it raises distcomm's DistTimeoutError naming rank 1 (torch's error its cause), as
    the pipeline would, and the world is retired."""
    timed_out, skipped = ranks[0]["skipped"], ranks[1]["skipped"]
    assert skipped == {"skipped": True, "signalled": True}, skipped
    message = timed_out.get("message", "")
    assert timed_out["error"] == "DistTimeoutError", timed_out
    assert said(timed_out) == [("all_reduce", "raised")], "not in the plan"
    assert (timed_out["op"], timed_out["seq"]) == ("all_reduce", timed_out["expected_seq"])
    assert tuple(timed_out["missing"]) == (1,), message
    assert timed_out["cause"] == "RuntimeError", "torch's error is the cause"
    seq = timed_out["expected_seq"]
    assert f"all_reduce (operation #{seq}) on gloo 'world' (2 ranks)" in message, message
    assert f"did not complete within {TIMEOUT} s" in message, message
    assert "ranks that had not arrived: [1]" in message, message
    assert timed_out["unusable"] == f"all_reduce (operation #{seq}) timed out after {TIMEOUT} s"
    # the timeout, then a few monitor ticks to read the ranks' progress and ask where rank 1 is
    assert timed_out["elapsed"] < TIMEOUT + 4, f"rank 0 waited {timed_out['elapsed']:.1f} s"


# -- messages -----------------------------------------------------------------------------------
def message_problems(checks: list[dict[str, Any]]) -> list[str]:
    """What went wrong in message ``checks``: a wrong result, a receive that returned another
    sender, a distcomm error, or a "blocked in" mark left set."""
    found = []
    for c in checks:
        if not c["right"]:
            found.append(f"{c['label']}: got {c['got']}, expected {c['want']}")
        if c["label"].endswith("recv") and c["returned"] != c["source"]:
            found.append(f"{c['label']}: returned {c['returned']}, the sender is {c['source']}")
        if c["error"] is not None:
            found.append(f"{c['label']}: {c['error']}")
        if tuple(c["blocked"]) != (0, ""):
            found.append(f"{c['label']}: still marked blocked in {c['blocked']}")
    return found


def took(check: dict[str, Any]) -> list[tuple[str, Any]]:
    """What the plan of ``check``'s message did when it took it: True (a send), the sender (a
    recv's run returns it)."""
    if check["label"].endswith("send"):
        return [("send", True)]
    return [("recv", check["source"])]


def test_messages_take_the_plans_with_right_results(ranks: list[dict[str, Any]]) -> None:
    """Every ping-pong of numpy and torch, five dtypes, three tags (the largest a user's) takes
    the plans from the first message (no check points for messages): the right data, rank
    0's receive from any rank returns 1, and the mark is cleared after each."""
    for rank, seen in enumerate(ranks):
        checks = seen["messages"]["planned"]
        assert len(checks) == 2 * len(LIBS) * len(MESSAGE_DTYPES) * len(TAGS)
        assert message_problems(checks) == [], f"rank {rank}"
        for check in checks:
            assert said(check) == took(check), f"rank {rank}: {check['label']}: {said(check)}"


def test_messages_gloo_does_not_take_as_they_are_go_through_the_pipeline(
    ranks: list[dict[str, Any]],
) -> None:
    """Strided views (the elements between kept): each plan raises NotPlanned, having sent
    nothing; int16: no plan is asked. The pipeline's result is right."""
    for rank, seen in enumerate(ranks):
        checks = seen["messages"]["not planned"]
        assert message_problems(checks) == [], f"rank {rank}"
        for check in checks:
            declined = [(took(check)[0][0], False)] if "strided" in check["label"] else []
            assert said(check) == declined, f"rank {rank}: {check['label']}: {said(check)}"


def test_bad_messages_get_the_pipelines_error_and_send_nothing(
    ranks: list[dict[str, Any]],
) -> None:
    for rank, seen in enumerate(ranks):
        checks = list(seen["messages"]["refused"])
        after = checks[-2:]
        for check in checks[:-2]:
            assert check["error"] == "InvalidArgumentError", f"rank {rank}: {check}"
            assert said(check) == [], f"rank {rank}: {check['label']} ran {said(check)}"
            assert tuple(check["blocked"]) == (0, ""), f"rank {rank}: {check}"
        # a bad message sent after all would be received here instead of the peer's data
        assert message_problems(after) == [], f"rank {rank}"
        assert [said(c) for c in after] == [took(c) for c in after], f"rank {rank}: {after}"


def test_messages_on_a_group_of_split_use_its_ranks(ranks: list[dict[str, Any]]) -> None:
    """In a group of split whose order is the world's reversed, ranks and the sender returned
    are the group's; the plans take every message."""
    for rank, seen in enumerate(ranks):
        assert seen["messages"]["group ranks"] == (1 - rank, [1, 0]), f"rank {rank}"
        checks = seen["messages"]["group"]
        assert message_problems(checks) == [], f"rank {rank}"
        for check in checks:
            assert said(check) == took(check), f"rank {rank}: {check['label']}: {said(check)}"


def test_a_recv_whose_sender_never_sends_times_out_in_the_plan(
    silent: list[dict[str, Any]],
) -> None:
    """Rank 0's recv from rank 1, which never sends: after the world's timeout, distcomm's
    DistTimeoutError naming the message and rank 1 (torch's error its cause), raised in the
    plan, not torch's error nor a hang; the world is retired and the mark cleared."""
    timed_out, quiet = silent
    assert quiet["signalled"], "rank 0 never said it was done"
    for rank, seen in enumerate(silent):
        assert message_problems(seen["ping"]) == [], f"rank {rank}"
        assert [said(c) for c in seen["ping"]] == [took(c) for c in seen["ping"]], rank
    message = timed_out.get("message", "")
    assert timed_out.get("error") == "DistTimeoutError", timed_out
    assert said(timed_out) == [("recv", "raised")], "not in the plan"
    assert (timed_out["op"], timed_out["seq"]) == ("recv from rank 1 (tag 3)", None), message
    assert "recv from rank 1 (tag 3) on gloo 'world' (2 ranks)" in message, message
    assert f"did not complete within {TIMEOUT} s" in message, message
    assert timed_out["cause"] == "RuntimeError", "torch's error is the cause"
    assert timed_out["unusable"] == f"recv from rank 1 (tag 3) timed out after {TIMEOUT} s"
    assert tuple(timed_out["blocked"]) == (0, ""), timed_out["blocked"]
    assert timed_out["elapsed"] < TIMEOUT + 4, f"rank 0 waited {timed_out['elapsed']:.1f} s"
