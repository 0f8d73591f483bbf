"""The FakeLink engine: every collective computed by the last rank to arrive.

Data really moves and reductions are really computed, in the ranks' own tensors. A wait past the
timeout raises DistTimeoutError naming the op, its sequence number and the missing ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from distcomm.backend import (
    BaseCommunicator,
    Capabilities,
    CompletedWork,
    EngineWork,
    LaunchInfo,
    adapter_for,
)
from distcomm.errors import InvalidArgumentError
from distcomm.fakelink.fabric import Fabric, FabricStalled, _Recv, _Slot
from distcomm.protocol import ReduceOp, Work

__all__ = ["CAPABILITIES", "FakeLinkEngine", "world"]


#: What fakelink does natively: everything (the spec's, and every fakelink communicator's).
CAPABILITIES = Capabilities()


class _Waiting:
    """A request on a fabric: complete when ``state`` (a collective's slot or a posted
    receive) is done; its error, if any, is raised at wait()."""

    def __init__(self, engine: FakeLinkEngine, state: _Slot | _Recv) -> None:
        self._fabric, self._state, self._limit = engine.fabric, state, engine.comm.timeout

    def test(self) -> bool:
        if self._state.error is not None:
            raise self._state.error
        return self._state.done

    def block(self, timeout: float | None) -> bool:
        state = self._state
        limit = self._limit if timeout is None else timeout
        if not self._fabric.wait(lambda: state.done, limit, polling=timeout is not None):
            return False  # a stall raises FabricStalled (FakeLinkEngine.timeout_of)
        return self.test()


class _Receiving(_Waiting):
    def __init__(self, engine: FakeLinkEngine, req: _Recv) -> None:
        super().__init__(engine, req)
        self._req, self._world = req, engine.comm.world_size

    @property
    def source(self) -> int | None:
        return self._req.source

    def block(self, timeout: float | None) -> bool:
        if not self._req.done and self._world == 1:
            raise InvalidArgumentError(
                "recv in a world of 1 with no message sent to this rank can never complete. "
                "HINT: isend to yourself first, or run several ranks (testing.run_threads)."
            )
        return super().block(timeout)

    def waiting_for(self) -> str:
        sender = "any rank" if self._req.src is None else f"rank {self._req.src}"
        return f"no message from {sender} with tag {self._req.tag} arrived"


def world(
    fabric: Fabric, launch: LaunchInfo, timeout: float = 1800.0, engine: type | None = None
) -> BaseCommunicator:
    """Rank ``launch.rank`` of the world of ``fabric`` (of ``launch.world_size`` ranks): the
    communicator over a :class:`FakeLinkEngine` (or ``engine``, a subclass of it)."""
    return BaseCommunicator(
        (engine or FakeLinkEngine)(fabric, 0),
        backend="fakelink",
        capabilities=CAPABILITIES,
        rank=launch.rank,
        world_size=launch.world_size,
        launch=launch,
        timeout=timeout,
    )


class FakeLinkEngine:
    """The engine of an in-process :class:`Fabric` (a world of 1, or thread-ranks): ``uid``
    names its communicator on the fabric."""

    devices = frozenset({"cpu", "cuda"})

    def __init__(self, fabric: Fabric, uid: int) -> None:
        self.fabric = fabric
        self.uid = uid
        self._collectives = 0

    @property
    def native(self) -> Fabric:
        return self.fabric

    def bind(self, comm: BaseCommunicator) -> None:
        self.comm = comm
        self.rank, self.world_size = comm.rank, comm.world_size
        self.fabric.register(self.uid, self.rank, comm)

    def peer_progress(self) -> dict[int, int]:
        return self.fabric.progress(self.uid)

    def peer_stacks(self, ranks: list[int]) -> dict[int, str]:
        return self.fabric.stacks(self.uid, ranks)

    def timeout_of(self, exc: BaseException) -> str | None:
        """A stalled fabric (every rank still running waits, none can go on) is a timeout
        that came early: the operation can never complete."""
        return str(exc) if isinstance(exc, FabricStalled) else None

    def abort_job(self, message: str) -> None:
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
        work = EngineWork(self.comm, _Waiting(self, slot), *inputs)
        if async_op:
            return work
        work.wait()
        return None

    def all_reduce(self, tensor: Any, op: ReduceOp, async_op: bool) -> Work | None:
        return self._collective(
            "all_reduce", (tensor,), lambda ins: _reduce_into(ins, op, range(len(ins))), async_op
        )

    def reduce(self, tensor: Any, dst: int, op: ReduceOp, async_op: bool) -> Work | None:
        return self._collective(
            "reduce", (tensor, dst), lambda ins: _reduce_into(ins, op, [dst]), async_op
        )

    def broadcast(self, tensor: Any, src: int, async_op: bool) -> Work | None:
        def compute(ins: dict[int, tuple[Any, ...]]) -> None:
            _same_root(ins, "src")
            source = ins[src][0]
            _same_shape(ins, "broadcast")
            for r, (target, _) in ins.items():
                if r != src:
                    adapter_for(target).copy_(target, source)

        return self._collective("broadcast", (tensor, src), compute, async_op)

    def all_gather_into(self, output: Any, tensor: Any, async_op: bool) -> Work | None:
        def compute(ins: dict[int, tuple[Any, ...]]) -> None:
            _same_shape(ins, "all_gather", index=1)
            for out, _ in ins.values():
                _write_chunks(out, [ins[r][1] for r in range(len(ins))])

        return self._collective("all_gather", (output, tensor), compute, async_op)

    def reduce_scatter(self, output: Any, input: Any, op: ReduceOp, async_op: bool) -> Work | None:
        def compute(ins: dict[int, tuple[Any, ...]]) -> None:
            _same_shape(ins, "reduce_scatter", index=1)
            total = _combine([ins[r][1] for r in range(len(ins))], op)
            flat = adapter_for(total).flat(total)
            n = adapter_for(output).numel(output)
            for r, (out, _) in ins.items():
                adapter_for(out).copy_(out, flat[r * n : (r + 1) * n])

        return self._collective("reduce_scatter", (output, input), compute, async_op)

    def gather(self, output: Any | None, tensor: Any, dst: int, async_op: bool) -> Work | None:
        def compute(ins: dict[int, tuple[Any, ...]]) -> None:
            _same_root(ins, "dst", index=2)
            _same_shape(ins, "gather", index=1)
            out = ins[dst][0]
            _write_chunks(out, [ins[r][1] for r in range(len(ins))])

        return self._collective("gather", (output, tensor, dst), compute, async_op)

    def scatter(self, output: Any, full: Any | None, src: int, async_op: bool) -> Work | None:
        def compute(ins: dict[int, tuple[Any, ...]]) -> None:
            _same_root(ins, "src", index=2)
            _same_shape(ins, "scatter")
            source = adapter_for(ins[src][1]).flat(ins[src][1])
            for r, (out, _, _) in ins.items():
                n = adapter_for(out).numel(out)
                adapter_for(out).copy_(out, source[r * n : (r + 1) * n])

        return self._collective("scatter", (output, full, src), compute, async_op)

    def all_to_all(self, output: Any, input: Any, async_op: bool) -> Work | None:
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

    def barrier(self, async_op: bool) -> Work | None:
        return self._collective("barrier", (), lambda ins: None, async_op)

    def isend(self, tensor: Any, dst: int, tag: int) -> Work:
        self.fabric.post_send(self.uid, self.rank, dst, tag, adapter_for(tensor).clone(tensor))
        return CompletedWork()

    def irecv(self, tensor: Any, src: int | None, tag: int) -> Work:
        req = _Recv(tensor, src, tag)
        self.fabric.post_recv(self.uid, self.rank, req)
        return EngineWork(self.comm, _Receiving(self, req), req.target, op="recv", seq=None)

    def split(self, groups: list[tuple[int, ...]], index: int | None) -> FakeLinkEngine | None:
        def compute(ins: dict[int, tuple[Any, ...]]) -> list[int]:
            return [self.fabric.new_uid() for _ in groups]

        self._collectives += 1
        seq = self._collectives
        slot = self.fabric.join(self.uid, seq, self.rank, self.world_size, "split", (), compute)
        EngineWork(self.comm, _Waiting(self, slot)).wait()
        return None if index is None else type(self)(self.fabric, slot.result[index])


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
