"""Checks of sub-communicators: ``new_group``, ``split``, ``split_group``, ``new_subgroups``,
``mesh``, nesting, and non-members.

Inside a group every rank (``src``, ``dst``, ``recv``'s result) is a rank of the group, and
``global_ranks`` maps them to the world. Ranks outside get ``distcomm.NON_MEMBER``, which is falsy
and refused by every collective.
"""

from __future__ import annotations

from typing import Any

import distcomm
from distcomm.errors import DistcommError, InvalidArgumentError, NotSupportedError
from distcomm.testing.conformance.registry import check
from distcomm.testing.conformance.support import (
    cases,
    comm,
    expect,
    expect_values,
    make,
    p2p_tag,
    raises,
)


def _exercise(group: Any, members: list[int]) -> None:
    """Run collectives in ``group`` (world ranks ``members``, in group order) and check them."""
    rank, size = distcomm.get_rank(), len(members)
    expect(bool(group), f"a member got a falsy group: {group!r}")
    expect(group.world_size == size, f"group.world_size is {group.world_size}, expected {size}")
    expect(
        tuple(group.global_ranks) == tuple(members),
        f"group.global_ranks is {group.global_ranks!r}, expected {tuple(members)}",
    )
    expect(
        group.rank == members.index(rank),
        f"group.rank is {group.rank}, expected {members.index(rank)}",
    )
    last = size - 1
    for lib, dtype in cases(lambda d: d == "int64"):
        t = make(lib, dtype, [rank, 1])
        distcomm.all_reduce(t, group=group)
        expect_values(t, [sum(members), size], f"all_reduce in group {members}")
        t = make(lib, dtype, [rank])
        distcomm.broadcast(t, src=last, group=group)
        expect_values(t, [members[last]], f"broadcast from group rank {last} in group {members}")
        t = make(lib, dtype, [rank])
        distcomm.reduce(t, dst=last, op="max", group=group)
        if group.rank == last:
            expect_values(t, [max(members)], f"reduce to group rank {last} in group {members}")
        out = make(lib, dtype, [-1] * size)
        distcomm.all_gather_into_tensor(out, make(lib, dtype, [rank]), group=group)
        expect_values(out, members, f"all_gather_into_tensor in group {members}")
        parts = [make(lib, dtype, [-1]) for _ in range(size)] if group.rank == last else None
        distcomm.gather(make(lib, dtype, [rank]), parts, dst=last, group=group)
        if parts is not None:
            expect(
                [p.tolist() for p in parts] == [[m] for m in members], f"gather in group {members}"
            )
        if size > 1 and group.capabilities.p2p:
            nxt, prev = (group.rank + 1) % size, (group.rank - 1) % size
            buf = make(lib, dtype, [-1])
            send = distcomm.isend(make(lib, dtype, [rank]), nxt, group=group, tag=p2p_tag(3))
            source = distcomm.recv(buf, prev, group=group, tag=p2p_tag(3))
            send.wait()
            expect(
                source == prev,
                f"recv in group {members} returned {source!r}, expected group rank {prev}",
            )
            expect_values(buf, [members[prev]], f"send/recv in group {members}")
        raises(InvalidArgumentError, distcomm.broadcast, t, src=size, group=group)
    expect(
        distcomm.all_gather_object(rank, group=group) == members,
        f"all_gather_object in group {members}",
    )
    distcomm.barrier(group=group)


def _refused(group: Any) -> None:
    """Check that a non-member got NON_MEMBER and that collectives refuse it."""
    expect(group is distcomm.NON_MEMBER, f"a non-member got {group!r}, not distcomm.NON_MEMBER")
    expect(not group, "NON_MEMBER must be falsy")
    for lib, dtype in cases(lambda d: d == "float32"):
        t = make(lib, dtype, [1.0])
        raises(InvalidArgumentError, distcomm.all_reduce, t, group=group)
        raises(InvalidArgumentError, distcomm.broadcast, t, src=0, group=group)
    raises(InvalidArgumentError, distcomm.barrier, group=group)
    raises(InvalidArgumentError, distcomm.broadcast_object, 1, group=group)
    raises(InvalidArgumentError, distcomm.all_reduce, 1, group=group)


def _world_still_works() -> None:
    world = distcomm.get_world_size()
    got = distcomm.all_reduce(distcomm.get_rank())
    expect(got == world * (world - 1) // 2, f"a world all_reduce after group work returned {got!r}")


@check
def new_group_even_ranks() -> None:
    """new_group of the even ranks: local numbering, collectives with group ranks, non-members."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    evens = list(range(0, world, 2))
    group = distcomm.new_group(evens)
    if rank in evens:
        _exercise(group, evens)
    else:
        _refused(group)
    _world_still_works()


@check
def new_group_single_rank() -> None:
    """new_group of the last rank alone: a world of 1 in which collectives are identities."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    group = distcomm.new_group([world - 1])
    if rank == world - 1:
        _exercise(group, [world - 1])
    else:
        _refused(group)
    _world_still_works()


@check
def new_group_of_everyone() -> None:
    """new_group of every rank (in any order) numbers members in ascending order."""
    world = distcomm.get_world_size()
    group = distcomm.new_group(list(reversed(range(world))))
    _exercise(group, list(range(world)))
    _world_still_works()


@check
def split_by_parity_reversed() -> None:
    """comm.split(color=parity, key=-rank): groups by parity, members in descending rank order."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    group = comm().split(rank % 2, key=world - rank)
    members = sorted((r for r in range(world) if r % 2 == rank % 2), reverse=True)
    _exercise(group, members)
    _world_still_works()


@check
def split_with_color_none() -> None:
    """comm.split(None) leaves a rank out; the others form one group ordered by rank."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    group = comm().split(None if rank == world - 1 else 5)
    if rank == world - 1:
        _refused(group)
    else:
        _exercise(group, list(range(world - 1)))
    _world_still_works()


@check
def split_group_and_new_subgroups() -> None:
    """split_group gives each rank the group of its list in one call (NON_MEMBER outside every
    list); new_subgroups(size) groups consecutive ranks."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    halves = [list(range(0, world, 2)), list(range(1, world - 1, 2))]
    lists = [h for h in halves if h]
    group = distcomm.split_group(lists)
    mine = next((h for h in lists if rank in h), None)
    if mine is None:
        _refused(group)
    else:
        _exercise(group, mine)
    size = 2 if world % 2 == 0 else 1
    sub = distcomm.new_subgroups(size)
    _exercise(sub, list(range(rank - rank % size, rank - rank % size + size)))
    _world_still_works()


@check
def mesh_groups_along_each_dimension() -> None:
    """mesh((a, b), ("dp", "tp")): row-major coordinates; mesh["tp"] holds the ranks of this
    rank's row, mesh["dp"] those of its column; each is a working communicator."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    rows = 2 if world % 2 == 0 else 1
    cols = world // rows
    grid: Any = distcomm.mesh((rows, cols), ("dp", "tp"))
    row, col = divmod(rank, cols)
    expect(grid.coordinate == (row, col), f"mesh.coordinate {grid.coordinate} != {(row, col)}")
    _exercise(grid["tp"], [row * cols + c for c in range(cols)])
    _exercise(grid["dp"], [r * cols + col for r in range(rows)])
    raises(InvalidArgumentError, grid.__getitem__, "pp")
    _world_still_works()


@check
def nested_groups() -> None:
    """A group made from a group (new_group with group=, and split) maps to world ranks."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    parity: Any = comm().split(rank % 2, key=world - rank)
    if not comm().capabilities.subgroup_split:
        exc = raises(NotSupportedError, distcomm.new_group, [0], group=parity)
        expect("world" in str(exc), f"the refusal does not say to split the world: {exc}")
        raises(NotSupportedError, parity.split, 0)
        _world_still_works()
        return
    outer = sorted((r for r in range(world) if r % 2 == rank % 2), reverse=True)
    chosen = list(range(1, len(outer))) or [0]
    inner: Any = distcomm.new_group(chosen, group=parity)
    if parity.rank in chosen:
        _exercise(inner, [outer[k] for k in chosen])
        deepest = inner.split(0, key=-inner.rank)
        _exercise(deepest, list(reversed([outer[k] for k in chosen])))
    else:
        _refused(inner)
    _world_still_works()


@check
def finalized_group() -> None:
    """A finalized group refuses collectives; finalize is idempotent; the world is unaffected."""
    world = distcomm.get_world_size()
    group: Any = distcomm.new_group(list(range(world)))
    distcomm.barrier(group=group)
    group.finalize()
    group.finalize()
    for lib, dtype in cases(lambda d: d == "int32"):
        raises(DistcommError, distcomm.all_reduce, make(lib, dtype, [1]), group=group)
    raises(DistcommError, distcomm.barrier, group=group)
    raises(DistcommError, distcomm.all_gather_object, 1, group=group)
    _world_still_works()


@check
def new_group_errors() -> None:
    """new_group rejects out-of-range, duplicate and empty rank lists before communicating."""
    world = distcomm.get_world_size()
    for ranks in ([world], [-1], [0, 0], [], ["0"]):
        raises(InvalidArgumentError, distcomm.new_group, ranks)
    raises(InvalidArgumentError, comm().split, -1)
    raises(InvalidArgumentError, comm().split, "a")
    bad_lists: list[Any] = [[[0, world]], [[0], [0]], [[]], [], 5]
    for lists in bad_lists:
        raises(InvalidArgumentError, distcomm.split_group, lists)
    for size in (0, world + 1, "2", True):
        raises(InvalidArgumentError, distcomm.new_subgroups, size)
    for shape, names in (((world + 1,), ("dp",)), ((world,), ("dp", "tp")), ((world,), ("",))):
        raises(InvalidArgumentError, distcomm.mesh, shape, names)
