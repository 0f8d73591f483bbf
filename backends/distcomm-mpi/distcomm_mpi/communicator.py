"""`MpiCommunicator`: distcomm's primitives over an mpi4py communicator, on the buffer path.

numpy arrays and byte buffers go to MPI as they are; CPU torch tensors as ``tensor.numpy()``
views of the same memory: no copies. MPI is initialised by mpi4py at import (thread level
MULTIPLE) and never finalised here, so ``init`` / ``finalize`` / ``init`` works; ``finalize``
frees the communicators distcomm created.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

import numpy as np
from mpi4py import MPI

from distcomm import (
    NON_MEMBER,
    BackendUnavailableError,
    BaseCommunicator,
    Capabilities,
    DistTimeoutError,
    InvalidArgumentError,
    LaunchInfo,
    ReduceOp,
)
from distcomm.protocol import Communicator, NonMember, Work
from distcomm_mpi.plugin import MPI_CAPABILITIES
from distcomm_mpi.watchdog import watch

__all__ = ["MpiCommunicator", "MpiWork", "create"]

_OPS = {
    ReduceOp.SUM: MPI.SUM,
    ReduceOp.PRODUCT: MPI.PROD,
    ReduceOp.MIN: MPI.MIN,
    ReduceOp.MAX: MPI.MAX,
    ReduceOp.BAND: MPI.BAND,
    ReduceOp.BOR: MPI.BOR,
    ReduceOp.BXOR: MPI.BXOR,
}
#: numpy type codes of the dtypes MPI reduces natively (the shortcut of ``all_reduce``).
_DIRECT = frozenset(np.dtype(name).char for name in MPI_CAPABILITIES.dtypes)
#: Seconds between two tests of a request in ``MpiWork.wait(timeout)``.
_POLL = 0.0005


def buf(x: Any) -> Any:
    """``x`` as something MPI reads and writes in place (no copy)."""
    if isinstance(x, (np.ndarray, bytearray, memoryview)):
        return x
    return x.detach().numpy()  # a CPU torch tensor: a view of its memory


def in_place(send: Any, recv: Any, slot: int) -> Any:
    """``MPI.IN_PLACE`` when ``send`` is exactly chunk ``slot`` of ``recv`` (MPI forbids
    aliased buffers; torch allows in-place gathers), else ``send``."""
    s, r = np.asarray(send), np.asarray(recv)
    if not s.nbytes or not np.shares_memory(s, r):
        return send
    start = r.__array_interface__["data"][0] + slot * s.nbytes
    return MPI.IN_PLACE if s.__array_interface__["data"][0] == start else send


class MpiWork:
    """An MPI request seen through distcomm; ``wait(timeout)`` polls only when given a timeout."""

    def __init__(self, request: Any, comm: MpiCommunicator, op: str, status: Any = None) -> None:
        self._request = request
        self._comm = comm
        self._op = op
        self._seq = comm.seq
        self._status = status
        self._done = False

    @property
    def source(self) -> int | None:
        """For an irecv: the sender's rank in the communicator, once complete."""
        return None if self._status is None or not self._done else int(self._status.Get_source())

    def wait(self, timeout: float | None = None) -> bool:
        if self._done:
            return True
        if timeout is None:
            comm = self._comm
            comm.blocked_op, comm.blocked_seq = self._op, self._seq or comm.seq
            self._request.Wait(self._status)
            comm.blocked_seq = 0
        else:
            deadline = time.monotonic() + timeout
            while not self._request.Test(self._status):
                if time.monotonic() >= deadline:
                    raise self._comm.timed_out(self._op, self._seq, timeout)
                time.sleep(_POLL)
        self._done = True
        return True

    def is_completed(self) -> bool:
        self._done = self._done or bool(self._request.Test(self._status))
        return self._done


class MpiCommunicator(BaseCommunicator):
    """A distcomm communicator over an mpi4py ``Comm`` (``native``)."""

    backend_name: ClassVar[str] = "mpi"
    capabilities: ClassVar[Capabilities] = MPI_CAPABILITIES
    devices = frozenset({"cpu"})

    def __init__(self, comm: Any, *, owns: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._comm = comm
        self._owns = owns
        self._tag_ub = int(comm.Get_attr(MPI.TAG_UB) or 32767)
        self._allreduce = comm.Allreduce
        #: The blocking operation in progress, for the watchdog (0: none).
        self.blocked_seq = 0
        self.blocked_op = ""
        watch(self)

    @property
    def native(self) -> Any:
        """The mpi4py communicator."""
        return self._comm

    def timed_out(self, op: str, seq: int, limit: float) -> DistTimeoutError:
        """Retire this communicator after a timeout and return the error to raise."""
        self.unusable = f"{op} (operation #{seq}) timed out after {limit:g} s"
        return DistTimeoutError(
            f"{op} (operation #{seq}) on {self.describe()} did not complete within {limit:g} s; "
            "MPI cannot cancel it, so the communicator can no longer be used. HINT: a rank is "
            "stuck or skipped this call; raise the timeout if it is merely slow.",
            op=op,
            seq=seq,
            group=self.describe(),
        )

    def _check_tag(self, tag: Any) -> None:
        super()._check_tag(tag)
        if tag > self._tag_ub:
            raise InvalidArgumentError(
                f"tag={tag!r} is above this MPI's largest tag (MPI_TAG_UB={self._tag_ub})"
            )

    def all_reduce(self, tensor: Any, op: Any = ReduceOp.SUM, async_op: bool = False) -> Any:
        """As BaseCommunicator's, with a shortcut for the commonest call: a blocking SUM of a
        contiguous numpy array of a native dtype goes straight to ``Allreduce`` (no wrapper)."""
        if (
            tensor.__class__ is np.ndarray
            and op is ReduceOp.SUM
            and not async_op
            and self.unusable is None
            and tensor.dtype.char in _DIRECT
            and tensor.flags.c_contiguous
        ):
            self.seq += 1
            self.blocked_op, self.blocked_seq = "all_reduce", self.seq
            self._allreduce(MPI.IN_PLACE, tensor, MPI.SUM)
            self.blocked_seq = 0
            return None
        return super().all_reduce(tensor, op, async_op)

    def _async(self, request: Any, op: str, async_op: bool) -> Work | None:
        work = MpiWork(request, self, op)
        if async_op:
            return work
        work.wait()
        return None

    # -- primitives ---------------------------------------------------------------------------
    def _all_reduce(self, tensor: Any, op: ReduceOp, async_op: bool) -> Work | None:
        if not async_op:
            self.blocked_op, self.blocked_seq = "all_reduce", self.seq
            self._comm.Allreduce(MPI.IN_PLACE, buf(tensor), _OPS[op])
            self.blocked_seq = 0
            return None
        return self._async(
            self._comm.Iallreduce(MPI.IN_PLACE, buf(tensor), _OPS[op]), "all_reduce", True
        )

    def _broadcast(self, tensor: Any, src: int, async_op: bool) -> Work | None:
        if not async_op:
            self.blocked_op, self.blocked_seq = "broadcast", self.seq
            self._comm.Bcast(buf(tensor), src)
            self.blocked_seq = 0
            return None
        return self._async(self._comm.Ibcast(buf(tensor), src), "broadcast", True)

    def _reduce(self, tensor: Any, dst: int, op: ReduceOp, async_op: bool) -> Work | None:
        send = MPI.IN_PLACE if self._rank == dst else buf(tensor)
        recv = buf(tensor) if self._rank == dst else None
        if not async_op:
            self.blocked_op, self.blocked_seq = "reduce", self.seq
            self._comm.Reduce(send, recv, _OPS[op], dst)
            self.blocked_seq = 0
            return None
        return self._async(self._comm.Ireduce(send, recv, _OPS[op], dst), "reduce", True)

    def _all_gather_into(self, output: Any, tensor: Any, async_op: bool) -> Work | None:
        recv = buf(output)
        send = in_place(buf(tensor), recv, self._rank)
        if not async_op:
            self.blocked_op, self.blocked_seq = "all_gather", self.seq
            self._comm.Allgather(send, recv)
            self.blocked_seq = 0
            return None
        return self._async(self._comm.Iallgather(send, recv), "all_gather", True)

    def _reduce_scatter(self, output: Any, input: Any, op: ReduceOp, async_op: bool) -> Work | None:
        args = (buf(input), buf(output), _OPS[op])
        if not async_op:
            self.blocked_op, self.blocked_seq = "reduce_scatter", self.seq
            self._comm.Reduce_scatter_block(*args)
            self.blocked_seq = 0
            return None
        return self._async(self._comm.Ireduce_scatter_block(*args), "reduce_scatter", True)

    def _gather(self, output: Any | None, tensor: Any, dst: int, async_op: bool) -> Work | None:
        recv = buf(output) if output is not None else None
        send = buf(tensor) if recv is None else in_place(buf(tensor), recv, self._rank)
        if not async_op:
            self.blocked_op, self.blocked_seq = "gather", self.seq
            self._comm.Gather(send, recv, dst)
            self.blocked_seq = 0
            return None
        return self._async(self._comm.Igather(send, recv, dst), "gather", True)

    def _scatter(self, output: Any, full: Any | None, src: int, async_op: bool) -> Work | None:
        send = buf(full) if full is not None else None
        if not async_op:
            self.blocked_op, self.blocked_seq = "scatter", self.seq
            self._comm.Scatter(send, buf(output), src)
            self.blocked_seq = 0
            return None
        return self._async(self._comm.Iscatter(send, buf(output), src), "scatter", True)

    def _all_to_all(self, output: Any, input: Any, async_op: bool) -> Work | None:
        if not async_op:
            self.blocked_op, self.blocked_seq = "all_to_all_single", self.seq
            self._comm.Alltoall(buf(input), buf(output))
            self.blocked_seq = 0
            return None
        return self._async(self._comm.Ialltoall(buf(input), buf(output)), "all_to_all_single", True)

    def _barrier(self, async_op: bool) -> Work | None:
        if not async_op:
            self.blocked_op, self.blocked_seq = "barrier", self.seq
            self._comm.Barrier()
            self.blocked_seq = 0
            return None
        return self._async(self._comm.Ibarrier(), "barrier", True)

    def _isend(self, tensor: Any, dst: int, tag: int) -> Work:
        return MpiWork(self._comm.Isend(buf(tensor), dst, tag), self, "send")

    def _irecv(self, tensor: Any, src: int | None, tag: int) -> Work:
        peer = MPI.ANY_SOURCE if src is None else src
        status = MPI.Status()
        return MpiWork(self._comm.Irecv(buf(tensor), peer, tag), self, "recv", status)

    def _split(self, groups: list[tuple[int, ...]], index: int | None) -> Communicator | NonMember:
        color = MPI.UNDEFINED if index is None else index
        key = 0 if index is None else groups[index].index(self._rank)
        new = self._comm.Split(color, key)
        if index is None:
            return NON_MEMBER
        return MpiCommunicator(
            new,
            owns=True,
            rank=new.Get_rank(),
            world_size=new.Get_size(),
            launch=self.launch,
            global_ranks=[self.global_ranks[r] for r in groups[index]],
            timeout=self.timeout,
            name=f"group {[self.global_ranks[r] for r in groups[index]]}",
        )

    def _finalize(self) -> None:
        if self._owns and self._comm != MPI.COMM_NULL:
            self._comm.Free()


def create(
    launch: LaunchInfo, *, timeout: float = 1800.0, device: str | None = None, **options: Any
) -> MpiCommunicator:
    """Factory of ``mpi``: a duplicate of COMM_WORLD (so distcomm's traffic is its own).

    Raises:
        BackendUnavailableError: COMM_WORLD's size differs from the launch's world size (a
            process started without the launcher is a singleton, not one of N ranks).
        InvalidArgumentError: options, or a device other than the CPU.
    """
    if options or device not in (None, "cpu"):
        raise InvalidArgumentError(
            f"backend 'mpi' takes no options and moves CPU memory, got device={device!r}, "
            f"options {sorted(options)!r}. HINT: CUDA tensors are staged through host memory."
        )
    world = MPI.COMM_WORLD
    if world.Get_size() != launch.world_size:
        raise BackendUnavailableError(
            f"mpi: MPI's COMM_WORLD has {world.Get_size()} rank(s) but the {launch.method} launch "
            f"says {launch.world_size}. HINT: start every rank with one mpirun -n "
            f"{launch.world_size} (or srun --mpi=pmi2); a process started otherwise is alone.",
            backend="mpi",
            reason="MPI world size differs from the launch",
        )
    return MpiCommunicator(
        world.Dup(),
        owns=True,
        rank=world.Get_rank(),
        world_size=world.Get_size(),
        launch=launch,
        timeout=timeout,
    )
