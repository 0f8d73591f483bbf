"""speechbrain's ``speechbrain.utils.distributed`` on any distcomm backend.

Change ``from speechbrain.utils import distributed`` (or ``speechbrain.utils.distributed``) to
``from distcomm.compat import speechbrain``; ``ddp_init_group(run_opts)`` then initialises
distcomm, so every launcher distcomm detects works (torchrun, srun, mpirun, one process) and
``run_opts["distributed_backend"]`` may name any distcomm backend (gloo, nccl, mpi, ...).

Kept from speechbrain:

- ``get_rank()`` reads RANK, LOCAL_RANK, SLURM_PROCID, JSM_NAMESPACE_RANK (the first set) and
  returns None when none is; ``if_main_process()`` is True for rank 0 and for None.
- ``main_process_only`` / ``MainProcessContext``: while a main-only function runs, the
  ``ddp_*`` functions are no-ops (only main is there to take part), which is what keeps nested
  calls from deadlocking. After the outermost such call, every rank returns main's result.
- ``run_on_main(func, ..., post_func, ..., run_post_on_main=False)``: func on main, then
  post_func on the others (or on all), with the ranks waiting for each step.
- ``ddp_init_group`` returns silently in a plain single process, and uses a 7200 s timeout
  (speechbrain's, long enough for data preparation on main) unless DISTCOMM_TIMEOUT says
  otherwise.

Differences:

- ``get_rank()`` answers from the initialised communicator first, and under a launcher that
  sets none of those variables (mpirun) from distcomm's launch detection, so that mpirun
  ranks are not all "main".
- When the function run on main raises, the other ranks raise RankFailedError naming rank 0
  instead of waiting forever; when a ``post_func`` raises, every rank raises.
- An unknown ``distributed_backend`` raises ValueError listing the valid names (speechbrain
  listed nccl, gloo and mpi only).
- ``ddp_all_reduce`` also takes numpy arrays and Python numbers (it returns the reduced
  number), and ops as distcomm.ReduceOp, torch's ReduceOp or a name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import distcomm
from distcomm import _peer_failures, _settings
from distcomm._plugins.loader import check_backend
from distcomm.errors import BackendNotFoundError, EnvironmentDetectionError, InvalidArgumentError
from distcomm.helpers import main_process_only, run_on_main

__all__ = [
    "MainProcessContext",
    "ddp_all_reduce",
    "ddp_barrier",
    "ddp_broadcast",
    "ddp_init_group",
    "get_rank",
    "if_main_process",
    "is_distributed_initialized",
    "main_process_only",
    "rank_prefixed_message",
    "run_on_main",
]

RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")
#: speechbrain's process-group timeout: main may prepare data for long while the others wait.
DEFAULT_TIMEOUT = 7200.0


def get_rank() -> int | None:
    """This process's rank, or None when nothing says it."""
    if distcomm.is_initialized():
        return distcomm.get_rank()
    for name in RANK_VARIABLES:
        value = os.environ.get(name)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                raise EnvironmentDetectionError(
                    f"{name}={value!r} is not a rank (an int). HINT: fix or unset {name}.",
                    variable=name,
                    value=value,
                ) from None
    launch = distcomm.detect_environment()
    return launch.rank if launch.world_size > 1 else None


def if_main_process() -> bool:
    """Whether this is the main process (rank 0, or no rank at all)."""
    return get_rank() in (0, None)


def is_distributed_initialized() -> bool:
    """Whether distcomm is initialised."""
    return distcomm.is_initialized()


class MainProcessContext:
    """Marks a section only main runs: inside it the ``ddp_*`` functions are no-ops."""

    def __enter__(self) -> MainProcessContext:
        self._section = _peer_failures.main_only_section(
            f"speechbrain's MainProcessContext (entered at {_peer_failures.region_site()})"
        )
        self._section.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._section.__exit__(exc_type, exc, tb)


def ddp_barrier() -> None:
    """Wait for every rank (a no-op alone and inside a main-only section)."""
    if not _peer_failures.in_main_only_section():
        distcomm.barrier()


def ddp_broadcast(communication_object: Any, src: int = 0) -> Any:
    """Rank ``src``'s (picklable) object on every rank (itself alone or in a main-only
    section)."""
    if _peer_failures.in_main_only_section():
        return communication_object
    return distcomm.broadcast_object(communication_object, src)


def ddp_all_reduce(communication_object: Any, reduce_op: Any) -> Any:
    """All-reduce a tensor in place and return it (a number: return the reduced number)."""
    if _peer_failures.in_main_only_section():
        return communication_object
    reduced = distcomm.all_reduce(communication_object, op=reduce_op)
    return communication_object if reduced is None else reduced


def ddp_init_group(run_opts: Mapping[str, Any]) -> None:
    """Initialise distcomm on ``run_opts["distributed_backend"]`` (None or absent: automatic).

    A plain single process (no launcher) returns without initialising.

    Raises:
        ValueError: ``distributed_backend`` names no distcomm backend.
    """
    backend = run_opts.get("distributed_backend")
    if backend is not None:
        try:
            backend = check_backend(backend)
        except BackendNotFoundError as exc:
            raise InvalidArgumentError(f"distributed_backend: {exc}") from None
    if distcomm.is_initialized() or distcomm.detect_environment().world_size == 1:
        return
    timeout = None if _settings.is_set("DISTCOMM_TIMEOUT") else DEFAULT_TIMEOUT
    distcomm.init(backend=backend, timeout=timeout)


def rank_prefixed_message(message: str) -> str:
    """``"[rank: N] message"`` when the rank is known, else the message."""
    rank = get_rank()
    return message if rank is None else f"[rank: {rank}] {message}"
