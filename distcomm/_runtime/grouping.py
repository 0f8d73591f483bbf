"""Module-level group making: ``new_group``, ``split_group``, ``new_subgroups`` and ``mesh``,
collective over the default communicator or ``group=``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from distcomm._runtime.collectives import resolve_group
from distcomm.protocol import Communicator, NonMember

if TYPE_CHECKING:
    from distcomm.meshes import Mesh

__all__ = ["mesh", "new_group", "new_subgroups", "split_group"]


def new_group(ranks: Sequence[int], group: Any = None) -> Communicator | NonMember:
    """A sub-communicator of ``ranks`` (of ``group``, default the world); collective over it.

    Every rank of the parent calls it, members and non-members alike, with the same
    ``ranks``. Members are numbered in ascending order of their parent rank, as in torch.

    Args:
        ranks: distinct, valid ranks of the parent; at least one.
        group: the parent communicator; None: the default one.

    Returns:
        The new communicator on its members; ``NON_MEMBER`` (falsy) on the other ranks.

    Raises:
        InvalidArgumentError: ``ranks`` empty, repeated, out of range, or not the same on all.
    """
    return resolve_group(group).new_group(ranks)


def split_group(
    split_ranks: Sequence[Sequence[int]], group: Any = None
) -> Communicator | NonMember:
    """Make one group per list of ``split_ranks`` in one call; return this rank's.

    Collective over ``group``: every rank passes the same lists (disjoint ranks of ``group``).
    Each rank gets the group it is in, NON_MEMBER where it is in none.

    Args:
        split_ranks: lists of ranks, e.g. ``[[0, 1], [2, 3]]``.
        group: the communicator split; None: the default one.

    Raises:
        InvalidArgumentError: a rank in two lists, a rank that is not one, an empty list, or
            ranks that passed different lists.
    """
    return resolve_group(group).split_group(split_ranks)


def new_subgroups(group_size: int, group: Any = None) -> Communicator:
    """Split into groups of ``group_size`` consecutive ranks; return this rank's.

    Collective over ``group``. Rank ``r`` is in group ``r // group_size``, as torch's
    ``new_subgroups``.

    Args:
        group_size: a positive int that divides the world size.
        group: the communicator split; None: the default one.
    """
    return resolve_group(group).new_subgroups(group_size)


def mesh(shape: Sequence[int], names: Sequence[str], group: Any = None) -> Mesh:
    """Lay the ranks out on a grid; a group along each named dimension (``mesh["dp"]``).

    Collective over ``group``; one call per dimension makes every group of that dimension.
    Row-major, as torch's ``init_device_mesh``: on 4 ranks, ``mesh((2, 2), ("dp", "tp"))``
    gives ranks 0 and 1 (and 2 and 3) one ``tp`` group, ranks 0 and 2 (and 1 and 3) one ``dp``
    group. ``mesh.torch()`` is torch's ``DeviceMesh`` of the same layout.

    Args:
        shape: positive ints whose product is the world size.
        names: a distinct name per dimension.
        group: the communicator laid out; None: the default one.

    Returns:
        A :class:`~distcomm.Mesh`.
    """
    return resolve_group(group).mesh(shape, names)
