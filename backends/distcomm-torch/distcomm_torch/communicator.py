"""`TorchCommunicator`: distcomm's primitives over a torch.distributed ProcessGroup.

numpy arrays and byte buffers reach torch through ``torch.from_numpy`` / ``torch.frombuffer``,
which share memory: no copies. Ranks given to torch are world ranks (``global_ranks``), so one
code path serves the default group and sub-groups alike.
"""

from __future__ import annotations

import datetime
import gc
import inspect
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from distcomm import (
    NON_MEMBER,
    BaseCommunicator,
    Capabilities,
    DistTimeoutError,
    InvalidArgumentError,
    ReduceOp,
)
from distcomm.arrays import as_torch
from distcomm.protocol import Communicator, NonMember, Work
from distcomm_torch.plugin import GLOO, NCCL

__all__ = ["GlooCommunicator", "NcclCommunicator", "TorchCommunicator", "TorchWork"]

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
_all_gather_single = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)


def flat(x: Any) -> torch.Tensor:
    """A 1-D view of a contiguous array (torch's gather/scatter family wants matching dims)."""
    view: torch.Tensor = as_torch(x).view(-1)
    return view


class TorchWork:
    """A torch Work seen through distcomm: timeouts raise DistTimeoutError, sources are local."""

    def __init__(self, work: Any, comm: TorchCommunicator, op: str) -> None:
        self._work = work
        self._comm = comm
        self._op = op
        self._seq = comm.seq
        self._done = False

    @property
    def source(self) -> int | None:
        """For an irecv: the sender's rank in the communicator, once complete."""
        try:
            group_rank = int(self._work._source_rank())  # a rank of torch's group
        except RuntimeError:
            return None
        group = self._comm._group
        world_rank = group_rank if group is None else dist.get_global_rank(group, group_rank)
        return self._comm.global_ranks.index(world_rank)

    def wait(self, timeout: float | None = None) -> bool:
        limit = self._comm.timeout if timeout is None else timeout
        try:
            self._work.wait(datetime.timedelta(seconds=limit))
        except RuntimeError as exc:
            if "timed out" not in str(exc).lower() and "timeout" not in str(exc).lower():
                raise
            raise self._comm.timed_out(self._op, self._seq, limit) from exc
        self._done = True
        return True

    def is_completed(self) -> bool:
        # Gloo's Work can report False for a while after wait() returned; distcomm's can't.
        self._done = self._done or bool(self._work.is_completed())
        return self._done


class TorchCommunicator(BaseCommunicator):
    """A distcomm communicator over a torch ProcessGroup (``native``)."""

    backend_name: ClassVar[str] = "torch"

    def __init__(
        self,
        group: Any,
        *,
        side: TorchCommunicator | None = None,
        owns_group: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._group = group
        self._side = side
        self._owns_group = owns_group
        self.device: torch.device | None = None
        self._adopted: dict[int, tuple[Any, Communicator]] = {}

    @property
    def native(self) -> Any:
        """The torch ProcessGroup (for DDP's ``process_group=``, FSDP, ...)."""
        return dist.group.WORLD if self._group is None else self._group

    def adopt(self, native: Any) -> Communicator | NonMember:
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

    def timed_out(self, op: str, seq: int, limit: float) -> DistTimeoutError:
        """Mark this communicator unusable after a timeout and return the error to raise."""
        self.unusable = f"{op} (operation #{seq}) timed out after {limit:g} s"
        return DistTimeoutError(
            f"{op} (operation #{seq}) on {self.describe()} did not complete within {limit:g} s; "
            "the communicator can no longer be used. HINT: a rank is stuck or skipped this "
            "call; raise the timeout with init(timeout=...) or DISTCOMM_TIMEOUT if it is slow.",
            op=op,
            seq=seq,
            group=self.describe(),
        )

    def _done(self, work: Any, op: str, async_op: bool) -> Work | None:
        if work is None:
            return None
        wrapped = TorchWork(work, self, op)
        if async_op:
            return wrapped
        wrapped.wait()
        return None

    # -- primitives ---------------------------------------------------------------------------
    def _all_reduce(self, tensor: Any, op: ReduceOp, async_op: bool) -> Work | None:
        work = dist.all_reduce(as_torch(tensor), _OPS[op], self._group, async_op)
        return self._done(work, "all_reduce", async_op)

    def _broadcast(self, tensor: Any, src: int, async_op: bool) -> Work | None:
        work = dist.broadcast(as_torch(tensor), self._global_ranks[src], self._group, async_op)
        return self._done(work, "broadcast", async_op)

    def _reduce(self, tensor: Any, dst: int, op: ReduceOp, async_op: bool) -> Work | None:
        work = dist.reduce(
            as_torch(tensor), self._global_ranks[dst], _OPS[op], self._group, async_op
        )
        return self._done(work, "reduce", async_op)

    def _all_gather_into(self, output: Any, tensor: Any, async_op: bool) -> Work | None:
        work = _all_gather_single(flat(output), flat(tensor), self._group, async_op)
        return self._done(work, "all_gather", async_op)

    def _reduce_scatter(self, output: Any, input: Any, op: ReduceOp, async_op: bool) -> Work | None:
        work = _reduce_scatter_single(flat(output), flat(input), _OPS[op], self._group, async_op)
        return self._done(work, "reduce_scatter", async_op)

    def _gather(self, output: Any | None, tensor: Any, dst: int, async_op: bool) -> Work | None:
        parts = None if output is None else list(flat(output).chunk(self._world_size))
        work = dist.gather(flat(tensor), parts, self._global_ranks[dst], self._group, async_op)
        return self._done(work, "gather", async_op)

    def _scatter(self, output: Any, full: Any | None, src: int, async_op: bool) -> Work | None:
        parts = None if full is None else list(flat(full).chunk(self._world_size))
        work = dist.scatter(flat(output), parts, self._global_ranks[src], self._group, async_op)
        return self._done(work, "scatter", async_op)

    def _all_to_all(self, output: Any, input: Any, async_op: bool) -> Work | None:
        work = dist.all_to_all_single(
            flat(output), flat(input), group=self._group, async_op=async_op
        )
        return self._done(work, "all_to_all_single", async_op)

    def _barrier(self, async_op: bool) -> Work | None:
        return self._done(dist.barrier(self._group, async_op), "barrier", async_op)

    def _isend(self, tensor: Any, dst: int, tag: int) -> Work:
        work = dist.isend(as_torch(tensor), self._global_ranks[dst], self._group, tag)
        return TorchWork(work, self, "send")

    def _irecv(self, tensor: Any, src: int | None, tag: int) -> Work:
        peer = None if src is None else self._global_ranks[src]
        work = dist.irecv(as_torch(tensor), peer, self._group, tag)
        return TorchWork(work, self, "recv")

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
        timeout = datetime.timedelta(seconds=self.timeout)
        pg = dist.new_group(list(ranks), timeout=timeout, use_local_synchronization=local, **_ORDER)
        side_pg = dist.new_group(
            list(ranks), timeout=timeout, backend="gloo", use_local_synchronization=local, **_ORDER
        )
        return pg, side_pg
