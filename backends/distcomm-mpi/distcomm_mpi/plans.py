"""The mpi backend's plans (:meth:`MpiEngine.plan`): for a kind of blocking call the kit
took once, mpi4py's own call on the caller's memory: a numpy array as it is, a CPU torch tensor
as a buffer at its address with its MPI type (not ``.numpy()``), bound once per kind.

mpi4py refuses a numpy array that is not contiguous with BufferError, before anything is sent: a
plan then raises NotPlanned and the kit stages the call. gather and scatter on the root take the
list as one buffer where its parts are consecutive (``big.chunk(n)``), else copy through the
communicator's scratch buffer (:class:`Scratch`). The uneven all-to-all of numpy arrays is
``Alltoallv`` with the kit's element counts.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from mpi4py import MPI

from distcomm.backend import CallKind, NotPlanned
from distcomm.backend.arrays import adapter_for
from distcomm_mpi.plugin import MPI_CAPABILITIES

if TYPE_CHECKING:
    from distcomm_mpi.communicator import MpiEngine

__all__ = ["Scratch", "plan"]

#: numpy dtypes MPI moves and reduces natively.
_DIRECT = frozenset(np.dtype(name) for name in MPI_CAPABILITIES.dtypes)
#: The same, by identity: numpy's built-in dtypes are singletons, and an id is cheaper to look
#: up than a dtype's hash (a byte-swapped dtype is another object: not found, the pipeline's).
_DIRECT_IDS = frozenset(id(dtype) for dtype in _DIRECT)
# The plans' constants, bound once (an attribute lookup per call is measurable there).
_MPI_SUM, _IN_PLACE, _ndarray = MPI.SUM, MPI.IN_PLACE, np.ndarray
_fromaddress = MPI.buffer.fromaddress
_ANY_SOURCE = MPI.ANY_SOURCE
_mpi_buffer = MPI.buffer
#: The MPI datatype of each numpy dtype MPI moves, by the dtype's id (as :data:`_DIRECT_IDS`).
_NUMPY_TYPES = {id(dtype): MPI.Datatype.fromcode(dtype.char) for dtype in _DIRECT}
#: The largest scratch buffer a communicator keeps for the rooted plans (:class:`Scratch`);
#: a larger one is made for its call only (its copy costs more than the allocation then).
_SCRATCH_KEPT = 64 << 20


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


def _mpi_type(x: Any) -> Any:
    """The MPI datatype of a numpy array or torch tensor; None: a dtype MPI lacks, or
    another class."""
    cls = x.__class__
    if cls is _ndarray:
        return _NUMPY_TYPES.get(id(x.dtype))
    if cls is _torch.tensor or _torch.bind(cls):
        return _torch.types.get(x.dtype)
    return None


def _address(x: Any, writable: bool) -> int | None:
    """Where a numpy array or torch tensor's memory starts, if it is contiguous (C order) in
    CPU memory (and, ``writable``, may be written); None otherwise."""
    if x.__class__ is _ndarray:  # (MPI.buffer takes a Fortran-ordered array too)
        if not x.flags.c_contiguous:
            return None
        b = _mpi_buffer(x)
        return None if writable and b.readonly else int(b.address)
    if not x.is_cpu or not x.is_contiguous():
        return None
    return int(x.data_ptr())


def _region(parts: Any, nbytes: int, writable: bool) -> int | None:
    """Where the memory of ``parts`` starts when they are consecutive contiguous chunks of
    ``nbytes`` bytes each (``big.chunk(n)``, ``np.split(big, n)``): one buffer MPI takes as
    it is; None otherwise."""
    start = end = -1
    for p in parts:
        at = _address(p, writable)
        if at is None or (end >= 0 and at != end):
            return None
        if start < 0:
            start = at
        end = at + nbytes
    return start


class _Views:
    """Memory seen as ``world`` arrays like ``x``: ``flat`` (1-D), ``stacked`` (``world`` rows
    of ``x``'s shape), ``rows`` (each row), ``buf`` (MPI's buffer of it)."""

    __slots__ = ("buf", "flat", "rows", "stacked")

    def __init__(self, memory: Any, x: Any, world: int, mpi_type: Any) -> None:
        if x.__class__ is _ndarray:
            self.flat = memory.view(x.dtype)
        else:
            self.flat = sys.modules["torch"].from_numpy(memory).view(x.dtype)
        self.stacked = self.flat.reshape((world, *x.shape))
        self.rows = tuple(self.stacked)
        self.buf = [_fromaddress(memory.ctypes.data, memory.nbytes), mpi_type]

    def copy_in(self, parts: Any) -> None:
        """Scatter's list into the memory: numpy's in one ``concatenate``, torch's in one
        ``stack`` when every part has the rows' shape (else part by part)."""
        if self.flat.__class__ is _ndarray:
            np.concatenate(parts, axis=None, out=self.flat)
            return
        torch = sys.modules["torch"]
        shape = self.stacked.shape[1:]
        with torch.no_grad():
            if all(p.shape == shape for p in parts):
                torch.stack(parts, out=self.stacked)
                return
            for row, p in zip(self.rows, parts, strict=True):
                row.copy_(p.reshape(shape))

    def copy_out(self, parts: Any) -> None:
        """Gather's memory into its list: row r into part r, in the part's shape."""
        if self.flat.__class__ is _ndarray:
            for row, p in zip(self.rows, parts, strict=True):
                p[...] = row.reshape(p.shape)
            return
        with sys.modules["torch"].no_grad():
            for row, p in zip(self.rows, parts, strict=True):
                p.copy_(row if p.shape == row.shape else row.view(p.shape))


class Scratch:
    """A communicator's buffer for the rooted plans whose list is not one buffer: the list
    is copied into it (scatter) or out of it (gather) around the MPI call. It grows as needed
    (kept up to :data:`_SCRATCH_KEPT`); its views are made once per kind of call."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.memory = np.empty(0, np.uint8)
        self.views: dict[Any, _Views] = {}

    def of(self, x: Any, mpi_type: Any) -> _Views:
        """The scratch as world_size arrays like ``x``."""
        key = (x.__class__, x.dtype, x.shape)
        found = self.views.get(key)
        if found is not None:
            return found
        total = x.nbytes * self.world
        if total > _SCRATCH_KEPT:
            return _Views(np.empty(total, np.uint8), x, self.world, mpi_type)
        if total > self.memory.nbytes:
            self.memory = np.empty(max(total, 2 * self.memory.nbytes), np.uint8)
            self.views.clear()
        if len(self.views) >= 64:
            self.views.clear()
        found = self.views[key] = _Views(self.memory[:total], x, self.world, mpi_type)
        return found


def plan(comm: MpiEngine, kind: CallKind) -> Callable[[Any, Any], Any] | None:
    """The plan of ``kind`` on ``comm`` (``run(x, y)``, see
    :meth:`distcomm.backend.engine.Engine.plan`); None: a class or dtype MPI does not
    take as it is, or a tag MPI refuses to users."""
    if kind.op == "barrier":
        barrier = comm._comm.Barrier
        return lambda x, y: barrier()
    x = kind.array
    if x.__class__ is _ndarray:
        if id(x.dtype) not in _DIRECT_IDS:
            return None
        buffer: Callable[[int], Callable[[Any], Any]] = _numpy_buffer
    elif _torch.bind(x.__class__) or x.__class__ is _torch.tensor:
        mpi_type = _torch.types.get(x.dtype)
        if mpi_type is None:
            return None
        buffer = _tensor_buffer(mpi_type)
    else:
        return None
    if kind.tag >= comm._tag_ub - 1:  # the two largest are the kit's (MpiEngine.check_tag)
        return None
    if kind.op in _OUTPUTS:
        out = _OUTPUTS[kind.op](x.nbytes, comm.world_size)
        call = getattr(comm, _OUTPUTS_CALLS[kind.op])
        return _pair(call, buffer(x.nbytes), buffer(out), adapter_for(x).shares_memory)
    make = _PLANS.get(kind.op)
    return None if make is None else make(comm, kind, buffer(x.nbytes))


def _numpy_buffer(nbytes: int) -> Callable[[Any], Any]:
    return _numpy


def _numpy(x: Any) -> Any:
    """A numpy array for MPI, in C order (mpi4py would take a Fortran-ordered one too, in
    memory order; one that is not contiguous it refuses with BufferError). The plans pass an
    array of one dimension as it is, without this call (``as_is``: a call's frame is a
    measurable part of a small message's time)."""
    if x.ndim > 1 and not x.flags.c_contiguous:
        raise NotPlanned
    return x


def _tensor_buffer(mpi_type: Any) -> Callable[[int], Callable[[Any], Any]]:
    """CPU tensors of ``nbytes`` as MPI's buffer at their address, with their type."""

    def buffer(nbytes: int) -> Callable[[Any], Any]:
        def of(x: Any) -> Any:
            if not x.is_cpu or not x.is_contiguous():
                raise NotPlanned
            return [_fromaddress(x.data_ptr(), nbytes), mpi_type]

        return of

    return buffer


def _all_reduce(comm: MpiEngine, kind: CallKind, of: Callable[[Any], Any]) -> Any:
    allreduce = comm._allreduce
    as_is = of is _numpy

    def run(x: Any, y: Any) -> None:
        try:
            allreduce(_IN_PLACE, x if as_is and x.ndim < 2 else of(x), _MPI_SUM)
        except BufferError:  # raised before anything is sent
            raise NotPlanned from None

    return run


def _broadcast(comm: MpiEngine, kind: CallKind, of: Callable[[Any], Any]) -> Any:
    bcast, root = comm._bcast, kind.root
    as_is = of is _numpy

    def run(x: Any, y: Any) -> None:
        try:
            bcast(x if as_is and x.ndim < 2 else of(x), root)
        except BufferError:
            raise NotPlanned from None

    return run


def _reduce(comm: MpiEngine, kind: CallKind, of: Callable[[Any], Any]) -> Any:
    reduce, root = comm._reduce_call, kind.root
    as_is = of is _numpy
    mine = comm.rank == root

    def run(x: Any, y: Any) -> None:
        try:
            if mine:
                reduce(_IN_PLACE, x if as_is and x.ndim < 2 else of(x), _MPI_SUM, root)
            else:
                reduce(x if as_is and x.ndim < 2 else of(x), None, _MPI_SUM, root)
        except BufferError:
            raise NotPlanned from None

    return run


def _pair(
    call: Any,
    of: Callable[[Any], Any],
    of_out: Callable[[Any], Any],
    shares_memory: Callable[[Any, Any], bool],
) -> Callable[[Any, Any], Any]:
    """The plan of ``call(send, recv)`` on two arrays that do not overlap (MPI forbids aliased
    buffers; the pipeline handles a call in place): ``shares_memory``, the kit's adapter's
    test, called only where two numpy arrays that own their memory do not already rule it out
    (a frame less on the common call)."""
    as_is = of is _numpy

    def run(x: Any, y: Any) -> None:
        maybe = not as_is or x is y or x.base is not None or y.base is not None
        if maybe and shares_memory(x, y):
            raise NotPlanned
        try:
            call(x if as_is and x.ndim < 2 else of(x), y if as_is and y.ndim < 2 else of_out(y))
        except BufferError:
            raise NotPlanned from None

    return run


def _rooted(gather: bool) -> Any:
    """gather's or scatter's plan: off the root, the tensor alone; on it, :class:`_Root`."""

    def make(comm: MpiEngine, kind: CallKind, of: Callable[[Any], Any]) -> Any:
        root, as_is = kind.root, of is _numpy
        call = comm._gather_call if gather else comm._scatter_call
        if comm.rank == root:
            return _Root(comm, gather, root).run
        if gather:

            def send(x: Any, y: Any) -> None:
                try:
                    call(x if as_is and x.ndim < 2 else of(x), None, root)
                except BufferError:
                    raise NotPlanned from None

            return send

        def receive(x: Any, y: Any) -> None:
            try:
                call(None, x if as_is and x.ndim < 2 else of(x), root)
            except BufferError:
                raise NotPlanned from None

        return receive

    return make


class _Root:
    """The root's ``Gather`` into its list or ``Scatter`` from it. Where the parts are one
    buffer (consecutive chunks) MPI takes it as it is, the tensor being its own chunk of it
    ``MPI_IN_PLACE``; otherwise (or where the tensor is another part of it: MPI forbids aliased
    buffers) the parts are copied through the communicator's scratch.

    Finding where the parts lie costs more than MPI's call at small sizes, so the buffers of
    the last call are remembered for numpy parts that are views (``big[a:b]``, ``np.split``):
    a view's memory never moves, and the same view objects (weak references) in a list of the
    same identity, with the same tensor (held: an array that owns its memory cannot be resized
    while it is), are the same buffers."""

    __slots__ = ("call", "comm", "gather", "memo", "root")

    def __init__(self, comm: MpiEngine, gather: bool, root: int) -> None:
        self.comm, self.gather, self.root = comm, gather, root
        self.call = comm._gather_call if gather else comm._scatter_call
        self.memo: tuple[Any, int, tuple[Any, ...], tuple[Any, ...]] | None = None

    def run(self, tensor: Any, parts: Any) -> None:
        """The plan (a bound method: Python calls one faster than an object's ``__call__``)."""
        memo = self.memo
        if memo is not None and memo[0] is tensor and memo[1] == id(parts):
            i = 0  # (an index, not zip: a zip object costs 100 ns; the kit checked the length)
            for ref in memo[2]:
                if ref() is not parts[i]:
                    break
                i += 1  # noqa: SIM113 (enumerate costs 35 ns more here)
            else:
                self.call(*memo[3])
                return
        self.memo = None
        args = self._one_buffer(tensor, parts)
        if args is None:
            self._through_scratch(tensor, parts)
            return
        if tensor.__class__ is _ndarray and all(p.base is not None for p in parts):
            self.memo = (tensor, id(parts), tuple(weakref.ref(p) for p in parts), args)
        self.call(*args)

    def _one_buffer(self, tensor: Any, parts: Any) -> tuple[Any, ...] | None:
        """The call's arguments where the parts are one buffer MPI takes as it is, else None."""
        mpi_type, nbytes, root = _mpi_type(tensor), tensor.nbytes, self.root
        mine = None if mpi_type is None or not nbytes else _address(tensor, not self.gather)
        if mine is None:
            raise NotPlanned
        start = _region(parts, nbytes, self.gather)
        if start is None:
            return None
        slot = start + root * nbytes
        if mine != slot and start - nbytes < mine < start + nbytes * len(parts):
            return None  # the tensor is another part: aliased
        whole = [_fromaddress(start, nbytes * len(parts)), mpi_type]
        own = _IN_PLACE if mine == slot else [_fromaddress(mine, nbytes), mpi_type]
        return (own, whole, root) if self.gather else (whole, own, root)

    def _through_scratch(self, tensor: Any, parts: Any) -> None:
        if tensor.__class__ is not _ndarray:
            if not all(p.is_cpu for p in parts):
                raise NotPlanned  # the pipeline copies across devices
        elif self.gather and not all(p.flags.writeable for p in parts):
            raise NotPlanned  # a read-only part: the pipeline refuses it, before anything moves
        mpi_type = _mpi_type(tensor)
        address = _address(tensor, not self.gather)
        if mpi_type is None or address is None:
            raise NotPlanned
        own = [_fromaddress(address, tensor.nbytes), mpi_type]
        scratch = self.comm._scratch.of(tensor, mpi_type)
        if self.gather:
            self.call(own, scratch.buf, self.root)
            scratch.copy_out(parts)
        else:
            scratch.copy_in(parts)
            self.call(scratch.buf, own, self.root)


def _all_to_all_v(comm: MpiEngine, kind: CallKind, of: Callable[[Any], Any]) -> Any:
    """The uneven all-to-all of numpy arrays: ``Alltoallv`` with the counts alone (mpi4py makes
    the packed displacements, in C). A torch tensor's buffer is made for a byte size, which
    varies here: None, the kit calls the engine's ``all_to_all_v``."""
    if of is not _numpy:
        return None
    alltoallv = comm._alltoallv

    def run(x: Any, y: Any) -> None:
        output, output_splits, input_splits = y
        try:
            alltoallv([x, input_splits], [output, output_splits])
        except BufferError:
            raise NotPlanned from None

    return run


def _send(comm: MpiEngine, kind: CallKind, of: Callable[[Any], Any]) -> Any:
    send, dst, tag = comm._send, kind.root, kind.tag
    as_is = of is _numpy

    def run(x: Any, y: Any) -> None:
        try:
            send(x if as_is and x.ndim < 2 else of(x), dst, tag)
        except BufferError:
            raise NotPlanned from None

    return run


def _recv(comm: MpiEngine, kind: CallKind, of: Callable[[Any], Any]) -> Any:
    recv, src, tag = comm._recv, kind.root, kind.tag
    as_is = of is _numpy
    if src is not None:

        def run(x: Any, y: Any) -> None:
            try:
                recv(x if as_is and x.ndim < 2 else of(x), src, tag)
            except BufferError:
                raise NotPlanned from None

        return run

    def run_any(x: Any, y: Any) -> int:
        status = MPI.Status()
        try:
            recv(x if as_is and x.ndim < 2 else of(x), _ANY_SOURCE, tag, status)
        except BufferError:
            raise NotPlanned from None
        return int(status.Get_source())

    return run_any


#: The ops with an output: its byte size for an input of ``n`` bytes, and the call.
_OUTPUTS: dict[str, Callable[[int, int], int]] = {
    "all_gather_into_tensor": lambda n, world: n * world,
    "reduce_scatter_tensor": lambda n, world: n // world,
    "all_to_all_single": lambda n, world: n,
}
_OUTPUTS_CALLS = {
    "all_gather_into_tensor": "_allgather",
    "reduce_scatter_tensor": "_reduce_scatter_block",  # its op defaults to SUM
    "all_to_all_single": "_alltoall",
}
_PLANS: dict[
    str, Callable[[MpiEngine, CallKind, Callable[[Any], Any]], Callable[[Any, Any], Any] | None]
] = {
    "all_reduce": _all_reduce,
    "broadcast": _broadcast,
    "reduce": _reduce,
    "gather": _rooted(True),
    "scatter": _rooted(False),
    "all_to_all_v": _all_to_all_v,
    "send": _send,
    "recv": _recv,
}
