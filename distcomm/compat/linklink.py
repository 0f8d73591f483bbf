"""The ``linklink`` API (SenseTime's communication library) on any distcomm backend.

Code written as ``import linklink as link`` runs unchanged on gloo, mpi, nccl, fakelink or a
plugin after :func:`install` (or by changing the import to
``from distcomm.compat import linklink as link``)::

    from distcomm.compat import linklink
    linklink.install()          # `import linklink` now resolves to this module

    import linklink as link
    link.initialize()           # distcomm.init(): backend from DISTCOMM_BACKEND, or automatic
    link.allreduce(grad)        # SUM in place
    link.allreduce_async("w", grad)
    link.synchronize()          # waits for every pending allreduce_async
    link.finalize()

Groups: ``new_group(ranks)`` is called by every rank (as in linklink) and returns an int handle
for ``group_idx``; ``group.WORLD`` (0) and None mean the world. A distcomm communicator is
accepted as ``group_idx`` too. Ranks inside a group (``root``, ``dst``) are ranks of that group,
as everywhere in distcomm. Handles belong to the current world: after ``finalize()`` and a new
``initialize()`` only ``group.WORLD`` is valid.

Before ``initialize()`` the getters answer from the detected launch, as distcomm's do.
"""

from __future__ import annotations

import sys
import types
import weakref
from collections.abc import Sequence
from typing import Any

import distcomm
from distcomm.errors import InvalidArgumentError
from distcomm.protocol import Communicator, NonMember, ReduceOp, Work

__all__ = [
    "allgather",
    "allreduce",
    "allreduceOp_t",
    "allreduce_async",
    "barrier",
    "broadcast",
    "finalize",
    "gather",
    "get_backend",
    "get_local_rank",
    "get_rank",
    "get_world_size",
    "group",
    "initialize",
    "install",
    "is_initialized",
    "new_group",
    "synchronize",
    "syncbnVarMode_t",
]

#: Marks this module as distcomm's stand-in, so the ``linklink`` backend never runs on itself.
__distcomm_shim__ = True


class allreduceOp_t:
    """linklink's reduce operations (distcomm ReduceOp members; any distcomm op works too)."""

    Sum = ReduceOp.SUM
    Max = ReduceOp.MAX
    Min = ReduceOp.MIN


class syncbnVarMode_t:
    """linklink's SyncBatchNorm variance modes (constants only: no SyncBatchNorm here)."""

    L1 = "L1"
    L2 = "L2"


class group:
    """``group.WORLD``: the handle of the whole world."""

    WORLD = 0


class _World:
    """What linklink keeps per initialised world: group handles and pending async work."""

    def __init__(self, comm: Communicator) -> None:
        self.groups: list[Communicator | NonMember] = [comm]
        self.pending: list[Work] = []


_worlds: weakref.WeakKeyDictionary[Any, _World] = weakref.WeakKeyDictionary()


def _world() -> _World:
    comm = distcomm.get_communicator() if distcomm.is_initialized() else None
    if comm is None:
        from distcomm._runtime.collectives import resolve_group

        comm = resolve_group(None)  # a world of 1 before init; NotInitializedError otherwise
    found = _worlds.get(comm)
    if found is None:
        found = _worlds[comm] = _World(comm)
    return found


def _group(group_idx: Any) -> Any:
    if group_idx is None:
        return None
    if isinstance(group_idx, bool) or not isinstance(group_idx, int):
        return group_idx  # a communicator (distcomm checks it)
    groups = _world().groups
    if not 0 <= group_idx < len(groups):
        raise InvalidArgumentError(
            f"group_idx={group_idx!r} is not a group of this world; valid: group.WORLD (0) and "
            f"the handles new_group returned here (1 to {len(groups) - 1}). HINT: handles do "
            "not survive finalize(); create groups again after initialize()."
        )
    return groups[group_idx]


# -- lifecycle ---------------------------------------------------------------------------------
def initialize(backend: str | None = None, **options: Any) -> None:
    """Start distcomm (``distcomm.init``); a no-op when it runs already."""
    distcomm.init(backend=backend, **options)


def finalize() -> None:
    """Wait for pending async work, then stop distcomm (``distcomm.finalize``)."""
    if distcomm.is_initialized():
        synchronize()
    distcomm.finalize()


def is_initialized() -> bool:
    return distcomm.is_initialized()


def get_rank() -> int:
    return distcomm.get_rank()


def get_world_size() -> int:
    return distcomm.get_world_size()


def get_local_rank() -> int:
    return distcomm.get_local_rank()


def get_backend() -> str | None:
    """The distcomm backend moving the bytes (``"gloo"``, ``"mpi"``, ...), None before init."""
    return distcomm.get_backend()


# -- collectives ---------------------------------------------------------------------------------
def allreduce(tensor: Any, reduce_op: Any = allreduceOp_t.Sum, group_idx: Any = None) -> None:
    """Reduce ``tensor`` in place on every rank of the group."""
    distcomm.all_reduce(tensor, op=reduce_op, group=_group(group_idx))


def allreduce_async(*args: Any, reduce_op: Any = allreduceOp_t.Sum, group_idx: Any = None) -> Work:
    """Start an in-place allreduce; :func:`synchronize` waits for all of them.

    Both linklink forms: ``allreduce_async(name, tensor)`` (the name labels the operation, as in
    gradient hooks) and ``allreduce_async(tensor, reduce_op=...)``. Returns the Work.
    """
    rest = args[1:] if args and isinstance(args[0], str) else args
    if not 1 <= len(rest) <= 3:
        raise TypeError(
            "allreduce_async takes (name, tensor) or (tensor), then optionally reduce_op and "
            f"group_idx; got {len(args)} positional argument(s)"
        )
    tensor = rest[0]
    if len(rest) > 1:
        reduce_op = rest[1]
    if len(rest) > 2:
        group_idx = rest[2]
    work = distcomm.all_reduce(tensor, op=reduce_op, group=_group(group_idx), async_op=True)
    _world().pending.append(work)
    return work  # type: ignore[no-any-return]


def synchronize() -> None:
    """Wait for every pending :func:`allreduce_async` of this world."""
    pending = _world().pending
    while pending:
        pending.pop(0).wait()


def broadcast(tensor: Any, root: int, group_idx: Any = None) -> None:
    """Copy ``root``'s ``tensor`` into every rank's."""
    distcomm.broadcast(tensor, src=root, group=_group(group_idx))


def allgather(output: Any, tensor: Any, group_idx: Any = None) -> None:
    """Every rank's ``tensor`` into ``output``: a list (one per rank) or one tensor of world
    size times as many elements, rank by rank."""
    if isinstance(output, (list, tuple)):
        distcomm.all_gather(list(output), tensor, group=_group(group_idx))
    else:
        distcomm.all_gather_into_tensor(output, tensor, group=_group(group_idx))


def gather(output: Sequence[Any] | None, tensor: Any, dst: int, group_idx: Any = None) -> None:
    """Every rank's ``tensor`` into ``dst``'s ``output`` list; other ranks' lists are ignored."""
    target = _group(group_idx)
    comm = target if target is not None else _world().groups[0]
    here = getattr(comm, "rank", None)  # NON_MEMBER has none: distcomm raises its error
    gather_list = list(output) if here == dst and output is not None else None
    distcomm.gather(tensor, gather_list, dst, group=target)


def barrier(group_idx: Any = None) -> None:
    """Wait for every rank of the group."""
    distcomm.barrier(group=_group(group_idx))


def new_group(ranks: Sequence[int]) -> int:
    """A group of ``ranks`` (world ranks); every rank calls it, members or not. Returns its
    handle for ``group_idx``."""
    world = _world()
    world.groups.append(distcomm.new_group(list(ranks), group=world.groups[0]))
    return len(world.groups) - 1


# -- import hook ---------------------------------------------------------------------------------
def install(name: str = "linklink") -> types.ModuleType:
    """Make ``import <name>`` resolve to this module: ``"linklink"`` or ``"spring.linklink"``.

    Returns this module. A real linklink already imported is replaced for later imports.
    """
    if name not in ("linklink", "spring.linklink"):
        raise InvalidArgumentError(
            f"install(name={name!r}): valid names are 'linklink' and 'spring.linklink'"
        )
    me = sys.modules[__name__]
    sys.modules[name] = me
    if name == "spring.linklink":
        parent = sys.modules.get("spring")
        if parent is None:
            parent = sys.modules["spring"] = types.ModuleType("spring")
            parent.__path__ = []  # a package, so `import spring.linklink` works
        parent.linklink = me  # type: ignore[attr-defined]
    return me


def _run_script(argv: Sequence[str]) -> None:
    """``python -m distcomm.compat.linklink script.py [args...]``: :func:`install`, then run an
    unmodified linklink script as ``__main__``."""
    import runpy

    from distcomm.compat import linklink  # the module proper, not this __main__ copy

    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m distcomm.compat.linklink SCRIPT [ARGS...]", file=sys.stderr)
        raise SystemExit(0 if argv else 2)
    linklink.install()
    sys.argv = list(argv)
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    _run_script(sys.argv[1:])
