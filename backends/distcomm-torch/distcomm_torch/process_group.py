"""torch's process group over a distcomm communicator: the torch backend named ``"distcomm"``.

``distcomm.init(torch_group="distcomm")`` (or ``DISTCOMM_TORCH_GROUP=distcomm``) makes torch's
default process group a :class:`DistcommProcessGroup` over distcomm's world communicator,
whatever its engine (mpi, zmq, a plugin's): DDP's gradient buckets, FSDP's shards, DeviceMesh's
groups and ``torch.distributed``'s calls then run through the communicator's plans, hooks, checks
and flight recorder. A mismatch raises distcomm's ``CollectiveMismatchError`` through torch, a
missing rank its ``DistTimeoutError``.

After ``distcomm.init()``, :func:`install` has registered ``"distcomm"`` with torch (when the
program had imported torch), so a program may also call
``torch.distributed.init_process_group("distcomm")`` itself where no default group exists yet.

A collective runs when torch issues it, in the calling thread. An all-reduce (DDP's buckets)
on an engine whose Work has a future of its own (gloo's) starts there and completes with that
future, so that DDP's backward goes on meanwhile; every other collective, and all of them on
engines without one (mpi, zmq: their blocking plans), has its result in place when torch gets
its work. A point-to-point operation starts there and completes at ``wait()`` (a ring of isend
then recv does not deadlock). torch's ``new_group`` (every rank calls it) is delegated to
:meth:`DistcommProcessGroup.new_group`: the group is the communicator's ``new_group``, made
over distcomm's engine.

Tensors must be on a device the engine moves (``comm.devices``, CPU for mpi and zmq): a CUDA
tensor on a CPU engine raises with the engine and the fix named.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future

from distcomm import DistcommError, InvalidArgumentError
from distcomm.backend import free_port
from distcomm.protocol import Communicator, NonMember, ReduceOp, Work

__all__ = [
    "NAME",
    "DistcommProcessGroup",
    "TorchDefaultGroup",
    "begin",
    "install",
    "make",
    "torch_makes_groups",
]

#: The backend's name in torch (``init_process_group(backend=NAME)``).
NAME = "distcomm"


class _Done(dist.Work):  # type: ignore[misc]
    """The work of a collective that already ran: its result in a completed future."""

    def __init__(self, result: Any) -> None:
        super().__init__()
        self._future: Future[Any] = Future()
        self._future.set_result(result)

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def get_future(self) -> Future[Any]:
        return self._future


class _Started(dist.Work):  # type: ignore[misc]
    """The work of an operation started on the communicator (``async_op=True``).

    With the engine's future (:meth:`~distcomm.backend.BaseWork.engine_future`: torch's, on
    gloo), the future torch gets completes when the engine's does, distcomm's Work waited for
    in the engine's thread (its errors, its timeout's diagnosis): DDP's backward goes on while
    its buckets travel. Without one (a point-to-point message), ``wait`` waits for distcomm's
    Work, then completes the future.
    """

    def __init__(self, work: Work, result: Any, engine_future: Any = None) -> None:
        super().__init__()
        self._work = work
        self._result = result
        self._chained = engine_future is not None
        self._future: Future[Any] = engine_future.then(self._finish) if self._chained else Future()

    def _finish(self, _: Any) -> Any:
        # the engine's future is done, so distcomm's Work is: its result in place (a copy back,
        # an emulated op's last step), or the engine's error raised as distcomm's
        # (in the engine's thread, whose autograd records by default: a copy back must not)
        with torch.no_grad():
            completed = self._work.is_completed()
        assert completed, "an engine's future is done only once its operation is"
        return self._result

    def wait(self, timeout: Any = None) -> bool:
        if self._chained:
            self._future.wait()
            return True
        if isinstance(timeout, datetime.timedelta) and timeout.total_seconds() > 0:
            self._work.wait(timeout)
        else:
            self._work.wait()
        if not self._future.done():
            self._future.set_result(self._result)
        return True

    def is_completed(self) -> bool:
        if self._chained:
            return bool(self._future.done())
        return bool(self._work.is_completed())

    def is_success(self) -> bool:
        return self.is_completed()

    def get_future(self) -> Future[Any]:
        return self._future

    def _source_rank(self) -> int:
        return int(getattr(self._work, "source", -1))


def _op(opts: Any) -> ReduceOp:
    """distcomm's op of torch's options (their ``reduceOp`` wraps a ``RedOpType``), or of a
    ``ReduceOp`` given as is (``pg.allreduce([t], ReduceOp.MAX)``); None: SUM."""
    op = getattr(opts, "reduceOp", opts)
    return ReduceOp.SUM if op is None else ReduceOp.coerce(getattr(op, "op", op))


def _root(opts: Any) -> int:
    """The root of torch's options, or a root given as is (``pg.broadcast(t, 0)``)."""
    return int(opts) if isinstance(opts, int) else int(opts.rootRank)


def _listed(x: Any) -> list[Any]:
    """A tensor as a list of one (torch's one-tensor forms: ``pg.allreduce(t)``), else a list."""
    return [x] if isinstance(x, torch.Tensor) else list(x)


def _each(tensors: Any) -> Iterator[torch.Tensor]:
    """Every tensor of an argument: a tensor, a list, or a list of lists."""
    if isinstance(tensors, torch.Tensor):
        yield tensors
    else:
        for item in tensors:
            yield from _each(item)


class DistcommProcessGroup(dist.ProcessGroup):  # type: ignore[misc]
    """torch's process group whose operations are ``comm``'s (ranks are ``comm``'s ranks).

    Made unbound (``comm`` None) by :func:`begin`, on a torch engine, whose own group is made
    after torch's default group; :meth:`bind` gives it the communicator.
    """

    def __init__(self, rank: int, size: int, name: str = "", desc: str = "") -> None:
        super().__init__(rank, size)
        #: The communicator every operation runs on (None until :meth:`bind`).
        self.comm: Communicator = None  # type: ignore[assignment]
        self._name = name
        self._desc = desc

    @classmethod
    def over(cls, comm: Communicator, name: str = "", desc: str = "") -> DistcommProcessGroup:
        """The group over ``comm``."""
        group = cls(comm.rank, comm.world_size, name, desc)
        group.bind(comm)
        return group

    def bind(self, comm: Communicator) -> None:
        """Run this group's operations on ``comm`` (of this group's rank and size)."""
        if (comm.rank, comm.world_size) != (self.rank(), self.size()):
            raise InvalidArgumentError(
                f"torch's group (rank {self.rank()} of {self.size()}) cannot run on {comm!r} "
                f"(rank {comm.rank} of {comm.world_size}). HINT: make them of one world."
            )
        self.comm = comm
        #: Whether all-reduces start, completing with the engine's future (until one had none).
        self._futures = True

    def getBackendName(self) -> str:
        return NAME

    # torch keeps a group's name in its C++ backends, which a Python group has none of:
    # DeviceMesh and the functional collectives find groups by these names.
    @property
    def group_name(self) -> str:
        return self._name

    @property
    def group_desc(self) -> str:
        return self._desc

    def _set_group_name(self, name: str) -> None:
        self._name = name

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc

    @property
    def supports_splitting(self) -> bool:
        return False

    def _check(self, op: str, *arguments: Any) -> None:
        """A tensor (input or output) the engine cannot move is refused before any rank waits
        for it."""
        devices = getattr(self.comm, "devices", frozenset({"cpu"}))
        for tensor in _each(arguments):
            kind = tensor.device.type
            if kind not in devices and str(tensor.device) not in devices:
                raise InvalidArgumentError(
                    f"torch.distributed {op}: a tensor on {tensor.device} reached the "
                    f"'distcomm' process group, whose engine ({self.comm.backend}) moves "
                    f"{sorted(devices)} memory. HINT: move the tensor to the CPU, or "
                    "init(backend='nccl') for CUDA tensors (torch_group='auto')."
                )

    # -- collectives -------------------------------------------------------------------------

    def _all_reduce(self, tensor: torch.Tensor, op: ReduceOp, result: Any) -> dist.Work:
        """Started, with a work that completes with the engine's future, where the engine's
        Work has one (gloo: DDP's buckets overlap its backward); else blocking (mpi, zmq: the
        engine's blocking plans), once a call found none.

        Only all-reduces run so: the others block, their result in place when torch gets their
        work (functional collectives and DTensor build views on it: a copy back that came later
        would change a view they already returned)."""
        if not self._futures:
            self.comm.all_reduce(tensor, op=op)
            return _Done(result)
        work = self.comm.all_reduce(tensor, op=op, async_op=True)
        offered = getattr(work, "engine_future", None)  # the kit's Works have it
        future = None if offered is None else offered()
        if future is None:
            self._futures = False
            work.wait()
            return _Done(result)
        return _Started(work, result, future)

    # Each takes torch's forms too: a tensor for a list of one, a ReduceOp or a root for the
    # options (``pg.allreduce(t)``: DDP's Join; ``pg.broadcast(t, 0)``; ``pg.reduce(t, 0, op)``).

    def allreduce(self, tensors: Any, opts: Any = None) -> dist.Work:
        tensors = _listed(tensors)
        self._check("all_reduce", tensors)
        if len(tensors) == 1:
            return self._all_reduce(tensors[0], _op(opts), tensors)
        self.comm.all_reduce_coalesced(tensors, op=_op(opts))
        return _Done(tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> _Done:
        self._check("all_reduce_coalesced", tensors)
        self.comm.all_reduce_coalesced(tensors, op=_op(opts))
        return _Done(tensors)

    def broadcast(self, tensors: Any, opts: Any = None) -> _Done:
        tensors = _listed(tensors)
        self._check("broadcast", tensors)
        for tensor in tensors:
            self.comm.broadcast(tensor, src=_root(opts))
        return _Done(tensors)

    def reduce(self, tensors: Any, opts: Any = None, op: Any = None) -> _Done:
        tensors = _listed(tensors)
        self._check("reduce", tensors)
        reduce_op = _op(opts if op is None and not isinstance(opts, int) else op)
        for tensor in tensors:
            self.comm.reduce(tensor, dst=_root(opts), op=reduce_op)
        return _Done(tensors)

    def allgather(self, outputs: Any, inputs: Any, opts: Any = None) -> _Done:
        if isinstance(inputs, torch.Tensor):  # torch's form: (a list of outputs, an input)
            outputs, inputs = [outputs], [inputs]
        self._check("all_gather", outputs, inputs)
        for out, tensor in zip(outputs, inputs, strict=True):
            self.comm.all_gather(out, tensor)
        return _Done(outputs)

    def allgather_coalesced(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None
    ) -> _Done:
        return self.allgather(outputs, inputs, opts)

    def all_gather_single(
        self, output: torch.Tensor, tensor: torch.Tensor, opts: Any = None
    ) -> _Done:
        self._check("all_gather_into_tensor", output, tensor)
        self.comm.all_gather_into_tensor(output, tensor)
        return _Done(output)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> _Done:
        return self._pairs(self.all_gather_single, outputs, inputs, opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, outputs: Any, inputs: Any, opts: Any = None) -> _Done:
        if isinstance(outputs, torch.Tensor):  # torch's form: (an output, a list of inputs)
            outputs, inputs = [outputs], [inputs]
        self._check("reduce_scatter", outputs, inputs)
        for out, parts in zip(outputs, inputs, strict=True):
            self.comm.reduce_scatter(out, parts, op=_op(opts))
        return _Done(outputs)

    def reduce_scatter_single(
        self, output: torch.Tensor, tensor: torch.Tensor, opts: Any = None
    ) -> _Done:
        self._check("reduce_scatter_tensor", output, tensor)
        self.comm.reduce_scatter_tensor(output, tensor, op=_op(opts))
        return _Done(output)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> _Done:
        return self._pairs(self.reduce_scatter_single, outputs, inputs, opts)

    @staticmethod
    def _pairs(
        one: Callable[..., Any], outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any
    ) -> _Done:
        """A coalesced call as one call per (output, input) pair, in order."""
        for output, tensor in zip(outputs, inputs, strict=True):
            one(output, tensor, opts)
        return _Done(outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def all_to_all_single(
        self,
        output: torch.Tensor,
        tensor: torch.Tensor,
        output_splits: list[int],
        input_splits: list[int],
        opts: Any = None,
    ) -> _Done:
        self._check("all_to_all_single", output, tensor)
        self.comm.all_to_all_single(output, tensor, output_splits or None, input_splits or None)
        return _Done(output)

    alltoall_base = all_to_all_single

    def alltoall(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> _Done:
        self._check("all_to_all", outputs, inputs)
        self.comm.all_to_all(outputs, inputs)
        return _Done(outputs)

    def gather(self, outputs: Any, inputs: Any, opts: Any = None) -> _Done:
        if isinstance(inputs, torch.Tensor):  # torch's form: (a list of outputs, an input, root)
            outputs, inputs = [outputs], [inputs]
        self._check("gather", outputs, inputs)
        root = _root(opts)
        self.comm.gather(inputs[0], outputs[0] if self.comm.rank == root else None, dst=root)
        return _Done(outputs)

    def scatter(self, outputs: Any, inputs: Any, opts: Any = None) -> _Done:
        if isinstance(outputs, torch.Tensor):  # torch's form: (an output, a list of inputs, root)
            outputs, inputs = [outputs], [inputs]
        self._check("scatter", outputs, inputs)
        root = _root(opts)
        self.comm.scatter(outputs[0], inputs[0] if self.comm.rank == root else None, src=root)
        return _Done(outputs)

    def barrier(self, opts: Any = None) -> _Done:
        self.comm.barrier()
        return _Done(None)

    # -- point to point ----------------------------------------------------------------------

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> _Started:
        self._check("send", tensors)
        (tensor,) = tensors
        return _Started(self.comm.isend(tensor, dst, tag), tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> _Started:
        self._check("recv", tensors)
        (tensor,) = tensors
        return _Started(self.comm.irecv(tensor, src, tag), tensors)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> _Started:
        self._check("recv", tensors)
        (tensor,) = tensors
        return _Started(self.comm.irecv(tensor, None, tag), tensors)

    # -- groups ------------------------------------------------------------------------------

    @property
    def new_group(self) -> Any:
        """torch delegates ``new_group`` to a default group that has one; not while distcomm's
        torch engine makes its own groups (:func:`torch_makes_groups`), nor before
        :meth:`bind`: torch makes those itself."""
        if self.comm is None or _torch_makes:
            raise AttributeError("new_group")
        return self._new_group

    def _new_group(
        self,
        ranks: Sequence[int],
        timeout: Any = None,
        pg_options: Any = None,
        group_name: str | None = None,
        group_desc: str | None = None,
    ) -> DistcommProcessGroup | None:
        """torch's ``new_group`` (called on every rank of the world): a group over the
        communicator's ``new_group`` of ``ranks``, named as torch names it (DeviceMesh finds
        its groups by name); None on the ranks outside it.

        Raises:
            InvalidArgumentError: the ranks passed differ between ranks (torch's
                ``use_local_synchronization=True``, where each group's members alone call it).
        """
        try:
            made = self.comm.new_group(list(ranks))
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(
                f"torch.distributed.new_group over distcomm: {exc} torch's groups over distcomm "
                "are made by every rank of the world, with the same ranks: "
                "use_local_synchronization=True (each group's members calling it alone) is not "
                "supported. HINT: call new_group(ranks) with the same ranks on every rank, or "
                "new_subgroups() / new_subgroups_by_enumeration() for disjoint groups."
            ) from exc
        if isinstance(made, NonMember):
            return None
        return DistcommProcessGroup.over(made, group_name or "", group_desc or "")


#: Open :func:`torch_makes_groups` blocks.
_torch_makes: list[None] = []


@contextlib.contextmanager
def torch_makes_groups() -> Iterator[None]:
    """Meanwhile ``torch.distributed.new_group`` makes torch's own groups (a gloo engine's),
    not groups over distcomm."""
    _torch_makes.append(None)
    try:
        yield
    finally:
        _torch_makes.pop()


class TorchDefaultGroup:
    """torch's default process group made by :func:`make`; ``finalize`` destroys it."""

    def __init__(self, group: DistcommProcessGroup, address: Any = None) -> None:
        #: torch's default group (``torch.distributed.group.WORLD``).
        self.group = group
        #: Where its store is served (host, port); None for a HashStore or the engine's store.
        self.address: tuple[str, int] | None = None if address is None else tuple(address)

    def finalize(self) -> None:
        """Destroy torch's default group (and its subgroups) if it is still this one."""
        if dist.is_initialized() and dist.group.WORLD is self.group:
            dist.destroy_process_group()


def install() -> None:
    """Register ``"distcomm"`` with torch.distributed (once): a default group made by
    ``init_process_group("distcomm")`` runs on distcomm's world communicator."""
    if NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu"])


#: The communicator :func:`make` is making torch's default group over (while it does; None:
#: :func:`begin`'s, bound later).
_making: list[Communicator | None] = []


def _create(options: Any, backend_options: Any = None) -> DistcommProcessGroup:
    """torch's creator of the default group (``init_process_group("distcomm")``): over the
    communicator :func:`make` is making it for, else distcomm's default communicator."""
    import distcomm

    name = str(options.group_id)
    rank, world_size = options.group_rank, options.group_size
    if _making:
        comm = _making[-1]
        if comm is None:
            return DistcommProcessGroup(rank, world_size, name, "default_pg")
        return DistcommProcessGroup.over(comm, name, "default_pg")
    if not distcomm.is_initialized():
        raise DistcommError(
            "init_process_group('distcomm') runs torch's groups on distcomm's communicator, "
            "but distcomm is not initialised. HINT: call distcomm.init() first, or "
            "distcomm.init(torch_group='distcomm'), which makes the group itself."
        )
    comm = distcomm.get_communicator()
    if (rank, world_size) != (comm.rank, comm.world_size):
        raise InvalidArgumentError(
            f"init_process_group('distcomm', rank={rank}, world_size={world_size}) disagrees "
            f"with distcomm's world (rank {comm.rank} of {comm.world_size}). HINT: pass no "
            "rank or world_size (distcomm's are used), or make them equal."
        )
    if comm.launch.method == "threads" and comm.world_size > 1:
        raise InvalidArgumentError(
            "init_process_group('distcomm') inside run_threads: its ranks are threads of one "
            "process, and torch has one default process group a process. HINT: run the ranks "
            "as processes (distcomm run -n N, mpirun -n N)."
        )
    return DistcommProcessGroup.over(comm, name, "default_pg")


def begin(store: Any, rank: int, world_size: int, timeout: datetime.timedelta) -> None:
    """Make torch's default group a :class:`DistcommProcessGroup` not bound yet, so that a
    torch engine makes its own group beside it; :func:`make` binds it to the communicator
    made over that group."""
    install()
    _making.append(None)
    try:
        dist.init_process_group(
            NAME, store=store, rank=rank, world_size=world_size, timeout=timeout
        )
    finally:
        _making.pop()


def make(
    comm: Communicator, host: str | None, share: Callable[[Any], Any], timeout: float
) -> TorchDefaultGroup:
    """Make torch's default process group a :class:`DistcommProcessGroup` over ``comm``.

    torch's default group keeps a store, for code that reads it (``_get_default_store``): a
    TCPStore that rank 0 serves at ``host`` on a free port that ``share`` (rank 0's value on
    every rank, over ``comm``) tells the others, met as the gloo backend meets its own
    (:func:`distcomm_torch.rendezvous.open_store`: loopback only for a one-node job, the
    others waiting for rank 0's server, each rank claimed once). ``host`` None (a world of 1):
    a HashStore.

    Returns:
        A :class:`TorchDefaultGroup`, whose ``finalize`` destroys the group.
    """
    install()
    group = dist.group.WORLD if dist.is_initialized() else None
    if isinstance(group, DistcommProcessGroup) and group.comm is None:  # begin()'s
        group.bind(comm)
        return TorchDefaultGroup(group)
    if group is not None:
        raise InvalidArgumentError(
            f"torch's default process group ({dist.get_backend()}) exists already, so it cannot "
            f"run over {comm.backend}. HINT: torch_group='auto' uses it as it is; or call "
            "torch.distributed.destroy_process_group() before distcomm.init()."
        )
    span = datetime.timedelta(seconds=min(timeout, 10**8))
    store: Any = None
    address = None
    if host is None:
        store = dist.HashStore()  # type: ignore[attr-defined]
    else:
        from distcomm_torch import rendezvous  # it imports the engines

        address = share((host, free_port(host)) if comm.rank == 0 else None)
        store = rendezvous.open_store(NAME, comm.launch, address[0], address[1], timeout)
        if comm.rank == 0:  # a slow rank must find the server still there
            where = f"{address[0]}:{address[1]}"
            rendezvous.wait_for_all(NAME, comm.launch, store, where, timeout)
    _making.append(comm)
    try:
        dist.init_process_group(
            NAME, store=store, rank=comm.rank, world_size=comm.world_size, timeout=span
        )
    finally:
        _making.pop()
    group = dist.group.WORLD
    assert isinstance(group, DistcommProcessGroup), "torch made the group with our creator"
    return TorchDefaultGroup(group, address)
