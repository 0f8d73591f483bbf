"""A device mesh: the ranks laid out on a grid, with a group along each named dimension.

``distcomm.mesh((2, 2), ("dp", "tp"))`` on 4 ranks puts rank ``r`` at ``(r // 2, r % 2)``
(row-major: the last dimension varies fastest, as torch's ``init_device_mesh``). ``mesh["tp"]``
is this rank's group along ``tp`` (the ranks that differ only in their ``tp`` coordinate: 0 and
1, or 2 and 3), ``mesh["dp"]`` along ``dp`` (0 and 2, or 1 and 3). Each is an ordinary
communicator: every collective, on every backend. ``mesh.torch()`` is torch's ``DeviceMesh`` of
the same layout, for torch-native code (DDP on ``mesh.torch()["dp"].get_group()``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

from distcomm.errors import InvalidArgumentError
from distcomm.protocol import Communicator

__all__ = ["Mesh", "layout"]


def layout(
    shape: Sequence[int], names: Sequence[str], world: int
) -> dict[str, list[tuple[int, ...]]]:
    """The groups along each dimension of a mesh of ``shape`` over ranks ``0..world-1``.

    Raises:
        InvalidArgumentError: a shape that is not positive ints whose product is ``world``, or
            names that are not distinct strings, one per dimension.
    """
    dims = tuple(shape) if isinstance(shape, (list, tuple)) else None
    if (
        not dims
        or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in dims)
        or math.prod(dims) != world
    ):
        raise InvalidArgumentError(
            f"mesh: shape {shape!r} must be positive ints whose product is the world size "
            f"{world}. HINT: e.g. mesh(({world},), ('dp',)), or (2, {world // 2}) on an even "
            "world."
        )
    labels = tuple(names) if isinstance(names, (list, tuple)) else ()
    if (
        len(labels) != len(dims)
        or not all(isinstance(n, str) and n for n in labels)
        or len(set(labels)) != len(labels)
    ):
        raise InvalidArgumentError(
            f"mesh: names {names!r} must be {len(dims)} distinct non-empty strings, one per "
            f"dimension of {dims}. HINT: e.g. ('dp', 'tp')."
        )
    coords = list(itertools.product(*(range(n) for n in dims)))  # rank r at coords[r]
    groups = {}
    for d, name in enumerate(labels):
        rest = sorted({c[:d] + c[d + 1 :] for c in coords})
        groups[name] = [
            tuple(r for r, c in enumerate(coords) if c[:d] + c[d + 1 :] == other) for other in rest
        ]
    return groups


class Mesh:
    """The ranks on a grid (module docstring): ``mesh[name]`` is this rank's group along
    ``name``; ``shape``, ``names``, ``coordinate`` (this rank's, one index per dimension)."""

    def __init__(
        self,
        shape: tuple[int, ...],
        names: tuple[str, ...],
        groups: dict[str, Communicator],
        parent: Communicator,
    ) -> None:
        self.shape, self.names, self._groups, self._parent = shape, names, groups, parent
        self.coordinate = tuple(groups[name].rank for name in names)

    def __getitem__(self, name: str) -> Communicator:
        """This rank's group along dimension ``name``.

        Raises:
            InvalidArgumentError: no dimension has that name.
        """
        group = self._groups.get(name)
        if group is None:
            raise InvalidArgumentError(
                f"mesh: no dimension named {name!r}; valid: {', '.join(self.names)}. HINT: "
                "name the dimensions in mesh(shape, names)."
            )
        return group

    def torch(self, device_type: str = "cpu") -> Any:
        """torch's ``DeviceMesh`` of the same layout and names over torch's default process
        group (the torch backends', or the one ``init`` made beside another backend).

        Raises:
            InvalidArgumentError: the mesh is not over the whole world, or torch has no default
                process group here.
        """
        import torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh

        if not dist.is_initialized() or self._parent.world_size != dist.get_world_size():
            raise InvalidArgumentError(
                "mesh.torch(): torch's DeviceMesh needs torch's default process group over "
                "every rank of the mesh. HINT: make the mesh from the world, on gloo or nccl, "
                "or init(torch_group=True) beside another backend."
            )
        ranks = torch_ranks(
            self.shape, [self._parent.global_ranks[r] for r in range(self._parent.world_size)]
        )
        return DeviceMesh(device_type, ranks, mesh_dim_names=self.names)

    def __repr__(self) -> str:
        dims = ", ".join(f"{n}={s}" for n, s in zip(self.names, self.shape, strict=True))
        return f"<Mesh {dims} at {self.coordinate}>"


def torch_ranks(shape: tuple[int, ...], ranks: list[int]) -> Any:
    """``ranks`` (world ranks, in mesh order) as a tensor of ``shape``."""
    import torch

    return torch.tensor(ranks).reshape(shape)
