"""CPU tensor collectives through node memory, for engines that have no shared-memory path.

Gloo moves CPU tensors over TCP loopback even when every rank is a process of one node (2.4 ms for
a 1 MiB all_reduce at 2 ranks on the machine this was written on, against 0.20 ms for MPICH's
shared memory and 0.25 ms through node memory). A communicator whose engine says it has no such
path of its own (``Capabilities.node_memory``: gloo, zmq, plugins by default; mpi sets it False)
gets a :class:`Transport` between the kit's steps and the engine: it serves the engine methods
``all_reduce``, ``broadcast``, ``all_gather_into``, ``reduce``, ``reduce_scatter``, ``all_to_all``
and ``barrier``, and the plans of their kinds, through the group's node segment
(:mod:`.node_segment`) when the group passed the proof that it shares this node, and hands every
other call to the engine's method as it was: GPU memory, the reductions a framework cannot do on
the array (bytes), calls below the op's :data:`THRESHOLDS`, groups that span nodes.

The proof is made when the communicator is made (a collective over the engine: every member makes
it at once), and its answer kept for the group's life: a group that failed it keeps its engine's
methods, and the log says why (``DISTCOMM_LOG_LEVEL=INFO``). A blocking call runs in the
caller's thread; an asynchronous one in the transport's worker thread, in order, so that it goes on
while the caller does other things, as an engine's does; the Work it returns has torch's future
where torch is imported (DDP over torch's group ``"distcomm"`` waits on it).
``DISTCOMM_NODE_MEMORY`` chooses: ``auto`` (default), ``off`` (the engine carries everything,
objects included) or ``require`` (a group of processes that cannot use node memory raises, for
tests that must reach it).

How each call moves, in pieces of at most :data:`~.node_segment.SLOT_BYTES` per rank, each piece
in the set of slots of its parity (so that a rank writes a piece while slower ranks still read the
one before; the first wait of a piece proves that every rank has finished the piece two before):

- ``all_reduce``: every rank writes its piece into its slot; wait; rank r reduces the r-th part of
  every slot into its own slot; wait; every rank copies each part out of its owner's slot. Each
  part is reduced once, so every rank gets the same bits;
- ``reduce``: the same, and only the root copies out;
- ``broadcast``: the root writes; wait; the others copy out;
- ``all_gather_into``: every rank writes; wait; every rank copies every slot out;
- ``reduce_scatter`` and ``all_to_all``: every rank writes its input's W chunks (a part of each
  per piece); wait; rank r reduces (or copies) the r-th chunk of every slot into its output;
- ``barrier``: a wait.

The first wait of each call compares the ranks' calls (op, root, reduce op, dtype, bytes):
ranks that called different collectives raise CollectiveMismatchError naming each rank's call,
instead of mixing each other's bytes.

Memory: the group's segment holds ``2 * world_size * SLOT_BYTES`` (32 MiB at 4 ranks), of which
each rank writes its ``2 * SLOT_BYTES`` (8 MiB); pages are touched only as large calls need them.
Nothing of it is a file: no /dev/shm space is needed and nothing is left after a SIGKILL.
"""

from __future__ import annotations

import concurrent.futures
import queue
import sys
import threading
from typing import TYPE_CHECKING, Any

from distcomm import _settings
from distcomm._logs import logger
from distcomm.backend._pipeline import node_segment
from distcomm.backend._pipeline.node_segment import SLOT_BYTES, Segment
from distcomm.backend.arrays import adapter_for
from distcomm.backend.engine import PLANNED, NotPlanned
from distcomm.backend.work import EngineWork
from distcomm.errors import CollectiveMismatchError, NotSupportedError
from distcomm.protocol import ReduceOp

if TYPE_CHECKING:
    from collections.abc import Callable

    from distcomm.backend.communicator import BaseCommunicator

__all__ = ["SERVED", "THRESHOLDS", "Transport", "over"]

#: The engine methods a transport serves (the others stay the engine's).
SERVED = (
    "all_reduce",
    "broadcast",
    "all_gather_into",
    "reduce",
    "reduce_scatter",
    "all_to_all",
    "barrier",
    "plan",
    "finalize",
)
#: The bytes (a rank's array) from which each op goes through node memory; below, the engine.
#: Measured with benchmarks/node_tensors.py (2 and 4 ranks, gloo and zmq): node memory was
#: faster at every size, from 8 bytes, so every call of a proven group takes it.
THRESHOLDS: dict[str, int] = {
    "all_reduce": 0,
    "broadcast": 0,
    "all_gather_into": 0,
    "reduce": 0,
    "reduce_scatter": 0,
    "all_to_all": 0,
    "barrier": 0,
}
#: The codes of the ops and dtypes in a call's descriptor.
_OPS = ("all_reduce", "broadcast", "all_gather_into", "reduce", "reduce_scatter", "all_to_all",
        "barrier")  # fmt: skip
_DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
           "float64")  # fmt: skip
_REDUCE_OPS = tuple(ReduceOp)
_FLOATS = frozenset({"float16", "bfloat16", "float32", "float64"})
_NOT_PROVED = "not proved yet"
#: The engine method of each planned op whose name differs.
_ENGINE_OPS = {
    "all_gather_into_tensor": "all_gather_into",
    "reduce_scatter_tensor": "reduce_scatter",
    "all_to_all_single": "all_to_all",
}
#: A call's op and seq, which its errors name (it may run after the caller made other calls).
Label = tuple[str, int]
#: The ops whose plans node memory makes (the others' are the engine's).
_PLANNED_OPS = PLANNED - {"all_to_all_v", "gather", "scatter", "send", "recv"}


def over(comm: BaseCommunicator) -> Transport | None:
    """The transport for ``comm`` (its engine's methods as bound now), or None where node
    memory cannot carry its tensors: a world of one process, an engine with a shared-memory
    path of its own, ``DISTCOMM_NODE_MEMORY=off``, a platform without what it needs."""
    policy = _settings.read("DISTCOMM_NODE_MEMORY")
    if comm.world_size < 2 or policy == "off" or not comm.capabilities.node_memory:
        return None
    why = node_segment.available()
    if why:
        if policy == "require":
            raise NotSupportedError(
                f"DISTCOMM_NODE_MEMORY=require, but {why}. HINT: unset it (auto) to let the "
                "engine carry these calls."
            )
        return None
    return Transport(comm, policy == "require")


class Transport:
    """The node-memory transport of one communicator (module docstring): its methods stand
    for the engine's (:data:`SERVED`), which it keeps to hand them the calls it does not take.

    Made with the communicator, which then calls :meth:`prove` (a collective: every member
    makes the communicator at once). A blocking call it takes runs in the caller's thread; an
    asynchronous one (``async_op=True``) in the transport's own thread, in the order they were
    started, so that it goes on while the caller does other things, as an engine's does (a
    blocking call waits for the ones started before it).
    """

    def __init__(self, comm: BaseCommunicator, required: bool) -> None:
        self.comm = comm
        self.required = required
        #: The seconds a wait gives the other ranks: the group's timeout when it was made, as
        #: an engine's (Gloo's) is fixed then.
        self.timeout = comm.timeout
        #: The engine's methods as the communicator had bound them (None: the engine lacks it).
        self.engine: dict[str, Any] = {name: getattr(comm, "_" + name, None) for name in SERVED}
        #: The group's segment once proved; else why not (:data:`_NOT_PROVED` before the proof).
        self.segment: Segment | str = _NOT_PROVED
        #: Calls moved through node memory (tests check the transport was reached).
        self.calls = 0
        self._step = 0  # the pieces moved: their parity picks the set of slots
        self._views: dict[str, Any] = {}  # the segment as each kind of array's bytes
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()  # the asynchronous calls
        self._worker: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pending = 0  # calls given to the worker and not finished (under the lock)

    @property
    def proved(self) -> bool:
        """Whether the group proved it shares this node (its calls can go through memory)."""
        return isinstance(self.segment, Segment)

    def methods(self) -> dict[str, Callable[..., Any]]:
        """What the communicator binds in place of its engine's methods (:data:`SERVED`;
        ``plan`` and ``finalize`` even where the engine has none)."""
        return {name: getattr(self, name) for name in SERVED}

    def prove(self) -> bool:
        """Collective, once, when the communicator is made: whether its ranks share this node
        (:func:`~.node_segment.prove`); the answer is logged, and raised under ``require``.
        False: the communicator keeps its engine's methods (this transport unused)."""
        comm = self.comm
        all_gather, broadcast = self.engine["all_gather_into"], self.engine["broadcast"]
        found = node_segment.prove(
            comm,
            lambda output, x: comm._call(all_gather, False, output, x),
            lambda x, root: comm._call(broadcast, False, x, root),
        )
        self.segment = found
        if isinstance(found, Segment):
            logger.info(
                "node memory: %s moves CPU tensors through node memory (its ranks proved they "
                "map one segment)",
                comm.describe(),
            )
            return True
        logger.info("node memory: %s keeps its engine: %s", comm.describe(), found)
        if self.required:
            raise NotSupportedError(
                f"DISTCOMM_NODE_MEMORY=require, but {comm.describe()} cannot use node "
                f"memory: {found}. HINT: unset DISTCOMM_NODE_MEMORY (auto) to let the "
                "engine carry this group's calls."
            )
        return False

    # -- which calls, and where they run -----------------------------------------------------------
    def _takes(self, op: str, *arrays: Any, reduce_op: ReduceOp | None = None) -> Any:
        """The adapter kind of ``arrays`` where the transport moves this call, else None."""
        if not isinstance(self.segment, Segment):
            return None
        kind = None
        for x in arrays:
            of = _kind(x, reduce_op is not None)
            if of is None or (kind is not None and of != kind):
                return None
            kind = of
        size = _size(arrays[-1])
        if size < THRESHOLDS[op] or size == 0:  # nothing to move: the engine's call
            return None
        if reduce_op is ReduceOp.AVG and _dtype(arrays[0]) not in _FLOATS:
            return None  # the engine's error, as without node memory
        return kind

    def _run(self, async_op: bool, move: Callable[..., None], *args: Any) -> Any:
        """Run ``move(*args, label)`` (``label``: the call's op and seq, for its errors): now,
        or after the asynchronous calls before it; in the worker for ``async_op`` (an
        :class:`~distcomm.backend.EngineWork` of it returned)."""
        label = (self.comm.op, self.comm.seq)
        if not async_op and not self._pending:
            move(*args, label)
            return None
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        torch = sys.modules.get("torch")
        future = torch.futures.Future() if torch is not None else None
        with self._lock:
            self._pending += 1
        self._jobs.put((move, args, label, done, future))
        if self._worker is None:
            self._worker = threading.Thread(
                target=self._serve, name=f"distcomm-node-{self.comm.name}", daemon=True
            )
            self._worker.start()
        if not async_op:
            done.result()
            return None
        arrays = [a for a in args if not isinstance(a, (str, ReduceOp, int, type(None)))]
        return EngineWork(self.comm, _Started(done, future), *arrays, op=label[0], seq=label[1])

    def _serve(self) -> None:
        """The worker: the asynchronous calls, in order, until :meth:`close` sends None."""
        while True:
            job = self._jobs.get()
            if job is None:
                return
            move, args, label, done, future = job
            try:
                move(*args, label)
            except BaseException as exc:  # the caller's Work raises it
                done.set_exception(exc)
                if future is not None:
                    future.set_exception(exc)
            else:
                done.set_result(None)
                if future is not None:
                    future.set_result(None)
            finally:
                with self._lock:
                    self._pending -= 1
            del job, move, args, done, future  # the caller's arrays: not kept past the call

    # -- the engine methods ------------------------------------------------------------------------
    def all_reduce(self, tensor: Any, op: ReduceOp, async_op: bool) -> Any:
        kind = self._takes("all_reduce", tensor, reduce_op=op)
        if kind is None:
            return self.engine["all_reduce"](tensor, op, async_op)
        return self._run(async_op, self._reduce, kind, tensor, op, None)

    def reduce(self, tensor: Any, dst: int, op: ReduceOp, async_op: bool) -> Any:
        kind = self._takes("reduce", tensor, reduce_op=op)
        if kind is None:
            return self.engine["reduce"](tensor, dst, op, async_op)
        return self._run(async_op, self._reduce, kind, tensor, op, dst)

    def broadcast(self, tensor: Any, src: int, async_op: bool) -> Any:
        kind = self._takes("broadcast", tensor)
        if kind is None:
            return self.engine["broadcast"](tensor, src, async_op)
        return self._run(async_op, self._broadcast, kind, tensor, src)

    def all_gather_into(self, output: Any, tensor: Any, async_op: bool) -> Any:
        kind = self._takes("all_gather_into", output, tensor)
        if kind is None:
            return self.engine["all_gather_into"](output, tensor, async_op)
        return self._run(async_op, self._all_gather, kind, output, tensor)

    def reduce_scatter(self, output: Any, input: Any, op: ReduceOp, async_op: bool) -> Any:
        kind = self._takes("reduce_scatter", output, input, reduce_op=op)
        if kind is None:
            return self.engine["reduce_scatter"](output, input, op, async_op)
        return self._run(async_op, self._exchange, kind, "reduce_scatter", output, input, op)

    def all_to_all(self, output: Any, input: Any, async_op: bool) -> Any:
        kind = self._takes("all_to_all", output, input)
        if kind is None:
            return self.engine["all_to_all"](output, input, async_op)
        return self._run(async_op, self._exchange, kind, "all_to_all", output, input, None)

    def barrier(self, async_op: bool) -> Any:
        if not isinstance(self.segment, Segment):
            return self.engine["barrier"](async_op)
        return self._run(async_op, self._barrier)

    def plan(self, kind: Any) -> Any:
        """The plan of ``kind`` (:meth:`distcomm.backend.engine.Engine.plan`): node memory's
        where the group proved it and the kind's arrays go through it, else the engine's."""
        run = self._plan(kind) if kind.op in _PLANNED_OPS else None
        if run is not None:
            return run
        engine_plan = self.engine["plan"]
        return None if engine_plan is None else engine_plan(kind)

    def finalize(self) -> None:
        """Give the segment back, then the engine's finalize."""
        self.close()
        if self.engine["finalize"] is not None:
            self.engine["finalize"]()

    def close(self) -> None:
        """Stop the worker (once the calls given to it ended, within the group's timeout) and
        give the segment back (the views made of it first)."""
        worker = self._worker
        if worker is not None:
            self._jobs.put(None)
            worker.join(self.comm.timeout)
            self._worker = None
        self._views.clear()
        segment = self.segment
        if isinstance(segment, Segment) and (worker is None or not worker.is_alive()):
            segment.close()
            self.segment = "finalized"

    # -- plans -------------------------------------------------------------------------------------
    def _plan(self, call: Any) -> Callable[[Any, Any], Any] | None:
        op, x, root = call.op, call.array, call.root
        if not isinstance(self.segment, Segment):
            return None
        if op == "barrier":
            return lambda x, y: self.barrier(False)  # after the calls started before it
        reduces = op in ("all_reduce", "reduce", "reduce_scatter_tensor")
        kind = self._takes(_ENGINE_OPS.get(op, op), x, reduce_op=ReduceOp.SUM if reduces else None)
        if kind is None:
            return None
        plain, sums = _PLAIN[kind], ReduceOp.SUM
        # what the call writes must be writable (a read-only numpy array: the pipeline refuses
        # it, naming it); a rank's read-only input is read as it is
        mine = self.comm.rank
        writes = mine != root if op == "broadcast" else (op != "reduce" or mine == root)

        if op in ("all_reduce", "reduce", "broadcast"):
            move = self._broadcast if op == "broadcast" else self._reduce
            extra = (root,) if op == "broadcast" else (sums, root)

            def run(x: Any, y: Any) -> None:
                if not plain(x) or (writes and not _writable(x)):
                    raise NotPlanned
                self._run(False, move, kind, x, *extra)

        elif op == "all_gather_into_tensor":

            def run(x: Any, y: Any) -> None:
                if not (plain(x) and plain(y) and _writable(y)):
                    raise NotPlanned
                self._run(False, self._all_gather, kind, y, x)

        else:
            name = "reduce_scatter" if reduces else "all_to_all"
            how = sums if reduces else None

            def run(x: Any, y: Any) -> None:
                if not (plain(x) and plain(y) and _writable(y)):
                    raise NotPlanned
                self._run(False, self._exchange, kind, name, y, x, how)

        return run

    # -- moving ------------------------------------------------------------------------------------
    def _view(self, kind: str) -> Any:
        """The segment as bytes of ``kind``'s arrays (made once)."""
        view = self._views.get(kind)
        if view is None:
            segment = self.segment
            assert isinstance(segment, Segment)
            if kind == "torch":
                import torch

                view = torch.frombuffer(segment.map, dtype=torch.uint8)
            elif kind == "numpy":
                import numpy

                view = numpy.frombuffer(segment.map, dtype=numpy.uint8)
            else:
                view = memoryview(segment.map)
            self._views[kind] = view
        return view

    def _parity(self) -> int:
        self._step += 1
        return self._step & 1

    def _meet(
        self, segment: Segment, descriptor: tuple[int, int, int] | None, label: Label
    ) -> None:
        """Arrive (with this call's ``descriptor`` where it is the call's first wait) and wait
        for every rank; compare the ranks' calls at a first wait. ``label``: the call's op and
        seq, which its errors name."""
        segment.arrive(descriptor)
        comm, (op, seq) = self.comm, label
        segment.wait(
            self.timeout,
            lambda limit, stalled, ended: comm.timed_out(op, seq, limit, "", stalled, ended),
        )
        if descriptor is not None:
            for rank in range(segment.world):
                if rank != segment.rank and segment.descriptor(rank) != descriptor:
                    raise self._mismatch(segment, descriptor, label)

    def _barrier(self, label: Label) -> None:
        segment = self.segment
        assert isinstance(segment, Segment)
        self._meet(segment, (_OPS.index("barrier"), 0, 0), label)
        self.calls += 1

    def _mismatch(
        self, segment: Segment, mine: tuple[int, int, int], label: Label
    ) -> CollectiveMismatchError:
        """The error for ranks whose calls differ (their descriptors), the group retired."""
        comm, (op, seq) = self.comm, label
        rows = [_row(mine if r == segment.rank else segment.descriptor(r))
                for r in range(segment.world)]  # fmt: skip
        calls = "; ".join(f"rank {r}: {_said(row)}" for r, row in enumerate(rows))
        comm.unusable = f"collective mismatch at operation #{seq}"
        return CollectiveMismatchError(
            f"{op} (operation #{seq}) on {comm.describe()}: the ranks called different "
            f"collectives ({calls}); none of them ran. HINT: every rank of the group must make "
            "the same collective calls in the same order, with the same dtype, size and root; "
            "DISTCOMM_DEBUG=DETAIL names the line of each call.",
            table=rows,
            op=op,
            seq=seq,
            group=comm.describe(),
        )

    def _reduce(self, kind: str, x: Any, op: ReduceOp, root: int | None, label: Label) -> None:
        """all_reduce (``root`` None) or reduce to ``root``, in place in ``x``."""
        segment = self.segment
        assert isinstance(segment, Segment)
        view, data = self._view(kind), _bytes(kind, x)
        world, me = segment.world, segment.rank
        dtype, item = x.dtype, x.itemsize
        adapter = adapter_for(x)
        code = _OPS.index("all_reduce" if root is None else "reduce")
        descriptor = (code | (root or 0) + 1 << 8 | _REDUCE_OPS.index(op) << 24,
                      _DTYPES.index(_dtype(x)), x.nbytes)  # fmt: skip
        total, piece = x.nbytes, SLOT_BYTES // item * item
        combine = ReduceOp.SUM if op is ReduceOp.AVG else op
        for start in range(0, max(total, 1), piece):
            length = min(piece, total - start)
            p = self._parity()
            mine = segment.slot(p, me)
            view[mine : mine + length] = data[start : start + length]
            self._meet(segment, descriptor if start == 0 else None, label)
            count = length // item
            lo, hi = count * me // world * item, count * (me + 1) // world * item
            if hi > lo:
                acc = view[mine + lo : mine + hi].view(dtype)
                for r in range(world):
                    if r != me:
                        theirs = segment.slot(p, r)
                        adapter.combine_(acc, view[theirs + lo : theirs + hi].view(dtype), combine)
                if op is ReduceOp.AVG:
                    adapter.divide_(acc, world)
            self._meet(segment, None, label)
            if root is None or root == me:
                for r in range(world):
                    lo, hi = count * r // world * item, count * (r + 1) // world * item
                    at = segment.slot(p, r)
                    data[start + lo : start + hi] = view[at + lo : at + hi]
        self.calls += 1

    def _broadcast(self, kind: str, x: Any, src: int, label: Label) -> None:
        segment = self.segment
        assert isinstance(segment, Segment)
        view, data = self._view(kind), _bytes(kind, x)
        total = _size(x)
        descriptor = (_OPS.index("broadcast") | src + 1 << 8, _DTYPES.index(_dtype(x)), total)
        for start in range(0, max(total, 1), SLOT_BYTES):
            length = min(SLOT_BYTES, total - start)
            at = segment.slot(self._parity(), src)
            if segment.rank == src:
                view[at : at + length] = data[start : start + length]
            self._meet(segment, descriptor if start == 0 else None, label)
            if segment.rank != src:
                data[start : start + length] = view[at : at + length]
        self.calls += 1

    def _all_gather(self, kind: str, output: Any, tensor: Any, label: Label) -> None:
        segment = self.segment
        assert isinstance(segment, Segment)
        view, data, out = self._view(kind), _bytes(kind, tensor), _bytes(kind, output)
        n = _size(tensor)
        descriptor = (_OPS.index("all_gather_into"), _DTYPES.index(_dtype(tensor)), n)
        for start in range(0, max(n, 1), SLOT_BYTES):
            length = min(SLOT_BYTES, n - start)
            p = self._parity()
            mine = segment.slot(p, segment.rank)
            view[mine : mine + length] = data[start : start + length]
            self._meet(segment, descriptor if start == 0 else None, label)
            for r in range(segment.world):
                at = segment.slot(p, r)
                out[r * n + start : r * n + start + length] = view[at : at + length]
        self.calls += 1

    def _exchange(
        self, kind: str, name: str, output: Any, input: Any, op: ReduceOp | None, label: Label
    ) -> None:
        """reduce_scatter (``op``) or all_to_all (None): chunk r of every rank's ``input``
        reduced into (or gathered in) rank r's ``output``."""
        segment = self.segment
        assert isinstance(segment, Segment)
        view, data, out = self._view(kind), _bytes(kind, input), _bytes(kind, output)
        world, me = segment.world, segment.rank
        item, dtype = getattr(input, "itemsize", 1), getattr(input, "dtype", None)
        chunk = _size(input) // world  # bytes of one rank's chunk
        adapter = adapter_for(input)
        reduce_code = 0 if op is None else _REDUCE_OPS.index(op) << 24
        descriptor = (_OPS.index(name) | reduce_code, _DTYPES.index(_dtype(input)), _size(input))
        piece = max(item, SLOT_BYTES // world // item * item)
        combine = ReduceOp.SUM if op is ReduceOp.AVG else op
        for start in range(0, max(chunk, 1), piece):
            length = min(piece, chunk - start)
            p = self._parity()
            mine = segment.slot(p, me)
            if length == chunk:
                view[mine : mine + world * chunk] = data[: world * chunk]
            else:
                for r in range(world):
                    at = r * chunk + start
                    view[mine + r * length : mine + (r + 1) * length] = data[at : at + length]
            self._meet(segment, descriptor if start == 0 else None, label)
            if op is None:
                for r in range(world):
                    at = segment.slot(p, r) + me * length
                    out[r * chunk + start : r * chunk + start + length] = view[at : at + length]
                continue
            if length == 0:
                continue
            acc = out[start : start + length]
            at = segment.slot(p, 0) + me * length
            acc[:] = view[at : at + length]
            acc = acc.view(dtype)
            for r in range(1, world):
                at = segment.slot(p, r) + me * length
                adapter.combine_(acc, view[at : at + length].view(dtype), combine)
            if op is ReduceOp.AVG:
                adapter.divide_(acc, world)
        self.calls += 1


class _Started:
    """The engine request (:class:`~distcomm.backend.EngineWork`) of a call given to the
    transport's worker: ``done`` completes when the call has, and ``future`` (torch's, where
    torch is imported: the Work's ``engine_future``) with it."""

    def __init__(self, done: concurrent.futures.Future[None], future: Any) -> None:
        self._done, self._future = done, future

    def test(self) -> bool:
        if not self._done.done():
            return False
        error = self._done.exception()
        if error is not None:
            raise error
        return True

    def block(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` seconds (None: until the call ends, which the group's
        timeout bounds)."""
        try:
            self._done.exception(timeout)
        except concurrent.futures.TimeoutError:
            return False
        return True

    def future(self) -> Any:
        return self._future


def _kind(x: Any, reduces: bool) -> str | None:
    """The kind of array ``x`` is, where node memory moves it as it is (contiguous CPU
    memory; bytes only for calls that do not reduce); else None."""
    try:
        adapter = adapter_for(x)
    except Exception:
        return None
    kind = adapter.kind
    if kind == "bytes" and reduces:
        return None
    return kind if _PLAIN[kind](x) else None


def _torch_plain(x: Any) -> bool:
    return bool(x.is_cpu and x.is_contiguous())


def _numpy_plain(x: Any) -> bool:
    return bool(x.flags.c_contiguous)  # (read-only: a root's input, the same path as the others')


def _bytes_plain(x: Any) -> bool:
    return isinstance(x, bytearray) or memoryview(x).c_contiguous


#: Whether an array of each kind is memory the transport moves as it is.
_PLAIN: dict[str, Callable[[Any], bool]] = {
    "torch": _torch_plain,
    "numpy": _numpy_plain,
    "bytes": _bytes_plain,
}


def _writable(x: Any) -> bool:
    """Whether the call may write into ``x`` (a numpy array's flag; bytes: not read-only)."""
    flags = getattr(x, "flags", None)
    if flags is not None:
        return bool(flags.writeable)
    return isinstance(x, bytearray) or not isinstance(x, (bytes, memoryview)) or not x.readonly


def _bytes(kind: str, x: Any) -> Any:
    """``x``'s memory as a flat array of bytes of its kind."""
    if kind == "torch":
        import torch

        return x.view(-1).view(torch.uint8)
    if kind == "numpy":
        import numpy

        return x.reshape(-1).view(numpy.uint8)
    return memoryview(x).cast("B")


def _size(x: Any) -> int:
    """``x``'s bytes."""
    return len(x) if isinstance(x, bytearray) else int(x.nbytes)


def _dtype(x: Any) -> str:
    return "uint8" if isinstance(x, (bytearray, memoryview)) else adapter_for(x).dtype(x)


def _row(descriptor: tuple[int, int, int]) -> dict[str, object]:
    """A row of the mismatch's table from a rank's descriptor."""
    what, dtype, nbytes = descriptor
    code, root, reduce_code = what & 0xFF, (what >> 8 & 0xFFFF) - 1, what >> 24
    op = _OPS[code] if code < len(_OPS) else f"op {code}"
    rooted = op in ("broadcast", "reduce")
    reduces = op in ("all_reduce", "reduce", "reduce_scatter")
    return {
        "op": op,
        "shape": None,
        "dtype": _DTYPES[dtype] if dtype < len(_DTYPES) else None,
        "numel": None,
        "bytes": nbytes,
        "root": root if rooted else None,
        "reduce_op": _REDUCE_OPS[reduce_code].name if reduces and reduce_code < 8 else None,
        "site": None,
    }


def _said(row: dict[str, object]) -> str:
    """A rank's call, as a mismatch names it."""
    parts = [str(row["op"])]
    if row["reduce_op"]:
        parts.append(str(row["reduce_op"]))
    if row["root"] is not None:
        parts.append(f"root {row['root']}")
    if row["op"] != "barrier":
        parts.append(f"{row['dtype']}, {row['bytes']} bytes")
    return " ".join(parts)
