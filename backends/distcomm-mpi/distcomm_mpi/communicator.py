"""`MpiCommunicator`: distcomm's primitives over an mpi4py communicator, on the buffer path.

numpy arrays and byte buffers go to MPI as they are; CPU torch tensors as ``tensor.numpy()``
views of the same memory: no copies. MPI is initialised by mpi4py at import (thread level
MULTIPLE) and never finalised here, so ``init`` / ``finalize`` / ``init`` works; ``finalize``
frees the communicators distcomm created.
"""

from __future__ import annotations

import sys
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
from distcomm.devices import select_cuda_device
from distcomm.protocol import Communicator, NonMember, Work
from distcomm_mpi.cuda import query_cuda_support
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
#: numpy dtypes MPI reduces natively (the shortcut of ``all_reduce``).
_DIRECT = frozenset(np.dtype(name) for name in MPI_CAPABILITIES.dtypes)
# The shortcut's constants, bound once (an attribute lookup per call is measurable there).
_SUM, _MPI_SUM, _IN_PLACE, _ndarray = ReduceOp.SUM, MPI.SUM, MPI.IN_PLACE, np.ndarray
_fromaddress = MPI.buffer.fromaddress


class _TorchTypes:
    """torch.Tensor and the MPI datatypes of its native dtypes, bound when torch is first seen
    (this module imports no torch: numpy-only programs never load it)."""

    def __init__(self) -> None:
        self.tensor: type = _TorchTypes  # a class no argument has, until torch is seen
        self.types: dict[Any, Any] = {}

    def bind(self, cls: type) -> bool:
        """Whether ``cls`` is torch.Tensor; remembers it the first time."""
        torch = sys.modules.get("torch")
        if torch is None or cls is not torch.Tensor:
            return False
        self.types = {
            getattr(torch, name): MPI.Datatype.fromcode(np.dtype(name).char)
            for name in MPI_CAPABILITIES.dtypes
        }
        self.tensor = cls
        return True


_torch = _TorchTypes()
#: Seconds between two tests of a request in ``MpiWork.wait(timeout)``.
_POLL = 0.0005


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


def in_place(send: Any, recv: Any, slot: int) -> Any:
    """``MPI.IN_PLACE`` when ``send`` is exactly chunk ``slot`` of ``recv`` (MPI forbids
    aliased buffers; torch allows in-place gathers), else ``send``."""
    address, size = _span(send)
    if size and address == _span(recv)[0] + slot * size:
        return MPI.IN_PLACE
    return send


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

    def __init__(
        self, comm: Any, *, owns: bool, cuda_aware: tuple[bool, str], **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self._comm = comm
        self._owns = owns
        #: (whether MPI moves CUDA memory itself, who said so); see :mod:`distcomm_mpi.cuda`.
        self.cuda_aware = cuda_aware
        if cuda_aware[0]:
            self.devices = frozenset({"cpu", "cuda"})
        else:
            self.cpu_only_reason = f"this MPI is not CUDA-aware: {cuda_aware[1]}"
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

    def all_reduce(self, tensor: Any, op: Any = _SUM, async_op: bool = False) -> Any:
        """As BaseCommunicator's, with a shortcut for the commonest call: a blocking SUM of a
        contiguous CPU array of a native dtype (numpy array or torch tensor) goes straight to
        ``Allreduce`` with no wrapper; a tensor as a buffer at its address, not ``.numpy()``."""
        if op is _SUM and not async_op and self.unusable is None:
            cls = tensor.__class__
            b: Any = None
            if cls is _ndarray:
                if tensor.dtype in _DIRECT:
                    b = tensor  # mpi4py raises BufferError for a non-contiguous array
            elif cls is _torch.tensor or _torch.bind(cls):
                mpi_type = _torch.types.get(tensor.dtype)
                if mpi_type is not None and tensor.is_cpu and tensor.is_contiguous():
                    b = [_fromaddress(tensor.data_ptr(), tensor.nbytes), mpi_type]
            if b is not None:
                self.blocked_op = "all_reduce"
                self.blocked_seq = self.seq = self.seq + 1
                try:
                    self._allreduce(_IN_PLACE, b, _MPI_SUM)
                except BufferError:
                    self.seq -= 1  # not contiguous: nothing was sent; the general path copies
                else:
                    return None
                finally:
                    self.blocked_seq = 0
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
            cuda_aware=self.cuda_aware,
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
    launch: LaunchInfo,
    *,
    timeout: float = 1800.0,
    device: str | None = None,
    cuda_aware: bool | None = None,
    **options: Any,
) -> MpiCommunicator:
    """Factory of ``mpi``: a duplicate of COMM_WORLD (so distcomm's traffic is its own).

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
    return MpiCommunicator(
        world.Dup(),
        owns=True,
        cuda_aware=aware,
        rank=world.Get_rank(),
        world_size=world.Get_size(),
        launch=launch,
        timeout=timeout,
    )
