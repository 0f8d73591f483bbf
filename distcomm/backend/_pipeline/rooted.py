"""The rooted pipeline: gather and scatter, whose list of per-rank tensors lives on one rank.

Both check the root and its list the same way (:meth:`Rooted._rooted`); the engine works on one
contiguous buffer of world_size chunks, which the list is copied into (scatter) or out of
(gather). A blocking call like one the pipeline took before, its list world_size arrays like the
tensor on the root (None elsewhere), runs the engine's plan for its kind
(:mod:`~distcomm.backend._pipeline.plans`).
"""

from __future__ import annotations

from typing import Any

from distcomm.backend._pipeline.observing import observed
from distcomm.backend._pipeline.steps import DONE, Steps
from distcomm.backend.arrays import Adapter
from distcomm.protocol import Work

__all__ = ["Rooted"]


class Rooted(Steps):
    """gather and scatter (module docstring)."""

    def gather(
        self,
        tensor: Any,
        gather_list: list[Any] | None = None,
        dst: int = 0,
        async_op: bool = False,
    ) -> Work | None:
        """Gather every rank's ``tensor`` into ``gather_list`` on ``dst`` (None elsewhere)."""
        if not async_op and self._planned("gather", tensor, dst, gather_list):
            return None
        return self._gather_steps(tensor, gather_list, dst, async_op)

    @observed
    def _gather_steps(
        self, tensor: Any, gather_list: list[Any] | None, dst: int, async_op: bool
    ) -> Work | None:
        """gather past its plan (every call is numbered; the hooks see it)."""
        adapter, dtype = self._rooted("gather", tensor, gather_list, "gather_list", dst, "dst")
        if self._solo:
            assert gather_list is not None
            adapter.copy_(gather_list[0], tensor)
            return DONE if async_op else None
        staged = self._stage(adapter, tensor, dtype)
        if gather_list is None:
            staged.copied = False  # nothing comes back to a rank that is not dst
            work = self._call(self._gather, async_op, None, staged.engine, dst)
            return self._finish(work, async_op, staged)
        out = adapter.empty(staged.engine, adapter.numel(tensor) * self._world_size)
        work = self._call(self._gather, async_op, out, staged.engine, dst)
        return self._finish_split(work, async_op, staged, out, gather_list)

    def scatter(
        self,
        tensor: Any,
        scatter_list: list[Any] | None = None,
        src: int = 0,
        async_op: bool = False,
    ) -> Work | None:
        """Give rank r ``scatter_list[r]`` from ``src``, in ``tensor``."""
        if not async_op and self._planned("scatter", tensor, src, scatter_list):
            return None
        return self._scatter_steps(tensor, scatter_list, src, async_op)

    @observed
    def _scatter_steps(
        self, tensor: Any, scatter_list: list[Any] | None, src: int, async_op: bool
    ) -> Work | None:
        """scatter past its plan (every call is numbered; the hooks see it)."""
        adapter, dtype = self._rooted("scatter", tensor, scatter_list, "scatter_list", src, "src")
        if self._solo:
            assert scatter_list is not None
            adapter.copy_(tensor, scatter_list[0])
            return DONE if async_op else None
        staged = self._stage(adapter, tensor, dtype)
        full = None
        if scatter_list is not None:
            numel = adapter.numel(tensor)
            full = adapter.empty(staged.engine, numel * self._world_size)
            flat = adapter.flat(full)
            for r, part in enumerate(scatter_list):
                adapter.copy_(flat[r * numel : (r + 1) * numel], part)
        work = self._call(self._scatter, async_op, staged.engine, full, src)
        return self._finish(work, async_op, staged, None, full)

    def _rooted(
        self,
        op: str,
        tensor: Any,
        parts: list[Any] | None,
        parts_name: str,
        root: int,
        root_name: str,
    ) -> tuple[Adapter, str]:
        """Validate a rooted call (the root, and its list: given on the root only, one tensor
        like ``tensor`` per rank; a gather writes the list, a scatter the tensor) and count it."""
        gathering = op == "gather"
        adapter, dtype = self._begin(tensor, "tensor", written=not gathering)
        self._check_rank(root, root_name)
        numel = adapter.numel(tensor)
        self._check_root_list(
            parts, parts_name, root, root_name, adapter, dtype, numel, written=gathering
        )
        self._count(op, tensor, adapter, root)
        return adapter, dtype
