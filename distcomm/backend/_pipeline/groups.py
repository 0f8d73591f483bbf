"""The groups pipeline: new_group and split make sub-communicators; adopt wraps an engine's own.

The members agree on the groups through an all-gather of small objects, then the backend's
``_split`` primitive makes one engine communicator per group.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from distcomm import _object_codec as objects
from distcomm.backend._pipeline.steps import Steps
from distcomm.errors import InvalidArgumentError
from distcomm.protocol import Communicator, NonMember

__all__ = ["Groups"]


class Groups(Steps):
    """new_group, split, adopt (module docstring)."""

    def new_group(self, ranks: Sequence[int]) -> Communicator | NonMember:
        """Make a sub-communicator of ``ranks``; collective over this communicator.

        Members are numbered in ascending order of their rank here; other ranks get
        :data:`~distcomm.NON_MEMBER`. Every rank must pass the same ranks.
        """
        self._kit_check_usable()
        members = self._kit_check_members(ranks)
        channel = self._kit_objects("new_group")
        seen = [members] if channel is None else objects.all_gather_object(channel, members)
        for r, other in enumerate(seen):
            if other != members:
                raise InvalidArgumentError(
                    f"new_group: rank {self._kit_rank} passed ranks {list(members)} but rank {r} "
                    f"passed {list(other)}. HINT: every rank calls new_group with the same ranks."
                )
        index = 0 if self._kit_rank in members else None
        return self._kit_inherit(self._split([members], index), index)

    def split(self, color: int | None, key: int | None = None) -> Communicator | NonMember:
        """Split into sub-communicators by ``color`` (None: not a member), ordered by ``key``."""
        self._kit_check_usable()
        if color is not None and (
            not isinstance(color, int) or isinstance(color, bool) or color < 0
        ):
            raise InvalidArgumentError(
                f"split: color {color!r} must be a non-negative int, or None to stay out. "
                "HINT: ranks with equal colors form one group."
            )
        if key is not None and (not isinstance(key, int) or isinstance(key, bool)):
            raise InvalidArgumentError(f"split: key {key!r} must be an int or None (None: by rank)")
        mine = (color, self._kit_rank if key is None else key)
        channel = self._kit_objects("split")
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
        return self._kit_inherit(self._split(groups, index), index)

    def _group_arguments(self, members: Sequence[int]) -> dict[str, Any]:
        """What :class:`~distcomm.backend.BaseCommunicator` takes for this rank's communicator over
        ``members`` (ranks of this communicator, in member order; this rank among them): its
        ``rank``, ``world_size``, ``launch``, ``global_ranks``, ``timeout`` and ``name``. For a
        backend's ``_split``: ``MyCommunicator(engine_group, **self._group_arguments(members))``.
        """
        world = [self._kit_global_ranks[r] for r in members]
        return {
            "rank": list(members).index(self._kit_rank),
            "world_size": len(members),
            "launch": self._kit_launch,
            "global_ranks": world,
            "timeout": self.timeout,
            "name": f"group {world}",
        }

    def _kit_inherit(
        self, group: Communicator | NonMember, index: int | None
    ) -> Communicator | NonMember:
        """A new group takes this communicator's settings (the check policy) and its lineage:
        the n-th group made from this communicator, ``index``-th of them (``new_group`` and
        ``split`` are collective here, so every member counts alike), so that two groups of
        the same members are told apart when the ranks compare their calls."""
        self._kit_children += 1
        if isinstance(group, Steps):
            group._kit_lineage = f"{self._kit_lineage}/{self._kit_children}.{index}"
            group.debug = self.debug
        return group

    def adopt(self, native: Any) -> Communicator | NonMember:
        """A communicator over a group the engine's own API made (a torch ProcessGroup ...).

        For code that mixes distcomm with groups made by the engine directly; the backend's
        ``_adopt`` primitive does it. The group stays its creator's (``finalize`` leaves it).
        NON_MEMBER where this rank is not in the group.

        Raises:
            NotSupportedError: this backend cannot wrap engine groups.
        """
        self._kit_check_usable()
        return self._adopt(native)
