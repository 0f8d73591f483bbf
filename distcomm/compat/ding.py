"""DI-engine's ``ding.utils.linklink_dist_helper`` on any distcomm backend.

Change ``from ding.utils import linklink_dist_helper`` to ``from distcomm.compat import ding``.
Kept from DI-engine, because its users rely on it:

- ``allreduce(data, op='sum')`` leaves the **mean** in ``data``, not the sum: DI-engine divides
  by the world size afterwards, and gradient averaging depends on it. ``op='max'`` is the
  maximum. Any other op raises :class:`UnsupportedOpError` naming it (a ValueError and, as
  DI-engine's was, a KeyError).
- ``allreduce_async`` likewise; :func:`synchronize` waits for every pending one.
- ``get_rank()`` is 0 and ``get_world_size()`` 1 when distcomm is not initialised; no exception
  escapes them.
- ``dist_init(method='slurm', device_id=0)``: the launch is detected by distcomm (linklink read
  its environment on its own); ``method`` only picks the CUDA device: rank % device count for
  'slurm', ``device_id`` for 'single_node', none otherwise.

Fixed here (DI-engine differs):

- ``broadcast`` in a world of 1 is a no-op (DI-engine raised under FakeLink).
- ``dist_init`` chooses a CUDA device only when CUDA exists (DI-engine divided by a device count
  of zero on CPU machines); on a GPU backend (nccl) the communicator's GPU, chosen at init, stays
  current, with a warning if ``method``/``device_id`` asked for another (DI-engine set it after
  init: ``dist_init("single_node")`` put every rank on cuda:0, beside its communicator's GPU).
- ``dist_mode(func)`` returns ``func``'s value and finalizes even when ``func`` raises
  (DI-engine did neither).
- ``get_group`` / ``simple_group_split`` return a distcomm communicator, usable as ``group=`` and
  as linklink's ``group_idx``; an unequal split raises ValueError with the sizes.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

import distcomm
from distcomm._runtime.init_forms import use_cuda_device
from distcomm.compat import linklink
from distcomm.errors import DistcommError, InvalidArgumentError
from distcomm.protocol import Communicator, NonMember, ReduceOp, Work

__all__ = [
    "DistContext",
    "UnsupportedOpError",
    "allreduce",
    "allreduce_async",
    "broadcast",
    "dist_finalize",
    "dist_init",
    "dist_mode",
    "get_group",
    "get_rank",
    "get_world_size",
    "simple_group_split",
    "synchronize",
]

F = TypeVar("F", bound=Callable[..., Any])
_OPS = {"sum": ReduceOp.AVG, "max": ReduceOp.MAX}  # 'sum' is DI-engine's mean


class UnsupportedOpError(InvalidArgumentError, KeyError):
    """An allreduce op other than 'sum' or 'max' (a ValueError, and a KeyError as DI-engine's)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _op(op: Any) -> ReduceOp:
    found = _OPS.get(op) if isinstance(op, str) else None
    if found is None:
        raise UnsupportedOpError(
            f"allreduce op {op!r} is not supported; valid: 'sum' (leaves the mean, as DI-engine) "
            "and 'max'. HINT: for other reductions call distcomm.all_reduce(data, op=...)."
        )
    return found


def get_rank() -> int:
    """This rank, or 0 when distcomm is not initialised."""
    try:
        return distcomm.get_rank() if distcomm.is_initialized() else 0
    except DistcommError:
        return 0


def get_world_size() -> int:
    """The world size, or 1 when distcomm is not initialised."""
    try:
        return distcomm.get_world_size() if distcomm.is_initialized() else 1
    except DistcommError:
        return 1


def broadcast(value: Any, rank: int) -> None:
    """Copy rank ``rank``'s tensor ``value`` into every rank's, in place."""
    distcomm.broadcast(value, src=rank)


def allreduce(data: Any, op: str = "sum") -> None:
    """Reduce ``data`` in place: 'sum' leaves the mean (DI-engine divides by the world size),
    'max' the maximum."""
    distcomm.all_reduce(data, op=_op(op))


def allreduce_async(data: Any, op: str = "sum") -> Work:
    """Start :func:`allreduce` ('sum': the mean); :func:`synchronize` waits for it."""
    return linklink.allreduce_async(data, reduce_op=_op(op))


def synchronize() -> None:
    """Wait for every pending :func:`allreduce_async`."""
    linklink.synchronize()


def simple_group_split(world_size: int, rank: int, num_groups: int) -> Communicator | NonMember:
    """Split ranks ``0..world_size-1`` into ``num_groups`` contiguous equal groups; every rank
    creates every group. Returns ``rank``'s group.

    Raises:
        ValueError: ``num_groups`` does not divide ``world_size`` into equal groups.
    """
    for name, value in (("world_size", world_size), ("rank", rank), ("num_groups", num_groups)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidArgumentError(f"{name}={value!r} must be an int")
    if num_groups < 1 or world_size % num_groups:
        raise InvalidArgumentError(
            f"simple_group_split: {world_size} ranks do not split into {num_groups} equal groups "
            "(array split does not result in an equal division). HINT: use a num_groups that "
            f"divides {world_size}."
        )
    if not 0 <= rank < world_size:
        raise InvalidArgumentError(f"rank={rank!r} is not in 0..{world_size - 1}")
    size = world_size // num_groups
    groups = [distcomm.new_group(range(g * size, (g + 1) * size)) for g in range(num_groups)]
    return groups[rank // size]


def get_group(group_size: int | None) -> Communicator | NonMember:
    """This rank's group when the world is cut into groups of ``group_size`` (None: one group).

    Raises:
        ValueError: ``group_size`` does not divide the world size.
    """
    world_size = get_world_size()
    if group_size is None:
        group_size = world_size
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise InvalidArgumentError(f"group_size={group_size!r} must be a positive int or None")
    if world_size % group_size:
        raise InvalidArgumentError(
            f"get_group: a world of {world_size} does not split into groups of {group_size}. "
            f"HINT: use a group_size that divides {world_size}."
        )
    return simple_group_split(world_size, get_rank(), world_size // group_size)


def dist_init(method: str = "slurm", device_id: int = 0) -> tuple[int, int]:
    """Initialise distcomm (launch detected) and return ``(rank, world_size)``.

    ``method`` only picks the CUDA device, and only when CUDA exists: rank % device count for
    'slurm', ``device_id`` for 'single_node', none otherwise.
    """
    linklink.initialize()
    rank, world_size = distcomm.get_rank(), distcomm.get_world_size()
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or method not in ("slurm", "single_node"):
        return rank, world_size
    wanted = rank % torch.cuda.device_count() if method == "slurm" else device_id
    use_cuda_device(distcomm.get_communicator(), wanted, f"dist_init({method!r}, {device_id})")
    return rank, world_size


def dist_finalize() -> None:
    """Finalize (waits for pending async work first)."""
    linklink.finalize()


class DistContext:
    """``with DistContext():`` runs the block initialised, and finalizes after it."""

    def __init__(self) -> None:
        pass

    def __enter__(self) -> None:
        dist_init()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        dist_finalize()


def dist_mode(func: F) -> F:
    """Decorator: initialise before each call, finalize after it (even when it raises), and
    return the function's value."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        dist_init()
        try:
            return func(*args, **kwargs)
        finally:
            dist_finalize()

    return wrapper  # type: ignore[return-value]
