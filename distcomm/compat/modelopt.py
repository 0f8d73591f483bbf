"""TensorRT Model Optimizer's ``modelopt.torch.export.distribute`` on any distcomm backend.

Change ``from modelopt.torch.export import distribute`` to ``from distcomm.compat import
modelopt as distribute``. The exchanges run on :mod:`distcomm.workspace`.

Kept from modelopt: the names and signatures; ``ranks`` are global ranks and ``group`` is the
group whose ranks all call (a distcomm communicator, a torch ProcessGroup, or None for the
world); the first rank of ``ranks`` gets the list, the others ``[]``; shared memory unless a
``workspace_path`` is given; ``NFSWorkspace`` reads and writes without any communication (the
caller synchronises), and its methods raise ValueError when it was made without a path.

Fixed here (modelopt differs):

- Files and shared-memory segments are named ``distcomm-<job>-c<call>-r<rank>-<random>``;
  modelopt's ``rank_N`` names collided between two jobs on one host, and a crashed run left
  segments that broke the next one. Everything is removed after the exchange, when a rank
  raises, at exit and on SIGTERM, and is private to the user (0600).
- Writes are atomic (a temporary name, then a rename): a reader never sees half a file.
- The list is aligned with ``ranks``: a rank that passed ``config=None`` has a None entry
  (modelopt dropped it, shifting the others). Tensors are owned CPU copies, valid after the
  ``with`` block; so the block needs no closing barrier, and a rank that raises inside it
  leaves no one waiting. A rank that fails before the exchange (a bad tensor, a full disk)
  makes every rank raise instead of hanging.
- ``get_tensors_parallel`` accepts tensors of different shapes and numpy arrays, and a single
  rank in ``ranks``.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import distcomm
from distcomm import workspace
from distcomm._runtime.collectives import resolve_group
from distcomm.backend._pipeline import object_transport as objects
from distcomm.errors import InvalidArgumentError
from distcomm.protocol import Communicator, NonMember

__all__ = ["NFSWorkspace", "get_configs_parallel", "get_tensors_parallel"]


class NFSWorkspace:
    """A directory every rank sees (NFS), for configs and weights written by one rank and read
    by another. No method communicates: synchronise the ranks yourself (e.g. a barrier
    between writing and reading).

    Args:
        workspace_path: the directory; created (with its parents) by whichever rank comes
            first. None makes a workspace that is not initialised.
    """

    def __init__(self, workspace_path: Path | str | None = None) -> None:
        self.path = Path("") if workspace_path is None else Path(workspace_path)
        self._is_initialized = workspace_path is not None
        self.rank = distcomm.get_rank()
        if self._is_initialized:
            self.path.mkdir(parents=True, exist_ok=True)
            self.state_path = self._get_state_path(self.rank)
            self._clean_up()

    @property
    def is_initialized(self) -> bool:
        """Whether the workspace has a directory."""
        return self._is_initialized

    def write_configs_and_weights(
        self, config_json: dict[str, Any], weights: dict[str, Any]
    ) -> None:
        """Write this rank's state file (atomically: readers see the old file or the new one)."""
        self._check()
        payload = objects.pack({"config": config_json, "weight": weights})
        temporary = self.path / f".{self.state_path.name}.{secrets.token_hex(4)}.part"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(payload)
            os.replace(temporary, self.state_path)
        finally:
            temporary.unlink(missing_ok=True)

    def read_configs_and_weights_from_rank(
        self, target_rank: int
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """``target_rank``'s config and weights, or ``(None, None)`` if it wrote nothing."""
        self._check()
        try:
            data = self._get_state_path(target_rank).read_bytes()
        except FileNotFoundError:
            return None, None
        state = objects.unpack(memoryview(bytearray(data)))
        return state["config"], state["weight"]

    def _get_state_path(self, target_rank: int) -> Path:
        self._check()
        return self.path / f"distcomm-{_job()}-rank{int(target_rank)}-state.pkl"

    def _clean_up(self) -> None:
        self._check()
        self.state_path.unlink(missing_ok=True)

    def _check(self) -> None:
        if not self._is_initialized:
            raise InvalidArgumentError(
                "NFSWorkspace is not initialized: it was made without a workspace_path. "
                "HINT: NFSWorkspace('/shared/dir')."
            )


def _job() -> str:
    """The job's id for file names, the same on every rank (``local`` without a launcher id)."""
    launch = distcomm.detect_environment()
    return re.sub(r"[^A-Za-z0-9_.]", "_", launch.job_id or "local")[:40]


@contextlib.contextmanager
def get_tensors_parallel(tensor: Any, ranks: list[int], group: Any = None) -> Iterator[list[Any]]:
    """Gather each rank's tensor to ``ranks[0]`` through shared memory.

    Yields:
        On ``ranks[0]``: the tensors of ``ranks`` in order, as CPU copies. Elsewhere: ``[]``.
    """
    comm, members = _members(ranks, group)
    yield [] if comm is None else workspace.gather_tensors(tensor, members, group=comm)


@contextlib.contextmanager
def get_configs_parallel(
    config: Any, ranks: list[int], group: Any, workspace_path: Path | str | None = None
) -> Iterator[list[Any]]:
    """Gather each rank's config (any picklable value, or None) to ``ranks[0]``.

    Through shared memory, or through files in ``workspace_path`` (a directory every rank
    sees) when given.

    Yields:
        On ``ranks[0]``: the configs of ``ranks`` in order (None where a rank passed None).
        Elsewhere: ``[]``.
    """
    comm, members = _members(ranks, group)
    if comm is None:
        yield []
        return
    yield workspace.gather_objects(config, members, group=comm, directory=workspace_path)


def _members(ranks: Sequence[int], group: Any) -> tuple[Communicator | None, list[int]]:
    """The communicator (None: this rank is not in ``group``) and ``ranks`` as its ranks."""
    comm = _communicator(group)
    if isinstance(comm, NonMember):
        return None, []
    if isinstance(ranks, (str, bytes)) or not isinstance(ranks, Sequence):
        raise InvalidArgumentError(f"ranks={ranks!r} must be a list of global ranks")
    outside = [r for r in ranks if r not in comm.global_ranks]
    if outside:
        raise InvalidArgumentError(
            f"ranks {outside} are not in the group (its global ranks: {list(comm.global_ranks)}). "
            "HINT: ranks are global ranks, all members of group."
        )
    return comm, [comm.global_ranks.index(r) for r in ranks]


def _communicator(group: Any) -> Communicator | NonMember:
    if group is None or isinstance(group, NonMember):
        return resolve_group(None) if group is None else group
    if hasattr(group, "all_reduce") and hasattr(group, "global_ranks"):
        return resolve_group(group)
    world = resolve_group(None)
    adopt = getattr(world, "adopt", None)
    if adopt is None:
        raise InvalidArgumentError(
            f"group={group!r} is not a distcomm communicator. HINT: pass one from "
            "distcomm.new_group(), or None for the world."
        )
    return adopt(group)  # type: ignore[no-any-return]
