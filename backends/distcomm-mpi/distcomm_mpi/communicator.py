"""`MpiEngine`: distcomm's engine over an mpi4py communicator, on the buffer path.

numpy arrays and byte buffers go to MPI as they are; CPU torch tensors as ``tensor.numpy()``
views of the same memory: no copies. MPI is initialised by mpi4py at import (thread level
MULTIPLE) and never finalised here, so ``init`` / ``finalize`` / ``init`` works; ``finalize``
frees the communicators distcomm created.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from distcomm import BackendUnavailableError, InvalidArgumentError, LaunchInfo, ReduceOp
from distcomm.backend import (
    INTERNAL_TAG,
    BaseCommunicator,
    CallKind,
    EngineWork,
    abort_job,
    abort_on_uncaught_exception,
    monitor,
    select_cuda_device,
    set_abort_notice,
)
from distcomm.backend.aborts import on_timeout
from distcomm.protocol import Work
from distcomm_mpi import plans
from distcomm_mpi.cuda import query_cuda_support
from distcomm_mpi.leftovers import clean_abort, remove_at_abort, remove_leftovers
from distcomm_mpi.native import native_call
from distcomm_mpi.sidechannel import SideChannel, channel

__all__ = ["MpiEngine", "MpiRequest", "create"]

_IN_PLACE = MPI.IN_PLACE

_OPS = {
    ReduceOp.SUM: MPI.SUM,
    ReduceOp.PRODUCT: MPI.PROD,
    ReduceOp.MIN: MPI.MIN,
    ReduceOp.MAX: MPI.MAX,
    ReduceOp.BAND: MPI.BAND,
    ReduceOp.BOR: MPI.BOR,
    ReduceOp.BXOR: MPI.BXOR,
}


def buf(x: Any) -> Any:
    """``x`` as something MPI reads and writes in place (no copy)."""
    if isinstance(x, (np.ndarray, bytearray, memoryview)):
        return x
    if x.is_cpu:
        return x.detach().numpy()  # a view of the tensor's memory
    # A CUDA tensor, which reaches here only on a CUDA-aware MPI: mpi4py hands MPI its device
    # pointer (DLPack). MPI knows nothing of torch's streams, so the kernels writing it must end.
    import torch

    torch.cuda.current_stream(x.device).synchronize()
    return x.detach()


def _span(x: Any) -> tuple[int, int]:
    """(address, size in bytes) of something :func:`buf` returned."""
    if isinstance(x, (bytearray, memoryview)):
        x = np.frombuffer(x, np.uint8)
    if isinstance(x, np.ndarray):
        return (int(x.ctypes.data) if x.size else 0), x.nbytes
    return int(x.data_ptr()), int(x.nbytes)  # a CUDA tensor


_BYTES = (bytearray, memoryview)


def _owner(x: Any) -> Any:
    """The object whose memory a byte buffer is."""
    return x.obj if isinstance(x, memoryview) else x


def in_place(send: Any, recv: Any, slot: int) -> Any:
    """``MPI.IN_PLACE`` when ``send`` is exactly chunk ``slot`` of ``recv`` (MPI forbids
    aliased buffers; torch allows in-place gathers), else ``send``. Byte buffers (the object
    collectives' transport) of different owners cannot alias: no address arithmetic for them."""
    if isinstance(send, _BYTES) and isinstance(recv, _BYTES) and _owner(send) is not _owner(recv):
        return send
    address, size = _span(send)
    if size and address == _span(recv)[0] + slot * size:
        return MPI.IN_PLACE
    return send


#: What a message that timed out waited for.
_UNMATCHED = "the matching message did not arrive"


class MpiRequest:
    """An MPI request (the engine's side of an :class:`~distcomm.backend.EngineWork`):
    ``block(None)`` waits under the watchdog (which ends the job past the timeout: MPI cannot
    cancel), ``block(timeout)`` polls."""

    def __init__(self, request: Any, status: Any = None, waiting_for: str = "") -> None:
        self._request = request
        self._status = status
        self._waiting_for = waiting_for

    @property
    def source(self) -> int | None:
        """For an irecv: the sender's rank in the communicator, once complete."""
        return None if self._status is None else int(self._status.Get_source())

    def test(self) -> bool:
        return bool(self._request.Test(self._status))

    def block(self, timeout: float | None) -> bool:
        if timeout is None:
            self._request.Wait(self._status)  # under the watchdog (the kit set the mark)
            return True
        deadline = time.monotonic() + timeout
        pause = 0.0001
        while not self._request.Test(self._status):
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.01)
        return True

    def waiting_for(self) -> str:
        """What a timed-out message waited for ("" for a collective: every rank)."""
        return self._waiting_for


def _answer_wait() -> float:
    """Seconds a question over the side channel waits for its answers (a few ticks)."""
    return 3 * monitor.interval() + 0.5


class MpiEngine:
    """distcomm's engine over an mpi4py ``Comm`` (``native``)."""

    engine_errors = (MPI.Exception,)
    devices = frozenset({"cpu"})
    #: The world's launch where MPI's rank differs from the one it was given (``create``).
    launch: LaunchInfo | None = None

    def __init__(
        self, comm: Any, *, owns: bool, cuda_aware: tuple[bool, str], side: SideChannel
    ) -> None:
        self._comm = comm
        self._owns = owns
        self.rank, self.world_size = comm.Get_rank(), comm.Get_size()
        #: (whether MPI moves CUDA memory itself, who said so); see :mod:`distcomm_mpi.cuda`.
        self.cuda_aware = cuda_aware
        if cuda_aware[0]:
            self.devices = frozenset({"cpu", "cuda"})
        else:
            self.cpu_only_reason = f"this MPI is not CUDA-aware: {cuda_aware[1]}"
        #: MPI's largest tag: the kit's own two (from INTERNAL_TAG) are it and the one below.
        self._tag_ub = int(comm.Get_attr(MPI.TAG_UB) or 32767)
        self._allreduce = comm.Allreduce
        self._bcast, self._reduce_call, self._allgather = comm.Bcast, comm.Reduce, comm.Allgather
        self._reduce_scatter_block, self._alltoall = comm.Reduce_scatter_block, comm.Alltoall
        self._send, self._recv = comm.Send, comm.Recv
        self._gather_call, self._scatter_call = comm.Gather, comm.Scatter
        self._alltoallv = comm.Alltoallv
        self._scratch = plans.Scratch(self.world_size)
        self._side = side
        self._blocked_since: tuple[int, float] | None = None

    @property
    def native(self) -> Any:
        """The mpi4py communicator."""
        return self._comm

    def bind(self, comm: BaseCommunicator) -> None:
        """Named on the side channel (peers ask where it is) and watched (its timeouts)."""
        self.comm = comm
        self._key = self._side.register(comm)
        self.monitor_interval = max(0.02, min(0.5, comm.timeout / 4))
        monitor.watch(self)

    # -- timeouts: the watchdog and the side channel ---------------------------------------------
    def monitor_tick(self, now: float) -> None:
        """The watchdog (the monitor thread calls it): a blocking call still pending under the
        same mark past the timeout ends the job, with a diagnostic naming the missing ranks."""
        comm = self.comm
        seq = comm.blocked_seq
        if not seq or comm.unusable == "finalized":
            self._blocked_since = None
            return
        since = self._blocked_since
        if since is None or since[0] != seq:
            self._blocked_since = (seq, now)
        elif now - since[1] >= comm.timeout:
            self._blocked_timeout(seq, now - since[1])

    def _blocked_timeout(self, seq: int, waited: float) -> None:
        """MPI cannot cancel a blocking call: the timeout's diagnostic (the kit's, as a raised
        DistTimeoutError would say it) is printed and the job ends, whatever
        ``DISTCOMM_ON_TIMEOUT`` says (``raise`` cannot be honoured here)."""
        comm = self.comm
        policy = "" if on_timeout() == "abort" else ", although DISTCOMM_ON_TIMEOUT=raise"
        _, message = comm.timeout_error(
            comm.op,
            seq if seq > 0 else None,
            comm.timeout,
            label=comm.blocked_op,
            consequence=f"MPI cannot cancel it, so distcomm aborts the job (MPI_Abort{policy}).",
        )
        abort_job(f"distcomm: rank {self.rank}: {message}")

    def peer_progress(self) -> dict[int, int]:
        ranks = self.comm.global_ranks
        peers = [g for r, g in enumerate(ranks) if r != self.rank]
        answers = self._side.ask(self._key, peers, _answer_wait())
        return {ranks.index(g): seq for g, seq in answers.items()}

    def peer_stacks(self, ranks: list[int]) -> dict[int, str]:
        world = self.comm.global_ranks
        answers = self._side.where(self._key, [world[r] for r in ranks], _answer_wait())
        return {world.index(g): text for g, text in answers.items()}

    def check_tag(self, tag: int) -> None:
        if tag >= self._tag_ub - 1:
            raise InvalidArgumentError(
                f"tag={tag!r} is too large for this MPI: valid tags are 0 to {self._tag_ub - 2} "
                f"(MPI_TAG_UB={self._tag_ub}; the two largest are distcomm's own). HINT: pass a "
                "smaller tag."
            )

    def _run(self, blocking: Any, starting: Any, async_op: bool, *args: Any) -> Work | None:
        """``blocking(*args)``, or (async) the request ``starting(*args)`` in a Work that owns
        the buffers among ``args``."""
        if async_op:
            return EngineWork(self.comm, MpiRequest(starting(*args)), *args)
        blocking(*args)
        return None

    # -- primitives ---------------------------------------------------------------------------
    def plan(self, kind: CallKind) -> Callable[[Any, Any], Any] | None:
        """mpi4py's call for a kind of call on the caller's memory (:mod:`distcomm_mpi.plans`)."""
        return plans.plan(self, kind)

    def all_reduce(self, tensor: Any, op: ReduceOp, async_op: bool) -> Work | None:
        c = self._comm
        return self._run(c.Allreduce, c.Iallreduce, async_op, _IN_PLACE, buf(tensor), _OPS[op])

    def broadcast(self, tensor: Any, src: int, async_op: bool) -> Work | None:
        return self._run(self._comm.Bcast, self._comm.Ibcast, async_op, buf(tensor), src)

    def reduce(self, tensor: Any, dst: int, op: ReduceOp, async_op: bool) -> Work | None:
        send = MPI.IN_PLACE if self.rank == dst else buf(tensor)
        recv = buf(tensor) if self.rank == dst else None
        c = self._comm
        return self._run(c.Reduce, c.Ireduce, async_op, send, recv, _OPS[op], dst)

    def all_gather_into(self, output: Any, tensor: Any, async_op: bool) -> Work | None:
        recv = buf(output)
        send = in_place(buf(tensor), recv, self.rank)
        return self._run(self._comm.Allgather, self._comm.Iallgather, async_op, send, recv)

    def all_gather_v(
        self, output: Any, sizes: list[int], tensor: Any, async_op: bool
    ) -> Work | None:
        """``Allgatherv`` of the arrays' own type (bytes for the object collectives' byte
        buffers), ``sizes`` in elements; ``Allgather`` when the sizes are equal (MPICH's is
        faster: 6.7 against 9.7 ms for 2 x 16 MiB here)."""
        if min(sizes) == max(sizes):
            return self.all_gather_into(output, tensor, async_op)
        recv = [buf(output), sizes]  # mpi4py makes the (packed) displacements
        c = self._comm
        return self._run(c.Allgatherv, c.Iallgatherv, async_op, buf(tensor), recv)

    def reduce_scatter(self, output: Any, input: Any, op: ReduceOp, async_op: bool) -> Work | None:
        c = self._comm
        return self._run(
            c.Reduce_scatter_block,
            c.Ireduce_scatter_block,
            async_op,
            buf(input),
            buf(output),
            _OPS[op],
        )

    def reduce_scatter_v(
        self, output: Any, sizes: list[int], input: Any, op: ReduceOp, async_op: bool
    ) -> Work | None:
        """``Reduce_scatter`` with one count per rank (``sizes``, in elements);
        ``Reduce_scatter_block`` when they are equal."""
        if min(sizes) == max(sizes):
            return self.reduce_scatter(output, input, op, async_op)
        c = self._comm
        return self._run(
            c.Reduce_scatter,
            c.Ireduce_scatter,
            async_op,
            buf(input),
            buf(output),
            sizes,
            _OPS[op],
        )

    def gather(self, output: Any | None, tensor: Any, dst: int, async_op: bool) -> Work | None:
        recv = buf(output) if output is not None else None
        send = buf(tensor) if recv is None else in_place(buf(tensor), recv, self.rank)
        return self._run(self._comm.Gather, self._comm.Igather, async_op, send, recv, dst)

    def scatter(self, output: Any, full: Any | None, src: int, async_op: bool) -> Work | None:
        send = buf(full) if full is not None else None
        c = self._comm
        return self._run(c.Scatter, c.Iscatter, async_op, send, buf(output), src)

    def all_to_all(self, output: Any, input: Any, async_op: bool) -> Work | None:
        c = self._comm
        return self._run(c.Alltoall, c.Ialltoall, async_op, buf(input), buf(output))

    def all_to_all_v(
        self,
        output: Any,
        output_splits: list[int],
        input: Any,
        input_splits: list[int],
        async_op: bool,
    ) -> Work | None:
        c = self._comm  # counts alone: mpi4py makes the displacements (packed), in C
        send, recv = [buf(input), input_splits], [buf(output), output_splits]
        return self._run(c.Alltoallv, c.Ialltoallv, async_op, send, recv)

    def native_call(self, op: str, args: tuple[Any, ...]) -> Any:
        return native_call(self._comm, op, args)

    def barrier(self, async_op: bool) -> Work | None:
        return self._run(self._comm.Barrier, self._comm.Ibarrier, async_op)

    def isend(self, tensor: Any, dst: int, tag: int) -> Work:
        b = buf(tensor)
        label = f"send to rank {dst} (tag {tag})"
        if tag >= INTERNAL_TAG:  # the kit's own: MPI's largest tags, refused to users
            tag = self._tag_ub - (tag - INTERNAL_TAG)
        request = MpiRequest(self._comm.Isend(b, dst, tag), waiting_for=_UNMATCHED)
        return EngineWork(self.comm, request, tensor, b, op=label, seq=None)

    def irecv(self, tensor: Any, src: int | None, tag: int) -> Work:
        peer = MPI.ANY_SOURCE if src is None else src
        b = buf(tensor)
        sender = "any rank" if src is None else f"rank {src}"
        label = f"recv from {sender} (tag {tag})"
        if tag >= INTERNAL_TAG:
            tag = self._tag_ub - (tag - INTERNAL_TAG)
        status = MPI.Status()
        request = MpiRequest(self._comm.Irecv(b, peer, tag), status, _UNMATCHED)
        return EngineWork(self.comm, request, tensor, b, op=label, seq=None)

    def split(self, groups: list[tuple[int, ...]], index: int | None) -> MpiEngine | None:
        color = MPI.UNDEFINED if index is None else index
        key = 0 if index is None else groups[index].index(self.rank)
        new = self._comm.Split(color, key)
        if index is None:
            return None
        return MpiEngine(new, owns=True, cuda_aware=self.cuda_aware, side=self._side)

    def finalize(self) -> None:
        monitor.unwatch(self)
        self._scratch = plans.Scratch(self.world_size)  # its memory freed
        if self._owns and self._comm != MPI.COMM_NULL:
            self._comm.Free()


def create(
    launch: LaunchInfo,
    *,
    timeout: float = 1800.0,
    device: str | None = None,
    cuda_aware: bool | None = None,
    **options: Any,
) -> MpiEngine:
    """Factory of ``mpi``: the engine of a duplicate of COMM_WORLD (so distcomm's traffic is
    its own).

    Args:
        cuda_aware: whether the MPI library moves CUDA memory itself; None (the default) asks
            the library (:func:`distcomm_mpi.cuda.query_cuda_support`). Otherwise CUDA tensors
            are staged through host memory, with one warning.
        device: None or "cpu"; "cuda" / "cuda:N" (made the current CUDA device) on a
            CUDA-aware MPI only.

    Raises:
        BackendUnavailableError: COMM_WORLD's size differs from the launch's world size (a
            process started without the launcher is a singleton, not one of N ranks).
        InvalidArgumentError: unknown options, or a CUDA device on an MPI that is not CUDA-aware.
    """
    if options or cuda_aware not in (None, True, False):
        raise InvalidArgumentError(
            f"backend 'mpi' takes one option, cuda_aware (True, False or None to ask the "
            f"library), got cuda_aware={cuda_aware!r}, other options {sorted(options)!r}."
        )
    aware = query_cuda_support() if cuda_aware is None else (cuda_aware, "init(cuda_aware=...)")
    if device not in (None, "cpu"):
        if not aware[0]:
            raise InvalidArgumentError(
                f"backend 'mpi' was given device={device!r}, but this MPI is not CUDA-aware "
                f"({aware[1]}). HINT: omit device (CUDA tensors are then staged through host "
                "memory), use nccl for GPUs, or pass cuda_aware=True if the library is."
            )
        select_cuda_device("mpi", launch, device, "omit device to move CPU memory.")
    world = MPI.COMM_WORLD
    if world.Get_size() != launch.world_size:
        raise BackendUnavailableError(
            f"mpi: MPI's COMM_WORLD has {world.Get_size()} rank(s) but the {launch.method} launch "
            f"says {launch.world_size}. HINT: start every rank with one mpirun -n "
            f"{launch.world_size} (or srun --mpi=pmi2); a process started otherwise is alone.",
            backend="mpi",
            reason="MPI world size differs from the launch",
        )
    world.Barrier()  # every rank has mapped MPICH's files and read hydra's topology file
    remove_leftovers()  # their names now: a job killed any way leaves none (distcomm_mpi.leftovers)
    side = channel(world)
    monitor.watch(side)
    remove_at_abort()  # the files MPICH makes later (distcomm_mpi.leftovers)
    if world.Get_size() > 1:  # a dying rank would leave the others waiting: it ends the job
        abort_on_uncaught_exception(world.Get_rank(), lambda: clean_abort(world), "MPI_Abort")
        set_abort_notice(lambda: side.job_ends(_answer_wait()))
    engine = MpiEngine(world.Dup(), owns=True, cuda_aware=aware, side=side)
    if world.Get_rank() != launch.rank:  # the world's ranks are MPI's (init(rank=...) aside)
        engine.launch = launch.replace("MPI's COMM_WORLD", rank=world.Get_rank())
    return engine
