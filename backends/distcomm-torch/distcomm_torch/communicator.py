"""`TorchCommunicator`: distcomm's primitives over a torch.distributed ProcessGroup.

numpy arrays and byte buffers reach torch through ``torch.from_numpy`` / ``torch.frombuffer``,
which share memory: no copies. Ranks given to torch are world ranks (``global_ranks``), so one
code path serves the default group and sub-groups alike.
"""

from __future__ import annotations

import datetime
import gc
import inspect
from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from distcomm import (
    NON_MEMBER,
    BaseCommunicator,
    BaseWork,
    Capabilities,
    InvalidArgumentError,
    ReduceOp,
)
from distcomm.backend import as_torch, monitor
from distcomm.protocol import Communicator, NonMember, Work
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
        if not self._done:
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
        return bool(self._work.is_completed())

    def _block(self, timeout: float | None) -> bool:
        try:  # torch's own timeout is the communicator's: it raises "Timed out ..." then
            if timeout is None:
                self._work.wait()
            else:
                self._work.wait(datetime.timedelta(seconds=timeout))
        except RuntimeError as exc:
            if "timed out" in str(exc).lower():
                return False
            raise
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
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._group = group
        self._side = side
        self._owns_group = owns_group
        self.device: torch.device | None = None
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
            side_pg = dist.new_group(list(ranks), backend="gloo", use_local_synchronization=True)
            side = GlooCommunicator(
                side_pg, owns_group=True, name=f"objects of torch group {list(ranks)}", **members
            )
        comm = type(self)(native, side=side, name=f"torch group {list(ranks)}", **members)
        comm.device = self.device
        self._adopted[id(native)] = (native, comm)
        return comm

    def monitor_tick(self, now: float) -> None:
        """Publish this rank's progress when it changed (the monitor thread calls it)."""
        seq = self.seq  # published after a failure too: the other ranks read it then
        if self._progress is not None and self.unusable not in (None, "finalized"):
            self._progress.troubled(now)  # its peers will ask where it is: answer at once
        if seq != self._published and self._progress is not None:
            self._progress.active(now)
            self._progress.publish(self._progress_key, self._rank, seq)
            self._published = seq

    def _peer_progress(self) -> dict[int, int] | None:
        if self._progress is None:
            return None
        return self._progress.read(self._progress_key, self._world_size)

    def _peer_stacks(self, ranks: list[int]) -> dict[int, str] | None:
        if self._progress is None:
            return None
        return self._progress.where({rank: self._global_ranks[rank] for rank in ranks})

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
    # torch is always called with async_op=True: a blocking call would wait with torch's own
    # timeout and raise torch's RuntimeError; the pipeline waits for the Work instead.
    def _all_reduce(self, tensor: Any, op: ReduceOp, async_op: bool) -> Work | None:
        t = as_torch(tensor)
        args = (t, _OPS[op], self._group, True)
        return self._issue(dist.all_reduce, args, tensor, t)

    def _broadcast(self, tensor: Any, src: int, async_op: bool) -> Work | None:
        t = as_torch(tensor)
        args = (t, self._global_ranks[src], self._group, True)
        return self._issue(dist.broadcast, args, tensor, t)

    def _reduce(self, tensor: Any, dst: int, op: ReduceOp, async_op: bool) -> Work | None:
        t = as_torch(tensor)
        args = (t, self._global_ranks[dst], _OPS[op], self._group, True)
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
        parts = None if output is None else list(flat(output).chunk(self._world_size))
        args = (flat(tensor), parts, self._global_ranks[dst], self._group, True)
        return self._issue(dist.gather, args, output, tensor)

    def _scatter(self, output: Any, full: Any | None, src: int, async_op: bool) -> Work | None:
        parts = None if full is None else list(flat(full).chunk(self._world_size))
        args = (flat(output), parts, self._global_ranks[src], self._group, True)
        return self._issue(dist.scatter, args, output, full)

    def _all_to_all(self, output: Any, input: Any, async_op: bool) -> Work | None:
        args = (flat(output), flat(input), None, None, self._group, True)
        return self._issue(dist.all_to_all_single, args, output, input)

    def _barrier(self, async_op: bool) -> Work | None:
        return self._issue(dist.barrier, (self._group, True))

    def _isend(self, tensor: Any, dst: int, tag: int) -> Work:
        t = as_torch(tensor)
        args = (t, self._global_ranks[dst], self._group, tag)
        return self._started(dist.isend, args, f"send to rank {dst} (tag {tag})", None, (tensor,))

    def _irecv(self, tensor: Any, src: int | None, tag: int) -> Work:
        peer = None if src is None else self._global_ranks[src]
        t = as_torch(tensor)
        sender = "any rank" if src is None else f"rank {src}"
        op = f"recv from {sender} (tag {tag})"
        return self._started(dist.irecv, (t, peer, self._group, tag), op, None, (tensor,))

    def _split(self, groups: list[tuple[int, ...]], index: int | None) -> Communicator | NonMember:
        world = [tuple(self._global_ranks[r] for r in group) for group in groups]
        if not _KEEPS_ORDER and any(list(ranks) != sorted(ranks) for ranks in world):
            raise InvalidArgumentError(
                f"torch {torch.__version__} orders group members by rank, so split(key=...) "
                "cannot reorder them. HINT: upgrade torch, or split without a reordering key."
            )
        if self._group is None or self._global_ranks == tuple(range(dist.get_world_size())):
            # torch wants every process of the default group to create every group, in order.
            made = [self._new_groups(ranks, local=False) for ranks in world]
            mine = None if index is None else made[index]
        else:  # a group of a sub-group: only its members may take part
            mine = None if index is None else self._new_groups(world[index], local=True)
        if index is None or mine is None:
            return NON_MEMBER
        pg, side_pg = mine
        members: dict[str, Any] = {
            "rank": groups[index].index(self._rank),
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
            pg, side=side, owns_group=True, name=f"group {list(world[index])}", **members
        )

    def _new_groups(self, ranks: tuple[int, ...], local: bool) -> tuple[Any, Any]:
        """torch groups for ``ranks``: the engine's, and a Gloo one for objects where needed."""
        pg = dist.new_group(
            list(ranks),
            timeout=datetime.timedelta(seconds=self.timeout),
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

    def _new_groups(self, ranks: tuple[int, ...], local: bool) -> tuple[Any, Any]:
        pg = dist.new_group(
            list(ranks),
            timeout=datetime.timedelta(seconds=self.timeout),
            use_local_synchronization=local,
            **_ORDER,
        )
        side_pg = dist.new_group(
            list(ranks),
            timeout=datetime.timedelta(seconds=self.timeout),
            backend="gloo",
            use_local_synchronization=local,
            **_ORDER,
        )
        return pg, side_pg
