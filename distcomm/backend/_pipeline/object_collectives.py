"""The object pipeline: broadcast_object, all_gather_object, gather_object, scatter_object.

Objects travel as pickle protocol 5 bytes with out-of-band buffers
(:mod:`~distcomm._object_codec`), on the communicator's object channel (itself, or a
CPU side channel for a GPU engine). Each counts as one collective, whatever it sends inside.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from distcomm import _object_codec as objects
from distcomm.backend._pipeline.steps import Steps

__all__ = ["ObjectCollectives"]


class ObjectCollectives(Steps):
    """The object collectives (module docstring)."""

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Return ``src``'s ``obj`` on every rank (pickle protocol 5, out-of-band buffers)."""
        self._kit_check_usable()
        self._kit_check_rank(src, "src")
        channel = self._kit_objects("broadcast_object", src)
        return obj if channel is None else objects.broadcast_object(channel, obj, src)

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Return every rank's ``obj``, in rank order, on every rank."""
        self._kit_check_usable()
        channel = self._kit_objects("all_gather_object")
        return [obj] if channel is None else objects.all_gather_object(channel, obj)

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        """Return every rank's ``obj`` on ``dst``; None elsewhere."""
        self._kit_check_usable()
        self._kit_check_rank(dst, "dst")
        channel = self._kit_objects("gather_object", dst)
        return [obj] if channel is None else objects.gather_object(channel, obj, dst)

    def scatter_object(self, objs: Sequence[Any] | None, src: int = 0) -> Any:
        """Return ``objs[rank]`` from ``src`` (``objs`` is read on ``src`` only)."""
        self._kit_check_usable()
        self._kit_check_rank(src, "src")
        if self._kit_rank == src:
            objects.check_scatter_list(objs, self._kit_world_size)
        channel = self._kit_objects("scatter_object", src)
        if channel is None:
            assert objs is not None
            return objs[0]
        return objects.scatter_object(channel, objs, src)
