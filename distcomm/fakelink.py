"""FakeLink: the built-in in-process backend.

A :class:`Fabric` is one in-process world: ranks are threads (``distcomm.testing.run_threads``)
or, for a plain process, one rank. Collectives meet at a rendezvous slot keyed by communicator and
sequence number; the last rank to arrive computes every rank's result and writes it into their
tensors, so data really moves and reductions are really computed. Point-to-point messages are
matched like MPI's: in posting order, by source and tag, never overtaking. A rank that fails
aborts the fabric and every rank waiting in it stops at once; a wait past the timeout raises
DistTimeoutError naming the op, its sequence number and the missing ranks.

The core registers this module as a plugin, through the same hook a third party uses.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

from distcomm.arrays import adapter_for
from distcomm.base import BaseCommunicator
from distcomm.environment.info import LaunchInfo
from distcomm.errors import BackendUnavailableError, DistcommError, InvalidArgumentError
from distcomm.hookspecs import hookimpl
from distcomm.protocol import NON_MEMBER, Communicator, NonMember, ReduceOp, Work
from distcomm.registry import Registry
from distcomm.specs import BackendSpec, Capabilities
from distcomm.work import BaseWork, CompletedWork

__all__ = ["Fabric", "FabricAborted", "FakeLinkCommunicator", "distcomm_register_backends"]


class FabricAborted(DistcommError):
    """Raised in every rank of a fabric after another rank failed or the run timed out."""


class _Slot:
    __slots__ = ("done", "error", "inputs", "op", "result")

    def __init__(self, op: str) -> None:
        self.op = op
        self.inputs: dict[int, tuple[Any, ...]] = {}
        self.done = False
        self.error: BaseException | None = None
        self.result: Any = None


class _Recv:
    __slots__ = ("done", "error", "source", "src", "tag", "target")

    def __init__(self, target: Any, src: int | None, tag: int) -> None:
        self.target = target
        self.src = src
        self.tag = tag
        self.done = False
        self.error: BaseException | None = None
        self.source: int | None = None


class Fabric:
    """The shared state of one in-process world (see the module docstring)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.cond = threading.Condition()
        self.failure: str | None = None
        self._slots: dict[tuple[int, int], _Slot] = {}
        self._messages: dict[tuple[int, int], list[tuple[int, int, Any]]] = {}
        self._posted: dict[tuple[int, int], list[_Recv]] = {}
        self._uids = itertools.count(1)
        self._members: dict[int, dict[int, FakeLinkCommunicator]] = {}

    def new_uid(self) -> int:
        return next(self._uids)

    def abort(self, reason: str) -> None:
        """Stop every rank waiting in this fabric, now and later, with FabricAborted(reason)."""
        with self.cond:
            if self.failure is None:
                self.failure = reason
            self.cond.notify_all()

    def wait(self, ready: Callable[[], bool], timeout: float | None) -> bool:
        """Block until ``ready()`` (called under the lock); False once ``timeout`` passed.

        Raises:
            FabricAborted: another rank failed, or the run was stopped.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while not ready():
                if self.failure is not None:
                    raise FabricAborted(self.failure)
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self.cond.wait(remaining)
        return True

    def register(self, uid: int, rank: int, comm: FakeLinkCommunicator) -> None:
        """Record ``comm`` as rank ``rank`` of communicator ``uid`` (for :meth:`progress`)."""
        with self.cond:
            self._members.setdefault(uid, {})[rank] = comm

    def progress(self, uid: int) -> dict[int, int]:
        """The sequence number each rank of communicator ``uid`` has reached."""
        with self.cond:
            return {rank: comm.seq for rank, comm in self._members.get(uid, {}).items()}

    def join(
        self,
        uid: int,
        seq: int,
        rank: int,
        size: int,
        op: str,
        inputs: tuple[Any, ...],
        compute: Callable[[dict[int, tuple[Any, ...]]], Any],
    ) -> _Slot:
        """Deposit this rank's inputs for collective ``seq`` of communicator ``uid``.

        The last of ``size`` ranks runs ``compute(inputs by rank)``; its result (or error) is
        shared by all through the returned slot.
        """
        with self.cond:
            if self.failure is not None:
                raise FabricAborted(self.failure)
            slot = self._slots.setdefault((uid, seq), _Slot(op))
            if slot.op != op and slot.error is None:
                slot.error = InvalidArgumentError(
                    f"collective mismatch at operation #{seq}: rank {rank} called {op} while "
                    f"another rank called {slot.op}. HINT: every rank must call the same "
                    "collectives in the same order."
                )
            slot.inputs[rank] = inputs
            if len(slot.inputs) == size:
                del self._slots[(uid, seq)]
                if slot.error is None:
                    try:
                        slot.result = compute(slot.inputs)
                    except Exception as exc:
                        slot.error = exc
                slot.inputs = {}  # every rank's buffers: each rank's Work lets go of its own
                slot.done = True
                self.cond.notify_all()
            return slot

    def post_send(self, uid: int, src: int, dst: int, tag: int, data: Any) -> None:
        with self.cond:
            posted = self._posted.get((uid, dst), [])
            for req in posted:
                if req.tag == tag and req.src in (None, src):
                    posted.remove(req)
                    _deliver(req, src, data)
                    self.cond.notify_all()
                    return
            self._messages.setdefault((uid, dst), []).append((src, tag, data))
            self.cond.notify_all()

    def post_recv(self, uid: int, dst: int, req: _Recv) -> None:
        with self.cond:
            queue = self._messages.get((uid, dst), [])
            for i, (src, tag, data) in enumerate(queue):
                if tag == req.tag and req.src in (None, src):
                    del queue[i]
                    _deliver(req, src, data)
                    return
            self._posted.setdefault((uid, dst), []).append(req)


def _deliver(req: _Recv, src: int, data: Any) -> None:
    adapter = adapter_for(req.target)
    got, room = adapter_for(data).numel(data), adapter.numel(req.target)
    if got != room:
        req.error = InvalidArgumentError(
            f"recv: the message from rank {src} (tag {req.tag}) has {got} elements but the "
            f"receive buffer has {room}. HINT: size the buffer like the sent tensor."
        )
    else:
        adapter.copy_(req.target, data)
    req.source = src
    req.done = True


class _FabricWork(BaseWork):
    """A Work on a fabric: complete when ``state`` (a collective's slot or a posted receive) is
    done; its error, if any, is raised at wait()."""

    def __init__(
        self, comm: FakeLinkCommunicator, state: _Slot | _Recv, *buffers: Any, **names: Any
    ) -> None:
        super().__init__(comm, *buffers, **names)
        self._fabric, self._state, self._limit = comm.fabric, state, comm.timeout

    def _test(self) -> bool:
        if self._state.error is not None:
            raise self._state.error
        return self._state.done

    def _block(self, timeout: float | None) -> bool:
        state = self._state
        if not self._fabric.wait(lambda: state.done, self._limit if timeout is None else timeout):
            return False
        return self._test()


class _RecvWork(_FabricWork):
    def __init__(self, comm: FakeLinkCommunicator, req: _Recv) -> None:
        super().__init__(comm, req, req.target, op="recv", seq=None)
        self._req, self._world = req, comm.world_size

    @property
    def source(self) -> int | None:
        return self._req.source

    def _block(self, timeout: float | None) -> bool:
        if not self._req.done and self._world == 1:
            raise InvalidArgumentError(
                "recv in a world of 1 with no message sent to this rank can never complete. "
                "HINT: isend to yourself first, or run several ranks (testing.run_threads)."
            )
        return super()._block(timeout)

    def _waiting_for(self) -> str:
        sender = "any rank" if self._req.src is None else f"rank {self._req.src}"
        return f"no message from {sender} with tag {self._req.tag} arrived"


class FakeLinkCommunicator(BaseCommunicator):
    """A communicator of an in-process :class:`Fabric` (a world of 1, or thread-ranks)."""

    backend_name = "fakelink"
    capabilities = Capabilities()
    devices = frozenset({"cpu", "cuda"})

    def __init__(self, fabric: Fabric, uid: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fabric = fabric
        self.uid = uid
        self._collectives = 0
        fabric.register(uid, self.rank, self)

    @property
    def native(self) -> Fabric:
        return self.fabric

    def _peer_progress(self) -> dict[int, int]:
        return self.fabric.progress(self.uid)

    def _abort_job(self, message: str) -> None:
        """Thread-ranks end their fabric, never the process: every rank waiting in it stops."""
        self.fabric.abort(message)

    def _collective(
        self,
        op: str,
        inputs: tuple[Any, ...],
        compute: Callable[[dict[int, tuple[Any, ...]]], Any],
        async_op: bool,
    ) -> Work | None:
        self._collectives += 1
        seq = self._collectives
        slot = self.fabric.join(self.uid, seq, self.rank, self.world_size, op, inputs, compute)
        work = _FabricWork(self, slot, *inputs)
        if async_op:
            return work
        work.wait()
        return None

    def _all_reduce(self, tensor: Any, op: ReduceOp, async_op: bool) -> Work | None:
        return self._collective(
            "all_reduce", (tensor,), lambda ins: _reduce_into(ins, op, range(len(ins))), async_op
        )

    def _reduce(self, tensor: Any, dst: int, op: ReduceOp, async_op: bool) -> Work | None:
        return self._collective(
            "reduce", (tensor, dst), lambda ins: _reduce_into(ins, op, [dst]), async_op
        )

    def _broadcast(self, tensor: Any, src: int, async_op: bool) -> Work | None:
        def compute(ins: dict[int, tuple[Any, ...]]) -> None:
            _same_root(ins, "src")
            source = ins[src][0]
            _same_shape(ins, "broadcast")
            for r, (target, _) in ins.items():
                if r != src:
                    adapter_for(target).copy_(target, source)

        return self._collective("broadcast", (tensor, src), compute, async_op)

    def _all_gather_into(self, output: Any, tensor: Any, async_op: bool) -> Work | None:
        def compute(ins: dict[int, tuple[Any, ...]]) -> None:
            _same_shape(ins, "all_gather", index=1)
            for out, _ in ins.values():
                _write_chunks(out, [ins[r][1] for r in range(len(ins))])

        return self._collective("all_gather", (output, tensor), compute, async_op)

    def _reduce_scatter(self, output: Any, input: Any, op: ReduceOp, async_op: bool) -> Work | None:
        def compute(ins: dict[int, tuple[Any, ...]]) -> None:
            _same_shape(ins, "reduce_scatter", index=1)
            total = _combine([ins[r][1] for r in range(len(ins))], op)
            flat = adapter_for(total).flat(total)
            n = adapter_for(output).numel(output)
            for r, (out, _) in ins.items():
                adapter_for(out).copy_(out, flat[r * n : (r + 1) * n])

        return self._collective("reduce_scatter", (output, input), compute, async_op)

    def _gather(self, output: Any | None, tensor: Any, dst: int, async_op: bool) -> Work | None:
        def compute(ins: dict[int, tuple[Any, ...]]) -> None:
            _same_root(ins, "dst", index=2)
            _same_shape(ins, "gather", index=1)
            out = ins[dst][0]
            _write_chunks(out, [ins[r][1] for r in range(len(ins))])

        return self._collective("gather", (output, tensor, dst), compute, async_op)

    def _scatter(self, output: Any, full: Any | None, src: int, async_op: bool) -> Work | None:
        def compute(ins: dict[int, tuple[Any, ...]]) -> None:
            _same_root(ins, "src", index=2)
            _same_shape(ins, "scatter")
            source = adapter_for(ins[src][1]).flat(ins[src][1])
            for r, (out, _, _) in ins.items():
                n = adapter_for(out).numel(out)
                adapter_for(out).copy_(out, source[r * n : (r + 1) * n])

        return self._collective("scatter", (output, full, src), compute, async_op)

    def _all_to_all(self, output: Any, input: Any, async_op: bool) -> Work | None:
        def compute(ins: dict[int, tuple[Any, ...]]) -> None:
            _same_shape(ins, "all_to_all_single", index=1)
            size = len(ins)
            for r, (out, _) in ins.items():
                chunks = []
                for s in range(size):
                    src_in = ins[s][1]
                    c = adapter_for(src_in).numel(src_in) // size
                    chunks.append(adapter_for(src_in).flat(src_in)[r * c : (r + 1) * c])
                _write_chunks(out, chunks)

        return self._collective("all_to_all_single", (output, input), compute, async_op)

    def _barrier(self, async_op: bool) -> Work | None:
        return self._collective("barrier", (), lambda ins: None, async_op)

    def _isend(self, tensor: Any, dst: int, tag: int) -> Work:
        self.fabric.post_send(self.uid, self.rank, dst, tag, adapter_for(tensor).clone(tensor))
        return CompletedWork()

    def _irecv(self, tensor: Any, src: int | None, tag: int) -> Work:
        req = _Recv(tensor, src, tag)
        self.fabric.post_recv(self.uid, self.rank, req)
        return _RecvWork(self, req)

    def _split(self, groups: list[tuple[int, ...]], index: int | None) -> Communicator | NonMember:
        def compute(ins: dict[int, tuple[Any, ...]]) -> list[int]:
            return [self.fabric.new_uid() for _ in groups]

        self._collectives += 1
        seq = self._collectives
        slot = self.fabric.join(self.uid, seq, self.rank, self.world_size, "split", (), compute)
        _FabricWork(self, slot).wait()
        if index is None:
            return NON_MEMBER
        members = groups[index]
        uid = slot.result[index]
        return FakeLinkCommunicator(
            self.fabric,
            uid,
            rank=members.index(self.rank),
            world_size=len(members),
            launch=self.launch,
            global_ranks=[self.global_ranks[r] for r in members],
            timeout=self.timeout,
            name=f"group {uid}",
        )


def _combine(parts: list[Any], op: ReduceOp) -> Any:
    adapter = adapter_for(parts[0])
    acc = adapter.clone(parts[0])
    for other in parts[1:]:
        if adapter_for(other).numel(other) != adapter.numel(acc):
            raise InvalidArgumentError("ranks passed tensors of different sizes to a reduction")
        adapter.combine_(acc, other, op)
    if op is ReduceOp.AVG:
        adapter.divide_(acc, len(parts))
    return acc


def _reduce_into(ins: dict[int, tuple[Any, ...]], op: ReduceOp, targets: Any) -> None:
    if len(ins[0]) > 1:
        _same_root(ins, "dst")
    _same_shape(ins, "reduction")
    result = _combine([ins[r][0] for r in range(len(ins))], op)
    for r in targets:
        target = ins[r][0]
        adapter_for(target).copy_(target, result)


def _write_chunks(out: Any, chunks: list[Any]) -> None:
    adapter = adapter_for(out)
    flat = adapter.flat(out)
    offset = 0
    for chunk in chunks:
        n = adapter_for(chunk).numel(chunk)
        adapter.copy_(flat[offset : offset + n], chunk)
        offset += n


def _same_root(ins: dict[int, tuple[Any, ...]], name: str, index: int = 1) -> None:
    roots = {r: v[index] for r, v in ins.items()}
    if len(set(roots.values())) > 1:
        raise InvalidArgumentError(
            f"ranks disagree on {name}: {roots}. HINT: pass the same {name} on every rank."
        )


def _same_shape(ins: dict[int, tuple[Any, ...]], op: str, index: int = 0) -> None:
    sizes = {
        r: adapter_for(v[index]).numel(v[index]) for r, v in ins.items() if v[index] is not None
    }
    dtypes = {
        r: adapter_for(v[index]).dtype(v[index]) for r, v in ins.items() if v[index] is not None
    }
    if len(set(sizes.values())) > 1 or len(set(dtypes.values())) > 1:
        raise InvalidArgumentError(
            f"{op}: ranks passed different tensors: sizes {sizes}, dtypes {dtypes}. "
            "HINT: each rank passes a tensor of the same size and dtype."
        )


def create(
    launch: LaunchInfo, *, timeout: float = 1800.0, device: str | None = None, **options: Any
) -> FakeLinkCommunicator:
    """Factory of the ``fakelink`` backend: a world of 1 in this process.

    ``device`` is accepted and needs nothing: fakelink moves CPU and CUDA tensors alike.
    """
    if options:
        raise InvalidArgumentError(
            f"backend 'fakelink' takes no options, got {sorted(options)!r}. HINT: remove them from "
            "init(); options are passed to the backend's factory."
        )
    available, reason = is_available(launch)
    if not available:
        raise BackendUnavailableError(f"fakelink: {reason}", backend="fakelink", reason=reason)
    return FakeLinkCommunicator(Fabric(1), 0, rank=0, world_size=1, launch=launch, timeout=timeout)


def is_available(launch: LaunchInfo) -> tuple[bool, str]:
    """fakelink runs a world of 1 in a process; thread-worlds come from run_threads."""
    if launch.world_size == 1:
        return True, "in-process world of 1"
    return False, (
        f"in-process only: it runs a world of 1, or thread-ranks in distcomm.testing.run_threads, "
        f"but the {launch.method} launch says world_size={launch.world_size}"
    )


@hookimpl
def distcomm_register_backends(registry: Registry) -> None:
    """Register ``fakelink`` (priority 0: when asked, or for a world of 1 with no launcher)."""
    registry.add_backend(
        BackendSpec(
            name="fakelink",
            factory=create,
            is_available=is_available,
            priority=0,
            devices=FakeLinkCommunicator.devices,
            capabilities=FakeLinkCommunicator.capabilities,
            description="in-process: a world of 1, or N thread-ranks (testing.run_threads)",
        )
    )
