"""The groups pipeline: new_group, split, split_group and new_subgroups make sub-communicators,
mesh a grid of them; adopt wraps an engine's own.

The members agree on the groups through an all-gather of small objects, then the engine's
``split`` makes every group of one layout in one call, each rank getting its own group's engine,
which the kit makes a communicator (a mesh: one call per dimension).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

from distcomm.backend._pipeline import object_transport as objects
from distcomm.backend._pipeline.arguments import _is_int
from distcomm.backend._pipeline.steps import Steps
from distcomm.errors import InvalidArgumentError
from distcomm.meshes import Mesh, layout
from distcomm.protocol import NON_MEMBER, Capabilities, Communicator, NonMember

__all__ = ["Groups"]


class Groups(Steps):
    """new_group, split, adopt (module docstring)."""

    def new_group(self, ranks: Sequence[int]) -> Communicator | NonMember:
        """Make a sub-communicator of ``ranks``; collective over this communicator.

        Members are numbered in ascending order of their rank here; other ranks get
        :data:`~distcomm.NON_MEMBER`. Every rank must pass the same ranks.
        """
        self._check_usable()
        members = self._check_members(ranks)
        channel = self._objects("new_group")
        seen = [members] if channel is None else objects.all_gather_object(channel, members)
        for r, other in enumerate(seen):
            if other != members:
                raise InvalidArgumentError(
                    f"new_group: rank {self._rank} passed ranks {list(members)} but rank {r} "
                    f"passed {list(other)}. HINT: every rank calls new_group with the same ranks."
                )
        index = 0 if self._rank in members else None
        return self._split_into([members], index)

    def split(self, color: int | None, key: int | None = None) -> Communicator | NonMember:
        """Split into sub-communicators by ``color`` (None: not a member), ordered by ``key``."""
        self._check_usable()
        if color is not None and (
            not isinstance(color, int) or isinstance(color, bool) or color < 0
        ):
            raise InvalidArgumentError(
                f"split: color {color!r} must be a non-negative int, or None to stay out. "
                "HINT: ranks with equal colors form one group."
            )
        if key is not None and (not isinstance(key, int) or isinstance(key, bool)):
            raise InvalidArgumentError(f"split: key {key!r} must be an int or None (None: by rank)")
        mine = (color, self._rank if key is None else key)
        channel = self._objects("split")
        entries = [mine] if channel is None else objects.all_gather_object(channel, mine)
        colors = sorted({c for c, _ in entries if c is not None})
        groups = [
            tuple(
                sorted(
                    (r for r, (c, _) in enumerate(entries) if c == col),
                    key=lambda r: (entries[r][1], r),
                )
            )
            for col in colors
        ]
        index = None if color is None else colors.index(color)
        return self._split_into(groups, index)

    def split_group(self, split_ranks: Sequence[Sequence[int]]) -> Communicator | NonMember:
        """One group per list of ``split_ranks`` (disjoint ranks here), all made in one call;
        this rank's group, or NON_MEMBER where it is in none. Every rank passes the same lists.
        """
        self._check_usable()
        groups = self._check_partition(split_ranks)
        return self._make_groups("split_group", groups)

    def new_subgroups(self, group_size: int) -> Communicator:
        """Split into groups of ``group_size`` consecutive ranks (0..size-1, size..2size-1, ...);
        this rank's group. ``group_size`` must divide the world size."""
        self._check_usable()
        world = self._world_size
        if not _is_int(group_size) or group_size <= 0 or world % group_size:
            raise InvalidArgumentError(
                f"new_subgroups: group_size={group_size!r} must be a positive int that divides "
                f"the world size {world}. HINT: pass one of "
                f"{[n for n in range(1, world + 1) if world % n == 0]}."
            )
        groups = [tuple(range(s, s + group_size)) for s in range(0, world, group_size)]
        made = self._make_groups("new_subgroups", groups)
        assert not isinstance(made, NonMember), "every rank is in one of the groups"
        return made

    def mesh(self, shape: Sequence[int], names: Sequence[str]) -> Mesh:
        """A grid of ``shape`` over the ranks (row-major: the last dimension varies fastest)
        with a group along each named dimension (``mesh["tp"]``), one call per dimension."""
        self._check_usable()
        dims = layout(shape, names, self._world_size)
        groups = {}
        for name, along in dims.items():
            made = self._make_groups("mesh", along)
            assert not isinstance(made, NonMember), "every rank is on every dimension"
            groups[name] = made
        return Mesh(tuple(shape), tuple(names), groups, self)  # type: ignore[arg-type]

    def _make_groups(self, op: str, groups: Sequence[tuple[int, ...]]) -> Communicator | NonMember:
        """Agree with the other ranks on ``groups`` (they must pass the same), then make them."""
        channel = self._objects(op)
        key = [list(g) for g in groups]
        seen = [key] if channel is None else objects.all_gather_object(channel, key)
        for r, other in enumerate(seen):
            if other != key:
                raise InvalidArgumentError(
                    f"{op}: rank {self._rank} made the groups {key} but rank {r} made "
                    f"{other}. HINT: every rank calls {op} with the same arguments."
                )
        index = next((i for i, g in enumerate(groups) if self._rank in g), None)
        return self._split_into(list(groups), index)

    def _check_partition(self, split_ranks: Any) -> list[tuple[int, ...]]:
        world = self._world_size
        try:
            groups = [tuple(sorted(ranks)) for ranks in split_ranks]
        except TypeError:
            groups = [()]
        if not groups or not all(
            g and all(_is_int(r) and 0 <= r < world for r in g) for g in groups
        ):
            raise InvalidArgumentError(
                f"split_group: split_ranks {split_ranks!r} must be lists of ranks of "
                f"{self.describe()} (0..{world - 1}), none empty. HINT: split_group([[0, 1], "
                "[2, 3]])."
            )
        counts = collections.Counter(r for g in groups for r in g)
        twice = sorted(r for r, n in counts.items() if n > 1)
        if twice:
            raise InvalidArgumentError(
                f"split_group: rank(s) {twice} appear twice in {split_ranks!r}: each rank is in "
                "one group at most. HINT: pass disjoint lists."
            )
        return groups

    def group_over(
        self,
        engine: Any,
        members: Sequence[int],
        *,
        name: str | None = None,
        backend: str | None = None,
        capabilities: Capabilities | None = None,
    ) -> Communicator:
        """This rank's communicator over ``members`` (ranks of this communicator, in member
        order; this rank among them) whose traffic ``engine`` moves: a split's group, a GPU
        engine's CPU side channel, a group the engine's own API made (``adopt``). It takes this
        communicator's launch and timeout and, unless given, its backend name and
        capabilities; ``name`` labels it in messages (default ``"group [world ranks]"``)."""
        world = [self._global_ranks[r] for r in members]
        return type(self)(  # type: ignore[call-arg]
            engine,
            backend=backend or self.backend_name,
            capabilities=capabilities or self.capabilities,
            rank=list(members).index(self._rank),
            world_size=len(members),
            launch=self._launch,
            global_ranks=world,
            timeout=self.timeout,
            name=name or f"group {world}",
        )

    def _split_into(
        self, groups: list[tuple[int, ...]], index: int | None
    ) -> Communicator | NonMember:
        """The engine's ``split`` of ``groups`` (every rank calls it alike), this rank's
        (``groups[index]``; None: none) made a communicator that inherits from this one."""
        engine = self._split(groups, index)
        group = NON_MEMBER if index is None else self.group_over(engine, groups[index])
        return self._inherit(group, index)

    def _inherit(
        self, group: Communicator | NonMember, index: int | None
    ) -> Communicator | NonMember:
        """A new group takes this communicator's settings (the check policy, the flight
        recorder) and its lineage: the n-th group made from this communicator, ``index``-th of
        them (``new_group`` and ``split`` are collective here, so every member counts alike),
        so that two groups of the same members are told apart when the ranks compare their
        calls."""
        self._children += 1
        if isinstance(group, Steps):
            group._descend(self, f"{self._lineage}/{self._children}.{index}")
        return group

    def adopt(self, native: Any) -> Communicator | NonMember:
        """A communicator over a group the engine's own API made (a torch ProcessGroup ...).

        For code that mixes distcomm with groups made by the engine directly; the engine's
        ``adopt`` does it. The group stays its creator's (``finalize`` leaves it).
        NON_MEMBER where this rank is not in the group.

        Raises:
            NotSupportedError: this backend cannot wrap engine groups.
        """
        self._check_usable()
        return self._adopt(native)
