"""The torch backends' plans (:meth:`TorchEngine.plan
<distcomm_torch.communicator.TorchEngine.plan>`): for a kind of blocking call the kit took once,
the group's own method on the caller's memory, its Work waited for as the pipeline waits for the
engine's (a :class:`~distcomm_torch.communicator.TorchRequest`: the group's timeout, distcomm's
errors), without the kit's EngineWork or torch's wrapper. A plan is made from the engine and
reads its communicator (``engine.comm``: ranks, capabilities, devices, ``op`` and ``seq``).

What is bound once per kind: the group's method (an older torch names the one-tensor gather,
reduce-scatter and all-to-all ``_allgather_base``, ``_reduce_scatter_base`` and
``alltoall_base``), torch's options (a SUM, the root as torch's group rank), a message's peer as
torch's group rank and its tag, and how an array of the kind's class and dtype reaches torch: a
torch tensor as it is, a numpy array as a view of its memory (``torch.from_numpy``, as
:func:`~distcomm.backend.as_torch` makes). A kind of a class or dtype torch does not take as it
is (bool for a SUM: its sum is an OR) has no plan. What is left for each call is whether torch
takes its arrays as they are: contiguous, on the device the group moves, not overlapping (an
output and its input; a root's list and its tensor; a gather's parts); else the plan raises
NotPlanned, having moved nothing, and the pipeline stages the call.

Messages are planned on gloo only (CPU memory): NCCL's messages, on the group's streams, go
through the pipeline.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed import (
    AllreduceOptions,
    AllToAllOptions,
    BroadcastOptions,
    GatherOptions,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
)
from torch.distributed.distributed_c10d import AllgatherOptions  # type: ignore[attr-defined]

from distcomm.backend import BaseCommunicator, CallKind, NotPlanned
from distcomm.backend.work import retained

if TYPE_CHECKING:
    from distcomm_torch.communicator import TorchEngine

__all__ = ["plan"]

Run = Callable[[Any, Any], Any]
#: How a call's array reaches torch: the tensor torch moves, or NotPlanned.
Of = Callable[[Any], torch.Tensor]


def _numpy_arrays() -> Any:
    """numpy's array class, or None without numpy (torch runs without it)."""
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy is there wherever distcomm's tests run
        return None
    return numpy.ndarray


# The plans' constants, bound once (an attribute lookup per call is measurable there).
_ndarray = _numpy_arrays()
_Tensor, _from_numpy, _SUM = torch.Tensor, torch.from_numpy, dist.ReduceOp.SUM
_EVEN: list[int] = []  # all_to_all's split sizes: even chunks
_NO_INPUTS: list[Any] = []  # scatter's inputs off the root


@functools.cache
def _torch_dtypes(names: frozenset[str]) -> frozenset[torch.dtype]:
    """The torch dtypes of distcomm's dtype ``names`` (a set a dtype is looked up in at once)."""
    return frozenset(getattr(torch, name) for name in names)


def _options(kind: Any, **fields: Any) -> Any:
    """torch's options ``kind`` of a plan, with ``fields``: asynchronous as the pipeline's
    calls (on nccl the collective runs on the group's stream and ``wait`` orders the current
    stream after it; an older torch has no ``asyncOp``). Made once: torch copies it."""
    opts = kind()
    if hasattr(opts, "asyncOp"):
        opts.asyncOp = True
    for name, value in fields.items():
        setattr(opts, name, value)
    return opts


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether tensors ``a`` and ``b`` share memory (on the same device)."""
    start, other = a.data_ptr(), b.data_ptr()
    return other < start + a.nbytes and start < other + b.nbytes


def _disjoint(tensors: list[torch.Tensor], nbytes: int) -> bool:
    """Whether ``tensors`` of ``nbytes`` bytes each (contiguous) share no memory."""
    starts = sorted(t.data_ptr() for t in tensors)
    return all(b - a >= nbytes for a, b in pairwise(starts))


def plan(engine: TorchEngine, kind: CallKind) -> Run | None:
    """The plan of ``kind`` on ``engine`` (``run(x, y)``, see
    :meth:`distcomm.backend.engine.Engine.plan`); None: a class or dtype torch does not take as
    it is, a message on a group that does not move CPU memory, or a receive from any rank where
    the engine has none, an op it has no plan of (the barrier: the kit's)."""
    if kind.op not in _PLANS:
        return None
    # the dtypes the engine moves natively (the kit asks for reductions of dtypes summed as is)
    names = engine.comm.capabilities.dtypes
    of = _converter(engine, kind.array, _torch_dtypes(names))
    if of is None:
        return None
    return _PLANS[kind.op](engine, kind, of)


def _converter(engine: TorchEngine, x: Any, dtypes: frozenset[torch.dtype]) -> Of | None:
    """How an array like ``x`` (its class and dtype) reaches torch as it is: a torch tensor
    (that class exactly) contiguous on the device the group moves (the pipeline's
    ``adapter.is_plain``), or a numpy array, C-contiguous, as a view of its memory, where the
    group moves CPU memory; None where no array like ``x`` does (another class, a dtype not of
    ``dtypes`` or that torch lacks, a byte order not native)."""
    comm = engine.comm
    cpu = "cpu" in comm.devices
    cls = x.__class__
    if cls is _Tensor:
        if x.dtype not in dtypes:
            return None
        devices, bound = comm.devices, comm.bound_device

        def tensor(t: torch.Tensor) -> torch.Tensor:
            if not t.is_contiguous():
                raise NotPlanned
            if t.is_cpu:  # is_cpu is several times faster than .device
                if cpu:
                    return t
                raise NotPlanned
            on = t.device
            if on.type in devices and bound in (None, str(on)):
                return t
            raise NotPlanned

        return tensor
    if _ndarray is None or cls is not _ndarray or not cpu:
        return None
    import numpy

    try:
        dtype = _from_numpy(numpy.empty(0, x.dtype)).dtype
    except (TypeError, ValueError):  # a dtype torch lacks, a byte order not native
        return None
    if dtype not in dtypes:
        return None

    def array(a: Any) -> torch.Tensor:
        flags = a.flags  # (read-only memory: the pipeline refuses an output in it)
        if not flags.c_contiguous or not flags.writeable:
            raise NotPlanned
        try:
            return _from_numpy(a)
        except (TypeError, ValueError):
            raise NotPlanned from None

    return array


def _flat(t: torch.Tensor) -> torch.Tensor:
    """1-D, as the pipeline's (flat): torch wants the input's dims to divide the output's."""
    return t if t.dim() == 1 else t.view(-1)


def _waited(comm: BaseCommunicator, start: Callable[..., Any], *args: Any) -> None:
    """``start(*args)``, a collective of the group, waited for as the pipeline waits for its
    Work (:meth:`TorchRequest.block <distcomm_torch.communicator.TorchRequest.block>`, the
    group's timeout): torch's errors become distcomm's (a timeout, the engine's ``timeout_of``,
    ``comm``'s DistTimeoutError naming the ranks that had not arrived; another failure
    EngineError), and the tensors of a call that did not complete are kept
    (:func:`~distcomm.backend.work.retained`): torch may still write into them. The kit has set
    the call's ``op`` and ``seq`` on ``comm``."""
    try:
        start(*args).wait()
    except BaseException as exc:  # a Ctrl-C too, as BaseWork.wait
        retained().append(args)
        if isinstance(exc, RuntimeError):  # torch's DistBackendError, DistNetworkError, ...
            raise comm.engine_failed(comm.op, comm.seq, exc) from exc
        raise


def _message(
    comm: BaseCommunicator, start: Callable[..., Any], args: tuple[Any, ...], label: str
) -> Any:
    """``start(*args)``, a message of the group, waited for as :func:`_waited` waits for a
    collective; its Work. torch's errors become distcomm's naming the message as the pipeline's
    Work names it (``label``, e.g. "recv from any rank (tag 3)"): a timeout the communicator's
    DistTimeoutError, another failure EngineError; the tensors of a message that did not
    complete are kept."""
    try:
        work = start(*args)
        work.wait()
    except BaseException as exc:  # a Ctrl-C too, as BaseWork.wait
        retained().append(args)
        if isinstance(exc, RuntimeError):
            raise comm.engine_failed(label, None, exc) from exc
        raise
    return work


def _group_rank(engine: TorchEngine, rank: int) -> int:
    """Torch's group rank of rank ``rank`` of ``engine``'s communicator, as the engine's calls
    map it."""
    world_rank = engine.comm.global_ranks[rank]
    if engine._group is None:
        return world_rank
    return int(dist.get_group_rank(engine.native, world_rank))


# -- collectives ------------------------------------------------------------------------------
def _all_reduce(engine: TorchEngine, kind: CallKind, of: Of) -> Run:
    comm = engine.comm
    allreduce, opts = engine.native.allreduce, _options(AllreduceOptions, reduceOp=_SUM)

    def run(x: Any, y: Any) -> None:
        _waited(comm, allreduce, [of(x)], opts)

    return run


def _broadcast(engine: TorchEngine, kind: CallKind, of: Of) -> Run:
    assert kind.root is not None
    comm, root = engine.comm, _group_rank(engine, kind.root)
    broadcast = engine.native.broadcast
    opts = _options(BroadcastOptions, rootRank=root, rootTensor=0)

    def run(x: Any, y: Any) -> None:
        _waited(comm, broadcast, [of(x)], opts)

    return run


def _reduce(engine: TorchEngine, kind: CallKind, of: Of) -> Run:
    assert kind.root is not None
    comm, root = engine.comm, _group_rank(engine, kind.root)
    reduce = engine.native.reduce
    opts = _options(ReduceOptions, rootRank=root, rootTensor=0, reduceOp=_SUM)

    def run(x: Any, y: Any) -> None:
        _waited(comm, reduce, [of(x)], opts)

    return run


def _paired(engine: TorchEngine, of: Of, start: Callable[..., Any], *extra: Any) -> Run:
    """The plan of ``start(output, input, *extra)``, a collective with an output: both flat,
    and not overlapping (the pipeline handles a call in place)."""
    comm = engine.comm

    def run(x: Any, y: Any) -> None:
        out, inp = of(y), of(x)
        if _overlap(out, inp):
            raise NotPlanned
        _waited(comm, start, _flat(out), _flat(inp), *extra)

    return run


def _all_gather_into(engine: TorchEngine, kind: CallKind, of: Of) -> Run:
    pg = engine.native
    start = getattr(pg, "all_gather_single", None) or pg._allgather_base
    return _paired(engine, of, start, _options(AllgatherOptions))


def _reduce_scatter(engine: TorchEngine, kind: CallKind, of: Of) -> Run:
    pg = engine.native
    start = getattr(pg, "reduce_scatter_single", None) or pg._reduce_scatter_base
    return _paired(engine, of, start, _options(ReduceScatterOptions, reduceOp=_SUM))


def _all_to_all(engine: TorchEngine, kind: CallKind, of: Of) -> Run:
    pg = engine.native
    start = getattr(pg, "all_to_all_single", None) or pg.alltoall_base
    return _paired(engine, of, start, _EVEN, _EVEN, _options(AllToAllOptions))


def _parts(of: Of, t: torch.Tensor, parts: Any, written: bool) -> tuple[Any, list[Any]]:
    """The root's list of a rooted call (world_size arrays like ``t``: the kit checked) and
    ``t`` as torch takes them: each part as ``of`` makes it, none sharing memory with ``t``,
    nor (``written``: a gather's) with another part (the pipeline handles those); all 1-D
    where the parts' shapes differ from ``t``'s (torch wants one shape). NotPlanned where a
    part is not taken as it is."""
    taken = [of(p) for p in parts]
    if any(_overlap(q, t) for q in taken):
        raise NotPlanned
    if written and not _disjoint(taken, t.nbytes):
        raise NotPlanned
    shape = t.shape
    if all(q.shape == shape for q in taken):
        return t, taken
    return t.view(-1), [q.view(-1) for q in taken]


def _gather(engine: TorchEngine, kind: CallKind, of: Of) -> Run:
    assert kind.root is not None
    comm, pg = engine.comm, engine.native
    gather, opts = pg.gather, _options(GatherOptions, rootRank=_group_rank(engine, kind.root))
    if comm.rank != kind.root:
        #: the outputs off the root: none, or one empty list where torch's calls go to
        #: torchcomms (its gather wants one entry on every rank), as ``dist.gather`` passes.
        uses_torchcomms = getattr(dist.distributed_c10d, "_use_torchcomms_enabled", None)
        outputs: list[Any] = [[]] if uses_torchcomms and uses_torchcomms() else []

        def off_root(x: Any, y: Any) -> None:
            _waited(comm, gather, outputs, [of(x)], opts)

        return off_root

    def root(x: Any, y: Any) -> None:
        t, parts = _parts(of, of(x), y, True)
        _waited(comm, gather, [parts], [t], opts)

    return root


def _scatter(engine: TorchEngine, kind: CallKind, of: Of) -> Run:
    assert kind.root is not None
    comm, pg = engine.comm, engine.native
    scatter, opts = pg.scatter, _options(ScatterOptions, rootRank=_group_rank(engine, kind.root))
    if comm.rank != kind.root:

        def off_root(x: Any, y: Any) -> None:
            _waited(comm, scatter, [of(x)], _NO_INPUTS, opts)

        return off_root

    def root(x: Any, y: Any) -> None:
        t, parts = _parts(of, of(x), y, False)
        _waited(comm, scatter, [t], [parts], opts)

    return root


# -- messages ---------------------------------------------------------------------------------
# The kit has checked the rank and the tag. The group's own send, recv or recv_anysource runs,
# and torch's Work is waited for as the pipeline waits for the engine's (:func:`_message`).
def _send(engine: TorchEngine, kind: CallKind, of: Of) -> Run | None:
    comm = engine.comm
    if "cpu" not in comm.devices or kind.root is None:
        return None
    send, tag, label = engine.native.send, kind.tag, f"send to rank {kind.root} (tag {kind.tag})"
    peer = _group_rank(engine, kind.root)

    def run(x: Any, y: Any) -> None:
        _message(comm, send, ([of(x)], peer, tag), label)

    return run


def _recv(engine: TorchEngine, kind: CallKind, of: Of) -> Run | None:
    comm = engine.comm
    if "cpu" not in comm.devices:
        return None
    pg, src, tag = engine.native, kind.root, kind.tag
    if src is not None:
        recv, peer, label = pg.recv, _group_rank(engine, src), f"recv from rank {src} (tag {tag})"

        def run(x: Any, y: Any) -> int:
            _message(comm, recv, ([of(x)], peer, tag), label)
            return src

        return run
    if not comm.capabilities.any_source:  # the pipeline refuses it, saying why
        return None
    recv_any, label = pg.recv_anysource, f"recv from any rank (tag {tag})"
    #: torch's group rank of each rank of the communicator -> that rank
    senders = {_group_rank(engine, r): r for r in range(comm.world_size)}

    def run_any(x: Any, y: Any) -> int:
        work = _message(comm, recv_any, ([of(x)], tag), label)
        return senders[int(work._source_rank())]

    return run_any


_PLANS: dict[str, Callable[[TorchEngine, CallKind, Of], Run | None]] = {
    "all_reduce": _all_reduce,
    "broadcast": _broadcast,
    "reduce": _reduce,
    "all_gather_into_tensor": _all_gather_into,
    "reduce_scatter_tensor": _reduce_scatter,
    "all_to_all_single": _all_to_all,
    "gather": _gather,
    "scatter": _scatter,
    "send": _send,
    "recv": _recv,
}
