"""`LinklinkCommunicator`: distcomm's primitives over the linklink module's API.

linklink has all-reduce (SUM, MAX, MIN), broadcast, all-gather, a barrier and groups that every
rank of the world creates; distcomm builds the rest on those (reduce-scatter, gather, scatter and
all-to-all through all-gather or broadcast, PRODUCT and bitwise ops by gathering, AVG by SUM).
There are no point-to-point messages and no timeouts: the capabilities say so, and send / recv
raise NotSupportedError. Tensors reach linklink as torch tensors sharing the caller's memory.
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar

from distcomm import (
    NON_MEMBER,
    BackendUnavailableError,
    InvalidArgumentError,
    LaunchInfo,
    ReduceOp,
)
from distcomm.backend import BaseCommunicator, Capabilities, adapter_for, as_torch
from distcomm.errors import NotSupportedError
from distcomm.protocol import Communicator, NonMember, Work
from distcomm_linklink.plugin import LINKLINK_CAPABILITIES, find_module

__all__ = ["LinklinkCommunicator", "create"]


class LinklinkCommunicator(BaseCommunicator):
    """A distcomm communicator over linklink; ``native`` is the linklink module."""

    backend_name: ClassVar[str] = "linklink"
    capabilities: ClassVar[Capabilities] = LINKLINK_CAPABILITIES
    devices = frozenset({"cpu", "cuda"})  # tensors go to linklink on the device they are on

    def __init__(self, link: Any, handle: int | None, *, owns: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._link = link
        self._handle = handle  # linklink's group_idx; None: the world
        self._owns = owns
        # linklink numbers a group's members by world rank (as torch does); distcomm's order
        # (split's key) may differ: the position in linklink's order of each rank here.
        ordered = sorted(self.global_ranks)
        positions = [ordered.index(g) for g in self.global_ranks]
        self._positions = None if positions == list(range(len(positions))) else positions
        ops = link.allreduceOp_t
        self._ops = {ReduceOp.SUM: ops.Sum, ReduceOp.MAX: ops.Max, ReduceOp.MIN: ops.Min}

    @property
    def native(self) -> Any:
        """The linklink module."""
        return self._link

    def _group_args(self) -> dict[str, Any]:
        return {} if self._handle is None else {"group_idx": self._handle}

    def _all_reduce(self, tensor: Any, op: ReduceOp, async_op: bool) -> Work | None:
        self._link.allreduce(as_torch(tensor), reduce_op=self._ops[op], **self._group_args())
        return None

    def _broadcast(self, tensor: Any, src: int, async_op: bool) -> Work | None:
        root = self.global_ranks[src]  # linklink's root is a rank of the world
        self._link.broadcast(as_torch(tensor), root, **self._group_args())
        return None

    def _all_gather_into(self, output: Any, tensor: Any, async_op: bool) -> Work | None:
        flat_out, flat_in = as_torch(output).view(-1), as_torch(tensor).view(-1)
        if self._positions is None:
            self._link.allgather(flat_out, flat_in, **self._group_args())
            return None
        scratch = flat_out.new_empty(flat_out.shape)
        self._link.allgather(scratch, flat_in, **self._group_args())
        n = flat_in.numel()
        for r, p in enumerate(self._positions):  # linklink's order to this communicator's
            flat_out[r * n : (r + 1) * n].copy_(scratch[p * n : (p + 1) * n])
        return None

    def _all_to_all(self, output: Any, input: Any, async_op: bool) -> Work | None:
        """Through one all-gather (linklink has no point-to-point): rank r keeps chunk r of
        every rank's input."""
        adapter = adapter_for(input)
        numel, size = adapter.numel(input), self.world_size
        chunk = numel // size
        everything = adapter.empty(input, numel * size)
        self._all_gather_into(everything, input, False)
        full, out = adapter.flat(everything), adapter.flat(output)
        for r in range(size):
            start = r * numel + self.rank * chunk
            adapter.copy_(out[r * chunk : (r + 1) * chunk], full[start : start + chunk])
        return None

    def _barrier(self, async_op: bool) -> Work | None:
        if self._handle is None:
            self._link.barrier()
            return None
        return super()._barrier(async_op)

    def _isend(self, tensor: Any, dst: int, tag: int) -> Work:
        raise NotSupportedError("linklink has no point-to-point messages")

    def _irecv(self, tensor: Any, src: int | None, tag: int) -> Work:
        raise NotSupportedError("linklink has no point-to-point messages")

    def _split(self, groups: list[tuple[int, ...]], index: int | None) -> Communicator | NonMember:
        if self._handle is not None:
            raise NotSupportedError(
                f"linklink makes groups on the whole world (every rank calls new_group), so "
                f"{self.describe()} cannot be split. HINT: split the world instead: "
                "distcomm.new_group(world_ranks) on every rank."
            )
        handles = [
            self._link.new_group(ranks=[self.global_ranks[r] for r in members])
            for members in groups
        ]
        if index is None:
            return NON_MEMBER
        members = groups[index]
        return LinklinkCommunicator(
            self._link, handles[index], owns=False, **self._group_arguments(members)
        )

    def _finalize(self) -> None:
        if self._owns:
            self._link.finalize()


def create(
    launch: LaunchInfo, *, timeout: float = 1800.0, device: str | None = None, **options: Any
) -> LinklinkCommunicator:
    """Factory of ``linklink``: ``initialize()`` the linklink module and wrap its world.

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
    return LinklinkCommunicator(
        link, None, owns=owns, rank=rank, world_size=size, launch=launch, timeout=timeout
    )
