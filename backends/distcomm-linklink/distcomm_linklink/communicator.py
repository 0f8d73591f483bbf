"""`LinklinkEngine`: distcomm's engine methods over the linklink module's API.

linklink has all-reduce (SUM, MAX, MIN), broadcast, all-gather, a barrier and groups that every
rank of the world creates; distcomm builds the rest on those (reduce-scatter, gather and scatter
through all-gather or broadcast, PRODUCT and bitwise ops by gathering, AVG by SUM), and the
engine builds all-to-all on one all-gather. There are no point-to-point messages and no
timeouts: the capabilities say so, and distcomm refuses send / recv. Tensors reach linklink as
torch tensors sharing the caller's memory.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from distcomm.backend import LaunchInfo, as_torch
from distcomm.errors import BackendUnavailableError, InvalidArgumentError, NotSupportedError
from distcomm.protocol import ReduceOp
from distcomm_linklink.plugin import find_module

if TYPE_CHECKING:
    from distcomm.protocol import Work

__all__ = ["LinklinkEngine", "create"]


class LinklinkEngine:
    """An engine over linklink's world or one of its groups; ``native`` is the linklink module.

    Args:
        link: the linklink module.
        handle: linklink's ``group_idx`` of the group; None: the world.
        ranks: the world rank of each member, in distcomm's order.
        owns: whether ``finalize`` finalizes linklink (the world's engine, when it initialized
            linklink).
    """

    devices = frozenset({"cpu", "cuda"})  # tensors go to linklink on the device they are on

    def __init__(self, link: Any, handle: int | None, ranks: Sequence[int], *, owns: bool) -> None:
        self.native = link
        self._handle, self._ranks, self._owns = handle, tuple(ranks), owns
        self._me = self._ranks.index(int(link.get_rank()))
        self._group = {} if handle is None else {"group_idx": handle}
        # linklink numbers a group's members by world rank (as torch does); distcomm's order
        # (split's key) may differ: the position in linklink's order of each rank here.
        ordered = sorted(self._ranks)
        positions = [ordered.index(g) for g in self._ranks]
        self._positions = None if positions == list(range(len(positions))) else positions
        ops = link.allreduceOp_t
        self._ops = {ReduceOp.SUM: ops.Sum, ReduceOp.MAX: ops.Max, ReduceOp.MIN: ops.Min}

    def all_reduce(self, tensor: Any, op: ReduceOp, async_op: bool) -> Work | None:
        self.native.allreduce(as_torch(tensor), reduce_op=self._ops[op], **self._group)
        return None

    def broadcast(self, tensor: Any, src: int, async_op: bool) -> Work | None:
        root = self._ranks[src]  # linklink's root is a rank of the world
        self.native.broadcast(as_torch(tensor), root, **self._group)
        return None

    def all_gather_into(self, output: Any, tensor: Any, async_op: bool) -> Work | None:
        flat_out, flat_in = as_torch(output).view(-1), as_torch(tensor).view(-1)
        if self._positions is None:
            self.native.allgather(flat_out, flat_in, **self._group)
            return None
        scratch = flat_out.new_empty(flat_out.shape)
        self.native.allgather(scratch, flat_in, **self._group)
        n = flat_in.numel()
        for r, p in enumerate(self._positions):  # linklink's order to this communicator's
            flat_out[r * n : (r + 1) * n].copy_(scratch[p * n : (p + 1) * n])
        return None

    def all_to_all(self, output: Any, input: Any, async_op: bool) -> Work | None:
        """Through one all-gather (linklink has no point-to-point): rank r keeps chunk r of
        every rank's input."""
        flat_in, size = as_torch(input).view(-1), len(self._ranks)
        everything = flat_in.new_empty(flat_in.numel() * size)
        self.all_gather_into(everything, flat_in, False)
        chunks = everything.view(size, size, flat_in.numel() // size)  # [sender, receiver]
        mine = chunks[:, self._me]
        as_torch(output).view(-1).copy_(mine.reshape(-1))
        return None

    def barrier(self, async_op: bool) -> Work | None:
        if self._handle is None:
            self.native.barrier()
        else:  # linklink's barrier waits for the whole world: a group gathers one byte
            self.all_gather_into(bytearray(len(self._ranks)), bytearray(1), False)
        return None

    def isend(self, tensor: Any, dst: int, tag: int) -> Work:
        raise NotSupportedError("linklink has no point-to-point messages")

    def irecv(self, tensor: Any, src: int | None, tag: int) -> Work:
        raise NotSupportedError("linklink has no point-to-point messages")

    def split(self, groups: list[tuple[int, ...]], index: int | None) -> LinklinkEngine | None:
        if self._handle is not None:
            raise NotSupportedError(
                f"linklink makes groups on the whole world (every rank calls new_group), so the "
                f"group of world ranks {list(self._ranks)} cannot be split. HINT: split the world "
                "instead: distcomm.new_group(world_ranks) on every rank."
            )
        members = [[self._ranks[r] for r in group] for group in groups]
        handles = [self.native.new_group(ranks=ranks) for ranks in members]
        if index is None:
            return None
        return LinklinkEngine(self.native, handles[index], members[index], owns=False)

    def finalize(self) -> None:
        if self._owns:
            self.native.finalize()


def create(
    launch: LaunchInfo, *, timeout: float = 1800.0, device: str | None = None, **options: Any
) -> LinklinkEngine:
    """Factory of ``linklink``: ``initialize()`` the linklink module; the engine of its world.

    Raises:
        BackendUnavailableError: no linklink module, or its world differs from the launch's.
        InvalidArgumentError: options (linklink takes none).
    """
    if options:
        raise InvalidArgumentError(
            f"backend 'linklink' takes no options, got {sorted(options)!r}. HINT: linklink "
            "reads its own cluster environment; remove them from init()."
        )
    name, why = find_module()
    if name is None:
        raise BackendUnavailableError(
            f"linklink: {why}. HINT: `distcomm info` says what the linklink backend needs.",
            backend="linklink",
            reason=why,
        )
    link = importlib.import_module(name)
    owns = not link.is_initialized()
    if owns:
        link.initialize()
    size, rank = int(link.get_world_size()), int(link.get_rank())
    if (size, rank) != (launch.world_size, launch.rank):
        raise BackendUnavailableError(
            f"linklink: its world says rank {rank} of {size}, but the {launch.method} launch "
            f"says rank {launch.rank} of {launch.world_size}. HINT: start the job the way "
            "linklink expects (e.g. srun), with one process per rank.",
            backend="linklink",
            reason="linklink's world differs from the launch",
        )
    return LinklinkEngine(link, None, range(size), owns=owns)
