"""`TorchEngine`: distcomm's engine over a torch.distributed ProcessGroup (``gloo``, ``nccl``).

The factory (:mod:`distcomm_torch.factory`) returns the world's engine and the kit makes the
communicator around it (:class:`distcomm.backend.BaseCommunicator`), which the engine keeps
(``bind``): its ranks, timeout, sequence number and errors are the communicator's. Operations
return the kit's :class:`~distcomm.backend.EngineWork` around torch's Work (a
:class:`TorchRequest`); ``split`` and ``adopt`` make engines of new torch groups.

numpy arrays and byte buffers reach torch through ``torch.from_numpy`` / ``torch.frombuffer``,
which share memory: no copies. Ranks given to torch are world ranks (``global_ranks``), so one
code path serves the default group and sub-groups alike. Every timeout reaches torch through
:func:`torch_timeout`, and torch's timeout errors are told from its other errors by
:func:`is_timeout`.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import gc
import inspect
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from distcomm import NON_MEMBER, InvalidArgumentError, LaunchInfo, ReduceOp
from distcomm.backend import BaseCommunicator, CallKind, EngineWork, as_torch, monitor
from distcomm.protocol import Communicator, NonMember, Work
from distcomm_torch import plans
from distcomm_torch.mailbox import StoreMailbox
from distcomm_torch.native import all_gather_single as _all_gather_single
from distcomm_torch.native import native_call
from distcomm_torch.native import reduce_scatter_single as _reduce_scatter_single
from distcomm_torch.plugin import GLOO
from distcomm_torch.process_group import torch_makes_groups
from distcomm_torch.progress import StoreProgress

__all__ = [
    "GlooEngine",
    "NcclEngine",
    "TorchEngine",
    "TorchRequest",
]

_OPS = {
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
    ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.MAX: dist.ReduceOp.MAX,
    ReduceOp.AVG: dist.ReduceOp.AVG,
    ReduceOp.BAND: dist.ReduceOp.BAND,
    ReduceOp.BOR: dist.ReduceOp.BOR,
    ReduceOp.BXOR: dist.ReduceOp.BXOR,
}
# Group ranks in distcomm's order (split's key), not sorted, where torch allows it.
_KEEPS_ORDER = "sort_ranks" in inspect.signature(dist.new_group).parameters
_ORDER: dict[str, Any] = {"sort_ranks": False} if _KEEPS_ORDER else {}
# torch 2.13 renamed the "_tensor" collectives; the old names warn there.

#: What torch's errors say when a Work gave up waiting (lower case; torch's texts in full in
#: backends/distcomm-torch/tests/test_torch_nccl.py):
_TIMEOUT_TEXTS = (
    # c10d's Work::wait(timeout) ("Operation timed out!", Gloo's collectives) and Gloo's
    # transport ("Timed out waiting 1500ms for recv operation to complete", also "send").
    "timed out",
    # Gloo, on every pair of a context once one of its operations timed out.
    "application timeout caused pair closure",
    # NCCL's watchdog and WorkNCCL::wait(timeout): "Watchdog caught collective operation
    # timeout: WorkNCCL(...) ran for N milliseconds before timing out." (torch has aborted the
    # communicator by then), also quoted as the reason of a communicator aborted for it.
    "collective operation timeout",
)


def is_timeout(message: str) -> bool:
    """Whether torch's error ``message`` says that an operation timed out (Gloo or NCCL)."""
    text = message.lower()
    return any(phrase in text for phrase in _TIMEOUT_TEXTS)


#: The longest timeout a timedelta can say, in milliseconds (torch's are int64 milliseconds).
_LONGEST_MS = datetime.timedelta.max // datetime.timedelta(milliseconds=1)


def torch_timeout(seconds: float) -> datetime.timedelta:
    """``seconds`` as torch takes a timeout: whole milliseconds, rounded up, at least one.

    torch truncates a timedelta to milliseconds and reads 0 ms as "no timeout" (``kNoTimeout``):
    a Gloo wait would block forever, and an NCCL wait return before the kernels have run.
    """
    ms = seconds * 1000
    if not ms < _LONGEST_MS:  # inf, nan
        ms = _LONGEST_MS
    return datetime.timedelta(milliseconds=max(1, math.ceil(round(ms, 6))))


def watchdog_timeout(seconds: float) -> datetime.timedelta:
    """The timeout of a torch NCCL group for a distcomm timeout of ``seconds``: longer by
    max(30 s, 10 %). NCCL's watchdog ends the process at the group's timeout (torch's default
    ``TORCH_NCCL_ASYNC_ERROR_HANDLING=3``); distcomm's deadline, the wait of a blocking call,
    comes first, so that its diagnosis (the ranks that had not arrived, their stacks), the
    flight recorder's dump and ``DISTCOMM_ON_TIMEOUT`` take effect before the watchdog's."""
    return torch_timeout(seconds + max(30.0, 0.1 * seconds))


@contextlib.contextmanager
def unbound_default_group() -> Iterator[None]:
    """Make a torch group meanwhile as if torch's default group had no device bound to it.

    Where the default group is bound to a GPU (``init_process_group(device_id=...)``, as the
    nccl factory does), torch makes every new group from the default NCCL communicator with
    ``ncclCommSplit``, which every rank of the world must call: the members of a new NCCL group
    with its color, every other rank with none, inside ``new_group``. That leaves ranks waiting
    forever where only some call: a group made by its members only
    (``use_local_synchronization=True``), and a Gloo group, whose non-members split while its
    members do not (pytorch/pytorch#145376, open in torch 2.13). Such groups are made here
    without the binding, as torch makes them when nothing is bound; it is back at once after.
    """
    world = dist.group.WORLD
    bound = getattr(world, "bound_device_id", None)
    if world is None or bound is None:
        yield
        return
    world.bound_device_id = None
    try:
        yield
    finally:
        world.bound_device_id = bound


def flat(x: Any) -> torch.Tensor:
    """A 1-D view of a contiguous array (torch's gather/scatter family wants matching dims)."""
    view: torch.Tensor = as_torch(x).view(-1)
    return view


class TorchRequest:
    """torch's Work of one operation of a :class:`TorchEngine`, as the kit's
    :class:`~distcomm.backend.EngineWork` takes it: ``test``, ``block`` and a receive's
    ``source`` (a rank of the engine's communicator)."""

    def __init__(self, work: Any, engine: TorchEngine) -> None:
        self._work = work
        self._engine = engine
        self._future: Any = None  # torch's future, once asked for (``future``)

    @property
    def source(self) -> int | None:
        """For an irecv: the sender's rank in the communicator (read once complete)."""
        try:
            group_rank = int(self._work._source_rank())  # a rank of torch's group
        except RuntimeError:
            return None
        group = self._engine._group
        world_rank = group_rank if group is None else dist.get_global_rank(group, group_rank)
        return self._engine.comm.global_ranks.index(world_rank)

    def future(self) -> Any:
        """torch's future of the operation, completed by torch's threads (DDP chains on it).
        Its callbacks run before torch's Work says completed: ``test`` then reads the future."""
        try:
            self._future = self._work.get_future()
        except RuntimeError:  # "Work::getFuture not implemented" (some of Gloo's works)
            return None
        return self._future

    def test(self) -> bool:
        """Whether the operation completed; torch says "completed" of a failed one too (NCCL's
        timed out by its watchdog), so a completed one is waited for (at once): a failure then
        raises, a timeout as the communicator's DistTimeoutError. Once torch's future is done
        (in its callbacks, before the Work says so) its value says it, or raises its error."""
        if self._future is not None and self._future.done():
            self._future.value()
            return True
        if not self._work.is_completed():
            return False
        self._work.wait()
        return True

    def block(self, timeout: float | None) -> bool:
        """Wait with torch's own timeout: the group's (``timeout`` None, the communicator's),
        else ``timeout`` as :func:`torch_timeout` says it. torch raises a timeout error then,
        which :meth:`TorchEngine.timeout_of` tells from its other errors."""
        if timeout is None:
            self._work.wait()
        else:
            self._work.wait(torch_timeout(timeout))
        return True


class TorchEngine:
    """distcomm's engine over a torch ProcessGroup (``native``; ``group`` None: torch's default
    group), for the communicator the kit makes around it (``bind``).

    Args:
        group: the torch group, or None for torch's default group.
        side_group: a Gloo group of the same members for objects (NCCL's), or None.
        owns_group: whether ``finalize`` destroys ``group`` (made by distcomm).
        progress: this process's progress in torch's store (:mod:`distcomm_torch.progress`),
            or None where torch hides the store and for the group made beside another backend:
            then no progress is published and the kit's votes have no way here
            (``control_isend`` None).
        device: the CUDA device of this rank's work on nccl (every engine made from it has the
            same); None on gloo.
        launch: the world's launch as the factory settled it (the rendezvous address it
            derived under MPI); None for groups.
    """

    #: The devices whose memory the engine moves; an NCCL engine's lists its GPU by index.
    devices: frozenset[str] = frozenset({"cpu"})
    #: The communicator that holds this engine (``bind``).
    comm: BaseCommunicator
    #: The kit's votes, through the store (:mod:`distcomm_torch.mailbox`): Gloo's own messages
    #: complete only in a blocking wait. None where there is no store (``progress`` None).
    control_isend: Callable[[bytearray, int], Work] | None
    control_irecv: Callable[[bytearray, int], Work] | None

    def __init__(
        self,
        group: Any,
        *,
        side_group: Any = None,
        owns_group: bool = False,
        progress: StoreProgress | None = None,
        device: torch.device | None = None,
        launch: LaunchInfo | None = None,
    ) -> None:
        self._group = group
        if launch is not None:
            #: The launch the factory settled on (the world's communicator takes it).
            self.launch = launch
        self._side_group = side_group
        #: The communicator over ``side_group`` (made at ``bind``), None without one.
        self._side: Communicator | None = None
        self._owns_group = owns_group
        #: The CUDA device of this rank's work on nccl; tensors on another GPU are refused.
        self.device = device
        if device is not None:
            self.devices = frozenset({str(device)})
        self._adopted: dict[int, tuple[Any, Communicator]] = {}
        self._progress = progress
        self._progress_key = "" if progress is None else progress.key(self.native)
        self._mailbox: StoreMailbox | None = None
        self._published = 0
        self.monitor_interval = 0.5
        mail = progress is not None
        self.control_isend = self._mail_send if mail else None
        self.control_irecv = self._mail_recv if mail else None

    @property
    def native(self) -> Any:
        """The torch ProcessGroup (for DDP's ``process_group=``, FSDP, ...)."""
        return dist.group.WORLD if self._group is None else self._group

    def bind(self, comm: BaseCommunicator) -> None:
        """Keep ``comm``; make torch's group its ``torch_group``; open the mailbox of the kit's
        votes, publish this rank's progress and answer "where are you?" (a world of 2 or more
        with a store); make the side channel (``side_group``'s communicator)."""
        self.comm = comm
        comm.torch_group = self.native
        self.monitor_interval = max(0.02, min(0.5, comm.timeout / 4))
        progress = self._progress
        if progress is not None:
            prefix = f"distcomm/mail/{self.native.group_name}"
            self._mailbox = StoreMailbox(progress, prefix, comm.rank)
            if comm.world_size > 1:
                monitor.watch(self)
                progress.answer_for(comm)
        if self._side_group is not None:
            self._side = comm.group_over(
                GlooEngine(self._side_group, owns_group=True, progress=progress),
                range(comm.world_size),
                name=f"objects of {comm.name}",
                backend="gloo",
                capabilities=GLOO,
            )

    def native_call(self, op: str, args: tuple[Any, ...]) -> Callable[[], object] | None:
        """torch.distributed's own call for ``op`` (:mod:`distcomm_torch.native`)."""
        call = native_call(self.native, self.comm.world_size, op, args)
        return call  # type: ignore[no-any-return]

    def adopt(self, native: Any) -> Communicator | NonMember:
        """A communicator over ``native``, a torch ProcessGroup made with torch.distributed.

        Made once per group and kept; the group stays its creator's. Every member calls it
        the first time for a group (a GPU backend makes a Gloo group for objects then).
        """
        comm = self.comm
        if native is None or native is dist.group.WORLD or native is self._group:
            return comm
        if not isinstance(native, dist.ProcessGroup):
            raise InvalidArgumentError(
                f"group={native!r} is not a torch ProcessGroup or a distcomm communicator. "
                "HINT: pass one made by distcomm.new_group() or torch.distributed.new_group()."
            )
        known = self._adopted.get(id(native))
        if known is not None and known[0] is native:
            return known[1]
        ranks = tuple(dist.get_process_group_ranks(native))
        me = dist.get_rank()
        if me not in ranks:
            return NON_MEMBER
        engine = type(self)(
            native,
            side_group=self._objects_group(ranks, local=True),
            progress=self._progress,
            device=self.device,
        )
        # its members are world ranks, not necessarily all of this communicator's
        adopted = BaseCommunicator(
            engine,
            backend=comm.backend,
            capabilities=comm.capabilities,
            rank=ranks.index(me),
            world_size=len(ranks),
            launch=comm.launch,
            global_ranks=ranks,
            timeout=comm.timeout,
            name=f"torch group {list(ranks)}",
        )
        self._adopted[id(native)] = (native, adopted)
        return adopted

    def monitor_tick(self, now: float) -> None:
        """Publish this rank's progress (its communicator's ``seq``) when it changed (the
        monitor thread calls it)."""
        progress, comm = self._progress, self.comm
        if progress is None:
            return
        seq = comm.seq  # published after a failure too: the other ranks read it then
        if comm.unusable not in (None, "finalized"):
            progress.troubled(now)  # its peers will ask where it is: answer at once
        if seq != self._published:
            progress.active(now)
            progress.publish(self._progress_key, comm.rank, seq)
            self._published = seq

    def timeout_of(self, exc: BaseException) -> str | None:
        """Gloo's and NCCL's timeouts are RuntimeErrors (DistBackendError) told by their text."""
        return "" if isinstance(exc, RuntimeError) and is_timeout(str(exc)) else None

    def peer_progress(self) -> dict[int, int] | None:
        if self._progress is None:
            return None
        return self._progress.read(self._progress_key, self.comm.world_size)

    def peer_stacks(self, ranks: list[int]) -> dict[int, str] | None:
        if self._progress is None:
            return None
        global_ranks = self.comm.global_ranks
        return self._progress.where({rank: global_ranks[rank] for rank in ranks})

    def _mail_send(self, payload: bytearray, dst: int) -> Work:
        assert self._mailbox is not None, "bind() opens the mailbox"
        return self._mailbox.send(self.comm, payload, dst)

    def _mail_recv(self, payload: bytearray, src: int) -> Work:
        assert self._mailbox is not None, "bind() opens the mailbox"
        return self._mailbox.recv(self.comm, payload, src)

    def _issue(
        self, start: Callable[..., Any], args: tuple[Any, ...], *buffers: Any
    ) -> Work | None:
        """Start a collective with ``start(*args)`` (torch's, with async_op=True) and hand its
        Work back; the kit waits for it when the call is blocking."""
        return self._started(start, args, self.comm.op, self.comm.seq, buffers)

    def _started(
        self,
        start: Callable[..., Any],
        args: tuple[Any, ...],
        op: str,
        seq: int | None,
        buffers: tuple[Any, ...],
    ) -> EngineWork:
        try:
            work = start(*args)
        except RuntimeError as exc:  # e.g. a peer already gone: torch says so at once
            raise self.comm.engine_failed(op, seq, exc) from exc
        return EngineWork(self.comm, TorchRequest(work, self), *buffers, args, op=op, seq=seq)

    # -- operations ---------------------------------------------------------------------------
    def plan(self, kind: CallKind) -> Callable[[Any, Any], Any] | None:
        """The group's own call for a kind of blocking call (:mod:`distcomm_torch.plans`)."""
        return plans.plan(self, kind)

    # torch is always called with async_op=True: a blocking call would wait with torch's own
    # timeout and raise torch's RuntimeError; the kit waits for the Work instead.
    def all_reduce(self, tensor: Any, op: ReduceOp, async_op: bool) -> Work | None:
        t = as_torch(tensor)
        args = (t, _OPS[op], self._group, True)
        return self._issue(dist.all_reduce, args, tensor, t)

    def broadcast(self, tensor: Any, src: int, async_op: bool) -> Work | None:
        t = as_torch(tensor)
        args = (t, self.comm.global_ranks[src], self._group, True)
        return self._issue(dist.broadcast, args, tensor, t)

    def reduce(self, tensor: Any, dst: int, op: ReduceOp, async_op: bool) -> Work | None:
        t = as_torch(tensor)
        args = (t, self.comm.global_ranks[dst], _OPS[op], self._group, True)
        return self._issue(dist.reduce, args, tensor, t)

    def all_gather_into(self, output: Any, tensor: Any, async_op: bool) -> Work | None:
        out, inp = flat(output), flat(tensor)
        args = (out, inp, self._group, True)
        return self._issue(_all_gather_single, args, output, tensor)

    def reduce_scatter(self, output: Any, input: Any, op: ReduceOp, async_op: bool) -> Work | None:
        out, inp = flat(output), flat(input)
        args = (out, inp, _OPS[op], self._group, True)
        return self._issue(_reduce_scatter_single, args, output, input)

    def gather(self, output: Any | None, tensor: Any, dst: int, async_op: bool) -> Work | None:
        parts = None if output is None else list(flat(output).chunk(self.comm.world_size))
        args = (flat(tensor), parts, self.comm.global_ranks[dst], self._group, True)
        return self._issue(dist.gather, args, output, tensor)

    def scatter(self, output: Any, full: Any | None, src: int, async_op: bool) -> Work | None:
        parts = None if full is None else list(flat(full).chunk(self.comm.world_size))
        args = (flat(output), parts, self.comm.global_ranks[src], self._group, True)
        return self._issue(dist.scatter, args, output, full)

    def all_to_all(self, output: Any, input: Any, async_op: bool) -> Work | None:
        args = (flat(output), flat(input), None, None, self._group, True)
        return self._issue(dist.all_to_all_single, args, output, input)

    def all_to_all_v(
        self,
        output: Any,
        output_splits: list[int],
        input: Any,
        input_splits: list[int],
        async_op: bool,
    ) -> Work | None:
        args = (flat(output), flat(input), output_splits, input_splits, self._group, True)
        return self._issue(dist.all_to_all_single, args, output, input)

    def barrier(self, async_op: bool) -> Work | None:
        return self._issue(dist.barrier, (self._group, True))

    def isend(self, tensor: Any, dst: int, tag: int) -> Work:
        t = as_torch(tensor)
        args = (t, self.comm.global_ranks[dst], self._group, tag)
        return self._started(dist.isend, args, f"send to rank {dst} (tag {tag})", None, (tensor,))

    def irecv(self, tensor: Any, src: int | None, tag: int) -> Work:
        peer = None if src is None else self.comm.global_ranks[src]
        t = as_torch(tensor)
        sender = "any rank" if src is None else f"rank {src}"
        op = f"recv from {sender} (tag {tag})"
        return self._started(dist.irecv, (t, peer, self._group, tag), op, None, (tensor,))

    def split(self, groups: list[tuple[int, ...]], index: int | None) -> TorchEngine | None:
        """This rank's engine over a new torch group of ``groups[index]`` (None where
        ``index`` is None); torch makes every group of ``groups`` where it wants every process
        of the default group to make each."""
        global_ranks = self.comm.global_ranks
        world = [tuple(global_ranks[r] for r in group) for group in groups]
        if not _KEEPS_ORDER and any(list(ranks) != sorted(ranks) for ranks in world):
            raise InvalidArgumentError(
                f"torch {torch.__version__} orders group members by rank, so split(key=...) "
                "cannot reorder them. HINT: upgrade torch, or split without a reordering key."
            )
        if self._group is None or global_ranks == tuple(range(dist.get_world_size())):
            # torch wants every process of the default group to create every group, in order.
            made = [self._new_groups(ranks, local=False) for ranks in world]
            mine = None if index is None else made[index]
        else:  # a group of a sub-group: only its members may take part
            mine = None if index is None else self._new_groups(world[index], local=True)
        if mine is None:
            return None
        pg, side_pg = mine
        return type(self)(
            pg, side_group=side_pg, owns_group=True, progress=self._progress, device=self.device
        )

    def _new_groups(self, ranks: tuple[int, ...], local: bool) -> tuple[Any, Any]:
        """torch groups for ``ranks``: the engine's (of its backend: torch's default group may
        be the ``"distcomm"`` one), and a Gloo one for objects where needed."""
        with torch_makes_groups():
            pg = dist.new_group(
                list(ranks),
                timeout=torch_timeout(self.comm.timeout),
                backend=dist.get_backend(self.native),
                use_local_synchronization=local,
                **_ORDER,
            )
        return pg, self._objects_group(ranks, local)

    def _objects_group(self, ranks: tuple[int, ...], local: bool) -> Any:
        """The Gloo group of ``ranks`` that objects travel on, where not the engine's own
        group (None: gloo's own)."""
        return None

    def finalize(self) -> None:
        monitor.unwatch(self)
        if self._progress is not None:
            self._progress.release(self.comm)
        self._progress = None
        for _, adopted in self._adopted.values():
            adopted.finalize()
        self._adopted.clear()
        if self._side is not None:
            self._side.finalize()
        if self._owns_group and dist.is_initialized():
            # Collect unreachable DDP modules and autograd graphs still holding the group: a
            # Gloo group that outlives destroy_process_group() can abort the process at exit.
            gc.collect()
            dist.destroy_process_group(self._group)  # None: the default group and every group


class GlooEngine(TorchEngine):
    """``gloo``: CPU tensors (the kit stages CUDA tensors through host memory)."""

    devices = frozenset({"cpu"})


class NcclEngine(TorchEngine):
    """``nccl``: CUDA tensors of this rank's GPU (``devices``: ``{"cuda:N"}``); object
    collectives travel on a Gloo side channel of the same members, never the GPU."""

    devices = frozenset({"cuda"})

    def object_channel(self) -> Communicator:
        """The side channel: a Gloo communicator of the same members."""
        assert self._side is not None, "an NCCL engine is made with its side_group"
        return self._side

    def barrier(self, async_op: bool) -> Work | None:
        """On this rank's device: torch would otherwise pick one (the current device, or the
        global rank modulo the visible devices, depending on its version)."""
        if self.device is None:
            return super().barrier(async_op)
        start = functools.partial(dist.barrier, device_ids=[self.device.index])
        return self._issue(start, (self._group, True))

    def _new_groups(self, ranks: tuple[int, ...], local: bool) -> tuple[Any, Any]:
        """The NCCL group is split from a device-bound default group only where every rank of
        the world makes it (``local`` False); the others are made without the binding
        (:func:`unbound_default_group`)."""
        with unbound_default_group() if local else contextlib.nullcontext():
            pg = dist.new_group(
                list(ranks),
                timeout=watchdog_timeout(self.comm.timeout),
                use_local_synchronization=local,
                **_ORDER,
            )
        return pg, self._objects_group(ranks, local)

    def _objects_group(self, ranks: tuple[int, ...], local: bool) -> Any:
        """A Gloo group of ``ranks`` (in this order), made without the default group's device
        binding (:func:`unbound_default_group`)."""
        with unbound_default_group():
            return dist.new_group(
                list(ranks),
                timeout=torch_timeout(self.comm.timeout),
                backend="gloo",
                use_local_synchronization=local,
                **_ORDER,
            )
