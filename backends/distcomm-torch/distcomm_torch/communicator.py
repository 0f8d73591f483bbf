"""`TorchCommunicator`: distcomm's primitives over a torch.distributed ProcessGroup.

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
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from distcomm import NON_MEMBER, InvalidArgumentError, ReduceOp
from distcomm.backend import BaseCommunicator, BaseWork, CallKind, Capabilities, as_torch, monitor
from distcomm.protocol import Communicator, NonMember, Work
from distcomm_torch import plans
from distcomm_torch.mailbox import StoreMailbox
from distcomm_torch.native import all_gather_single as _all_gather_single
from distcomm_torch.native import native_call
from distcomm_torch.native import reduce_scatter_single as _reduce_scatter_single
from distcomm_torch.plugin import GLOO, NCCL
from distcomm_torch.progress import StoreProgress

__all__ = [
    "GlooCommunicator",
    "NcclCommunicator",
    "TorchCommunicator",
    "TorchWork",
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


class TorchWork(BaseWork):
    """A torch Work that owns its tensors; sources are ranks of the communicator."""

    def __init__(
        self,
        work: Any,
        comm: TorchCommunicator,
        *buffers: Any,
        op: str | None = None,
        seq: int | None = None,
    ) -> None:
        super().__init__(comm, *buffers, op=op, seq=seq)
        self._work = work
        self._torch_comm = comm

    @property
    def source(self) -> int | None:
        """For an irecv: the sender's rank in the communicator, once complete."""
        if not self.done:
            return None
        try:
            group_rank = int(self._work._source_rank())  # a rank of torch's group
        except RuntimeError:
            return None
        comm = self._torch_comm
        group = comm._group
        world_rank = group_rank if group is None else dist.get_global_rank(group, group_rank)
        return comm.global_ranks.index(world_rank)

    def _test(self) -> bool:
        """Whether the operation completed; torch says "completed" of a failed one too (NCCL's
        timed out by its watchdog), so a completed one is waited for (at once): a failure then
        raises, a timeout as the communicator's DistTimeoutError."""
        if not self._work.is_completed():
            return False
        self._work.wait()
        return True

    def _block(self, timeout: float | None) -> bool:
        # torch's own timeout is the communicator's: it raises a timeout error then, which
        # TorchCommunicator._timeout_of tells from its other errors
        if timeout is None:
            self._work.wait()
        else:
            self._work.wait(torch_timeout(timeout))
        return True


class TorchCommunicator(BaseCommunicator):
    """A distcomm communicator over a torch ProcessGroup (``native``)."""

    backend_name: ClassVar[str] = "torch"

    def __init__(
        self,
        group: Any,
        *,
        side: TorchCommunicator | None = None,
        owns_group: bool = False,
        progress: StoreProgress | None = None,
        device: torch.device | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._group = group
        self._side = side
        self._owns_group = owns_group
        #: The CUDA device of this rank's work on nccl (every sub-communicator has its
        #: parent's); None on gloo. Tensors on another GPU are refused (``bound_device``).
        self.device = device
        self.bound_device = None if device is None else str(device)
        self._adopted: dict[int, tuple[Any, Communicator]] = {}
        self.torch_group = self.native
        self.monitor_interval = max(0.02, min(0.5, self.timeout / 4))
        self._progress = progress
        self._progress_key = "" if progress is None else progress.key(self.native)
        self._mailbox = (
            None
            if progress is None
            else StoreMailbox(progress, f"distcomm/mail/{self.native.group_name}", self.rank)
        )
        self._published = 0
        if progress is not None and self.world_size > 1:
            monitor.watch(self)
            progress.answer_for(self)

    @property
    def native(self) -> Any:
        """The torch ProcessGroup (for DDP's ``process_group=``, FSDP, ...)."""
        return dist.group.WORLD if self._group is None else self._group

    def _native_call(self, op: str, args: tuple[Any, ...]) -> Callable[[], object] | None:
        return native_call(self.native, self.world_size, op, args)  # type: ignore[no-any-return]

    def _adopt(self, native: Any) -> Communicator | NonMember:
        """A communicator over ``native``, a torch ProcessGroup made with torch.distributed.

        Made once per group and kept; the group stays its creator's. Every member calls it
        the first time for a group (a GPU backend makes a Gloo group for objects then).
        """
        if native is None or native is dist.group.WORLD or native is self._group:
            return self
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
        members: dict[str, Any] = {
            "rank": ranks.index(me),
            "world_size": len(ranks),
            "launch": self.launch,
            "global_ranks": ranks,
            "timeout": self.timeout,
            "progress": self._progress,
        }
        side = None
        if self._side is not None:
            with unbound_default_group():
                side_pg = dist.new_group(
                    list(ranks),
                    timeout=torch_timeout(self.timeout),
                    backend="gloo",
                    use_local_synchronization=True,
                    **_ORDER,  # the adopted group's order, not sorted
                )
            side = GlooCommunicator(
                side_pg, owns_group=True, name=f"objects of torch group {list(ranks)}", **members
            )
        comm = type(self)(
            native, side=side, name=f"torch group {list(ranks)}", device=self.device, **members
        )
        self._adopted[id(native)] = (native, comm)
        return comm

    def monitor_tick(self, now: float) -> None:
        """Publish this rank's progress when it changed (the monitor thread calls it)."""
        seq = self.seq  # published after a failure too: the other ranks read it then
        if self._progress is not None and self.unusable not in (None, "finalized"):
            self._progress.troubled(now)  # its peers will ask where it is: answer at once
        if seq != self._published and self._progress is not None:
            self._progress.active(now)
            self._progress.publish(self._progress_key, self.rank, seq)
            self._published = seq

    def _timeout_of(self, exc: BaseException) -> str | None:
        """Gloo's and NCCL's timeouts are RuntimeErrors (DistBackendError) told by their text."""
        return "" if isinstance(exc, RuntimeError) and is_timeout(str(exc)) else None

    def _peer_progress(self) -> dict[int, int] | None:
        if self._progress is None:
            return None
        return self._progress.read(self._progress_key, self.world_size)

    def _peer_stacks(self, ranks: list[int]) -> dict[int, str] | None:
        if self._progress is None:
            return None
        return self._progress.where({rank: self.global_ranks[rank] for rank in ranks})

    def _control_ready(self) -> bool:
        """Only through the store (:mod:`distcomm_torch.mailbox`): Gloo's own messages complete
        only in a blocking wait. None where torch hides the store, and on the group made beside
        another backend, which distcomm's operations never use."""
        return self._mailbox is not None

    def _control_isend(self, payload: bytearray, dst: int) -> Work:
        assert self._mailbox is not None, "no control messages here (_control_ready)"
        return self._mailbox.send(self, payload, dst)

    def _control_irecv(self, payload: bytearray, src: int) -> Work:
        assert self._mailbox is not None, "no control messages here (_control_ready)"
        return self._mailbox.recv(self, payload, src)

    def _issue(
        self, start: Callable[..., Any], args: tuple[Any, ...], *buffers: Any
    ) -> Work | None:
        """Start a collective with ``start(*args)`` (torch's, with async_op=True) and hand its
        Work back; the pipeline waits for it when the call is blocking."""
        return self._started(start, args, self.op, self.seq, buffers)

    def _started(
        self,
        start: Callable[..., Any],
        args: tuple[Any, ...],
        op: str,
        seq: int | None,
        buffers: tuple[Any, ...],
    ) -> TorchWork:
        try:
            work = start(*args)
        except RuntimeError as exc:  # e.g. a peer already gone: torch says so at once
            raise self.engine_failed(op, seq, exc) from exc
        return TorchWork(work, self, *buffers, args, op=op, seq=seq)

    # -- primitives ---------------------------------------------------------------------------
    def _plan(self, kind: CallKind) -> Callable[[Any, Any], Any] | None:
        """The group's own call for a kind of blocking call (:mod:`distcomm_torch.plans`)."""
        return plans.plan(self, kind)

    # torch is always called with async_op=True: a blocking call would wait with torch's own
    # timeout and raise torch's RuntimeError; the pipeline waits for the Work instead.
    def _all_reduce(self, tensor: Any, op: ReduceOp, async_op: bool) -> Work | None:
        t = as_torch(tensor)
        args = (t, _OPS[op], self._group, True)
        return self._issue(dist.all_reduce, args, tensor, t)

    def _broadcast(self, tensor: Any, src: int, async_op: bool) -> Work | None:
        t = as_torch(tensor)
        args = (t, self.global_ranks[src], self._group, True)
        return self._issue(dist.broadcast, args, tensor, t)

    def _reduce(self, tensor: Any, dst: int, op: ReduceOp, async_op: bool) -> Work | None:
        t = as_torch(tensor)
        args = (t, self.global_ranks[dst], _OPS[op], self._group, True)
        return self._issue(dist.reduce, args, tensor, t)

    def _all_gather_into(self, output: Any, tensor: Any, async_op: bool) -> Work | None:
        out, inp = flat(output), flat(tensor)
        args = (out, inp, self._group, True)
        return self._issue(_all_gather_single, args, output, tensor)

    def _reduce_scatter(self, output: Any, input: Any, op: ReduceOp, async_op: bool) -> Work | None:
        out, inp = flat(output), flat(input)
        args = (out, inp, _OPS[op], self._group, True)
        return self._issue(_reduce_scatter_single, args, output, input)

    def _gather(self, output: Any | None, tensor: Any, dst: int, async_op: bool) -> Work | None:
        parts = None if output is None else list(flat(output).chunk(self.world_size))
        args = (flat(tensor), parts, self.global_ranks[dst], self._group, True)
        return self._issue(dist.gather, args, output, tensor)

    def _scatter(self, output: Any, full: Any | None, src: int, async_op: bool) -> Work | None:
        parts = None if full is None else list(flat(full).chunk(self.world_size))
        args = (flat(output), parts, self.global_ranks[src], self._group, True)
        return self._issue(dist.scatter, args, output, full)

    def _all_to_all(self, output: Any, input: Any, async_op: bool) -> Work | None:
        args = (flat(output), flat(input), None, None, self._group, True)
        return self._issue(dist.all_to_all_single, args, output, input)

    def _all_to_all_v(
        self,
        output: Any,
        output_splits: list[int],
        input: Any,
        input_splits: list[int],
        async_op: bool,
    ) -> Work | None:
        args = (flat(output), flat(input), output_splits, input_splits, self._group, True)
        return self._issue(dist.all_to_all_single, args, output, input)

    def _barrier(self, async_op: bool) -> Work | None:
        return self._issue(dist.barrier, (self._group, True))

    def _isend(self, tensor: Any, dst: int, tag: int) -> Work:
        t = as_torch(tensor)
        args = (t, self.global_ranks[dst], self._group, tag)
        return self._started(dist.isend, args, f"send to rank {dst} (tag {tag})", None, (tensor,))

    def _irecv(self, tensor: Any, src: int | None, tag: int) -> Work:
        peer = None if src is None else self.global_ranks[src]
        t = as_torch(tensor)
        sender = "any rank" if src is None else f"rank {src}"
        op = f"recv from {sender} (tag {tag})"
        return self._started(dist.irecv, (t, peer, self._group, tag), op, None, (tensor,))

    def _split(self, groups: list[tuple[int, ...]], index: int | None) -> Communicator | NonMember:
        world = [tuple(self.global_ranks[r] for r in group) for group in groups]
        if not _KEEPS_ORDER and any(list(ranks) != sorted(ranks) for ranks in world):
            raise InvalidArgumentError(
                f"torch {torch.__version__} orders group members by rank, so split(key=...) "
                "cannot reorder them. HINT: upgrade torch, or split without a reordering key."
            )
        if self._group is None or self.global_ranks == tuple(range(dist.get_world_size())):
            # torch wants every process of the default group to create every group, in order.
            made = [self._new_groups(ranks, local=False) for ranks in world]
            mine = None if index is None else made[index]
        else:  # a group of a sub-group: only its members may take part
            mine = None if index is None else self._new_groups(world[index], local=True)
        if index is None or mine is None:
            return NON_MEMBER
        pg, side_pg = mine
        members: dict[str, Any] = {
            "rank": groups[index].index(self.rank),
            "world_size": len(groups[index]),
            "launch": self.launch,
            "global_ranks": world[index],
            "timeout": self.timeout,
            "progress": self._progress,
        }
        side = None
        if side_pg is not None:
            side = GlooCommunicator(
                side_pg, owns_group=True, name=f"objects of group {list(world[index])}", **members
            )
        return type(self)(
            pg,
            side=side,
            owns_group=True,
            name=f"group {list(world[index])}",
            device=self.device,
            **members,
        )

    def _new_groups(self, ranks: tuple[int, ...], local: bool) -> tuple[Any, Any]:
        """torch groups for ``ranks``: the engine's, and a Gloo one for objects where needed."""
        pg = dist.new_group(
            list(ranks),
            timeout=torch_timeout(self.timeout),
            use_local_synchronization=local,
            **_ORDER,
        )
        return pg, None

    def _finalize(self) -> None:
        monitor.unwatch(self)
        if self._progress is not None:
            self._progress.release(self)
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


class GlooCommunicator(TorchCommunicator):
    """``gloo``: CPU tensors (CUDA tensors are staged through host memory)."""

    backend_name = "gloo"
    capabilities: ClassVar[Capabilities] = GLOO
    devices = frozenset({"cpu"})


class NcclCommunicator(TorchCommunicator):
    """``nccl``: CUDA tensors; object collectives travel on a Gloo side group, never the GPU."""

    backend_name = "nccl"
    capabilities: ClassVar[Capabilities] = NCCL
    devices = frozenset({"cuda"})

    def _object_channel(self) -> BaseCommunicator:
        assert self._side is not None
        return self._side

    def _barrier(self, async_op: bool) -> Work | None:
        """On this rank's device: torch would otherwise pick one (the current device, or the
        global rank modulo the visible devices, depending on its version)."""
        if self.device is None:
            return super()._barrier(async_op)
        start = functools.partial(dist.barrier, device_ids=[self.device.index])
        return self._issue(start, (self._group, True))

    def _new_groups(self, ranks: tuple[int, ...], local: bool) -> tuple[Any, Any]:
        """The NCCL group is split from a device-bound default group only where every rank of
        the world makes it (``local`` False); the others are made without the binding
        (:func:`unbound_default_group`)."""
        with unbound_default_group() if local else contextlib.nullcontext():
            pg = dist.new_group(
                list(ranks),
                timeout=watchdog_timeout(self.timeout),
                use_local_synchronization=local,
                **_ORDER,
            )
        with unbound_default_group():
            side_pg = dist.new_group(
                list(ranks),
                timeout=torch_timeout(self.timeout),
                backend="gloo",
                use_local_synchronization=local,
                **_ORDER,
            )
        return pg, side_pg
