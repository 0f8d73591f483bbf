"""The process group's life and its ranks in torch's terms: ``init_process_group`` and
``destroy_process_group``, ``group.WORLD``, ``new_group``, the rank getters, and the two rules
every function of the drop-in follows: ranks are global (``src``, ``dst``, ``peer``; the
``group_*`` forms take the group's), and a rank outside the group does nothing (torch's warning).
"""

from __future__ import annotations

import datetime
import warnings
from collections.abc import Sequence
from typing import Any

import distcomm
from distcomm._runtime.collectives import resolve_group
from distcomm.errors import DistcommWarning, InvalidArgumentError
from distcomm.protocol import NON_MEMBER, Communicator, NonMember

__all__ = [
    "GroupMember",
    "destroy_process_group",
    "get_backend",
    "get_global_rank",
    "get_group_rank",
    "get_process_group_ranks",
    "get_rank",
    "get_world_size",
    "group",
    "init_process_group",
    "is_available",
    "is_initialized",
    "member",
    "new_group",
    "root",
]


class _World(type):
    """The metaclass that gives ``group.WORLD`` and ``GroupMember.WORLD`` their value."""

    @property
    def WORLD(cls) -> Communicator | None:
        """The default communicator; None before ``init_process_group``."""
        return distcomm.get_communicator() if distcomm.is_initialized() else None


class group(metaclass=_World):
    """torch's ``group``: ``group.WORLD`` is the default communicator (None before init)."""


class GroupMember(metaclass=_World):
    """torch's ``GroupMember``: ``WORLD`` as ``group.WORLD``; ``NON_GROUP_MEMBER`` is what
    ``new_group`` returns on the ranks it leaves out (``distcomm.NON_MEMBER``)."""

    NON_GROUP_MEMBER = NON_MEMBER


def is_available() -> bool:
    """True: distcomm runs wherever it is installed."""
    return True


def is_initialized() -> bool:
    """Whether the default process group exists (``distcomm.is_initialized()``)."""
    return distcomm.is_initialized()


def init_process_group(
    backend: str | None = None,
    init_method: str | None = None,
    timeout: datetime.timedelta | None = None,
    world_size: int = -1,
    rank: int = -1,
    store: Any = None,
    group_name: str = "",
    pg_options: Any = None,
    device_id: Any = None,
) -> None:
    """Initialise distcomm (``distcomm.init``) from torch's arguments.

    Args:
        backend: a distcomm backend's name (``"gloo"``, ``"nccl"``, ``"mpi"``, ...; torch's
            ``"cpu:gloo,cuda:nccl"`` when both name one backend); None: distcomm chooses for
            the launch (``distcomm info --explain`` says why).
        init_method: None or ``"env://"`` (the launch's variables), or ``"tcp://HOST:PORT"``
            (the rendezvous address).
        timeout: every operation's limit; a timed-out one raises DistTimeoutError naming the
            ranks that had not arrived.
        world_size: -1: the launch's.
        rank: -1: the launch's.
        store: must be None: the rendezvous is the launch's or ``init_method``'s.
        group_name: accepted for torch's sake (torch ignores it too).
        pg_options: must be None.
        device_id: the device of this rank (``distcomm.init(device=...)``); an int ``n`` is
            ``"cuda:n"``, as in torch.

    Raises:
        InvalidArgumentError: ``store`` or ``pg_options`` given, an ``init_method`` other than
            those above, or a ``backend`` string that names two backends.
        AlreadyInitializedError: called again with other arguments (called again alike, it
            does nothing, as ``distcomm.init``; torch raises ValueError).
    """
    del group_name
    for name, value in (("store", store), ("pg_options", pg_options)):
        if value is not None:
            raise InvalidArgumentError(
                f"init_process_group({name}={value!r}): distcomm takes no {name}; valid: None. "
                "HINT: the launch's variables (or init_method='tcp://HOST:PORT') make the "
                "rendezvous; drop the argument."
            )
    distcomm.init(
        backend=_backend_name(backend),
        rank=None if rank < 0 else rank,
        world_size=None if world_size < 0 else world_size,
        timeout=timeout,
        device=f"cuda:{device_id}" if isinstance(device_id, int) else device_id,
        **_rendezvous(init_method),
    )


def _backend_name(backend: Any) -> str | None:
    """torch's backend string as one distcomm backend name (None: distcomm chooses)."""
    if backend is None:
        return None
    text = str(backend).strip().lower()
    names = {part.split(":")[-1].strip() for part in text.split(",")}
    if len(names) != 1:
        raise InvalidArgumentError(
            f"init_process_group(backend={backend!r}) names {len(names)} backends; distcomm "
            "runs one per job. HINT: pass one, e.g. backend='gloo' or 'nccl', or None to let "
            "distcomm choose for the device (`distcomm info --explain`)."
        )
    return names.pop()


def _rendezvous(init_method: str | None) -> dict[str, Any]:
    """``init``'s master address and port from torch's ``init_method``."""
    if init_method is None or init_method == "env://":
        return {}
    if init_method.startswith("tcp://"):
        host, _, port = init_method[len("tcp://") :].rpartition(":")
        if host and port.isdigit():
            return {"master_addr": host.strip("[]"), "master_port": int(port)}
    raise InvalidArgumentError(
        f"init_process_group(init_method={init_method!r}) is not a rendezvous distcomm makes; "
        "valid: None, 'env://', 'tcp://HOST:PORT'. HINT: launch with `distcomm run`, torchrun, "
        "srun or mpirun and drop init_method: distcomm reads the launch."
    )


def destroy_process_group(group: Any = None) -> None:
    """Finalize distcomm (None or ``group.WORLD``), or a group of ``new_group``."""
    if group is None or (distcomm.is_initialized() and group is distcomm.get_communicator()):
        distcomm.finalize()
    elif not isinstance(group, NonMember):
        resolve_group(group).finalize()


def new_group(
    ranks: Sequence[int] | None = None,
    timeout: datetime.timedelta | None = None,
    backend: str | None = None,
    pg_options: Any = None,
    use_local_synchronization: bool = False,
    group_desc: str | None = None,
    device_id: Any = None,
    sort_ranks: bool = True,
) -> Communicator | NonMember:
    """A group of the global ``ranks`` (None: all), collective over every rank as in torch.

    Args:
        ranks: global ranks; None: every rank.
        timeout: None or the default group's: a group shares ``init_process_group``'s.
        backend: None or the default group's backend: a group runs on it.
        pg_options: must be None.
        use_local_synchronization: must be False: every rank calls ``new_group``.
        group_desc: a label, accepted for torch's sake.
        device_id: accepted for torch's sake: a group uses the default group's device.
        sort_ranks: False only with ``ranks`` in ascending order: a group numbers its members
            by their global rank.

    Returns:
        The group on its members; ``GroupMember.NON_GROUP_MEMBER`` on the other ranks.

    Raises:
        InvalidArgumentError: an argument distcomm cannot honour (the message says which).
    """
    del group_desc, device_id
    world = resolve_group(None)
    members = list(range(world.world_size)) if ranks is None else list(ranks)
    refused = _refused_group_arguments(world, timeout, backend, pg_options)
    if use_local_synchronization:
        refused = "use_local_synchronization=True: every rank of the world calls new_group"
    elif not sort_ranks and members != sorted(members):
        refused = f"sort_ranks=False with ranks={members}: members are numbered in rank order"
    if refused:
        raise InvalidArgumentError(
            f"new_group({refused}). HINT: drop the argument; docs/from-torch.md lists what "
            "distcomm's groups take."
        )
    return distcomm.new_group(members)


def _refused_group_arguments(
    world: Communicator, timeout: Any, backend: Any, pg_options: Any
) -> str:
    """What ``new_group`` cannot honour among the arguments a group would take from torch."""
    if pg_options is not None:
        return f"pg_options={pg_options!r}: valid: None"
    if backend is not None and str(backend).lower() != world.backend:
        return f"backend={backend!r}: a group runs on the default group's, {world.backend!r}"
    if timeout is not None:
        seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout
        shared = getattr(world, "timeout", None)
        if shared is None or float(seconds) != shared:
            return (
                f"timeout={timeout!r}: a group shares the default group's timeout, {shared} s "
                "(init_process_group(timeout=...))"
            )
    return ""


def member(group: Any, op: str) -> Communicator | None:
    """``group``'s communicator (None: the default one); None, with torch's warning, where this
    rank is not a member (the function then returns without doing anything, as torch's)."""
    if isinstance(group, NonMember):
        warnings.warn(
            f"Running {op} on global rank {distcomm.get_rank()} which does not belong to the "
            "given group.",
            DistcommWarning,
            stacklevel=3,
        )
        return None
    return resolve_group(group)


def root(
    comm: Communicator,
    rank: int | None,
    group_rank: int | None,
    name: str,
    default: int | None = None,
) -> int:
    """The group's rank for torch's global ``rank`` (``src``, ``dst``, ``peer``) or its
    ``group_rank`` (``group_src``, ...); when neither is given, the global rank ``default``
    (torch's gather, scatter and object functions take 0), else an error (torch's broadcast,
    reduce, send and P2POp need one).

    Raises:
        InvalidArgumentError: both given, neither (without a default), or a global rank that is
            not in the group.
    """
    if group_rank is not None:
        if rank is not None:
            raise InvalidArgumentError(
                f"{name}={rank} and group_{name}={group_rank}: give one. HINT: {name} is a "
                f"global rank, group_{name} the group's."
            )
        return group_rank
    if rank is None:
        if default is None:
            raise InvalidArgumentError(
                f"neither {name} nor group_{name} given; one is needed, as in torch. HINT: "
                f"{name}=GLOBAL_RANK, or group_{name}= the group's rank."
            )
        rank = default
    return get_group_rank(comm, rank)


def get_rank(group: Any = None) -> int:
    """This rank in ``group`` (None: the global rank); -1 where it is not a member."""
    if isinstance(group, NonMember):
        return -1
    return distcomm.get_rank(group)


def get_world_size(group: Any = None) -> int:
    """The number of ranks of ``group`` (None: the world); -1 where this rank is not in it."""
    if isinstance(group, NonMember):
        return -1
    return distcomm.get_world_size(group)


def get_global_rank(group: Any, group_rank: int) -> int:
    """The global rank of ``group``'s rank ``group_rank``.

    Raises:
        InvalidArgumentError: ``group_rank`` is not a rank of the group.
    """
    ranks = resolve_group(group).global_ranks
    if not 0 <= group_rank < len(ranks):
        raise InvalidArgumentError(
            f"group_rank={group_rank} is not a rank of the group; valid: 0 to {len(ranks) - 1}. "
            "HINT: get_global_rank(group, r) maps the group's rank r to its global rank."
        )
    return ranks[group_rank]


def get_group_rank(group: Any, global_rank: int) -> int:
    """``group``'s rank of the global rank ``global_rank``.

    Raises:
        InvalidArgumentError: ``global_rank`` is not in the group.
    """
    ranks = resolve_group(group).global_ranks
    if 0 <= global_rank < len(ranks) and ranks[global_rank] == global_rank:
        return global_rank  # the world, and the groups that start like it
    if global_rank in ranks:
        return ranks.index(global_rank)
    raise InvalidArgumentError(
        f"Global rank {global_rank} is not part of the group of global ranks {list(ranks)}. "
        "HINT: src, dst and peer are global ranks here, as in torch; group_src, group_dst and "
        "group_peer take the group's own."
    )


def get_process_group_ranks(group: Any = None) -> list[int]:
    """The global ranks of ``group``'s members, in the group's order (None: the world)."""
    return list(resolve_group(group).global_ranks)


def get_backend(group: Any = None) -> str:
    """The backend's name, e.g. ``"gloo"`` or ``"mpi"`` (every group runs on the default's)."""
    return resolve_group(group).backend
