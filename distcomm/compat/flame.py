"""flame's ``flame.pytorch.distributed_training`` on any distcomm backend.

Change ``from flame.pytorch import distributed_training`` to
``from distcomm.compat import flame as distributed_training``. Kept from flame, because its
users rely on it:

- :class:`DistOptions` with the same fields, command-line flags and defaults (``--dist``,
  ``--rank-start``, ``--world-size``, ``--dist-backend nccl``, ``--dist-host 127.0.0.1``,
  ``--dist-port``, ``--nprocs``), ``dist_url`` and ``get_rank(proc_id)``. It is a plain
  dataclass: :meth:`DistOptions.from_known_args` parses argv without typed_args, and accepts
  ``--rank_start`` as well as ``--rank-start`` (likewise for every flag).
- :func:`get_dist_options` ignores unknown arguments and fills a free port.
- :func:`start_distributed_training` starts ``nprocs`` processes (default: the GPU count for
  nccl, 1 for other backends; 1 runs in this process), each rank ``rank_start + proc_id`` with
  the CUDA device ``proc_id``, and calls ``worker_fn(*args)`` in each. As with
  ``torch.multiprocessing.spawn``, ``worker_fn`` and ``args`` are pickled, so ``worker_fn``
  must be defined at the top level of a module, and a script needs
  ``if __name__ == "__main__":``.
- :func:`get_available_local_dist_url`, :func:`init_cpu_process_group` (a testing helper, on
  gloo), :func:`start_training`.

Differences:

- Groups are distcomm's: each process calls ``distcomm.init(backend=dist_backend, ...)``, so
  ``--dist-backend`` takes any distcomm backend (gloo, nccl, mpi, plugins; an unknown name is
  an error listing the valid ones), and ``distcomm.finalize()`` runs after ``worker_fn``, even
  when it raises.
- Fixed: flame replaced an explicit ``world_size`` by the local ``nprocs``, which broke
  multi-node runs. Here an explicit ``world_size`` is kept, and only a missing one becomes
  ``nprocs`` (on the first node; elsewhere a missing one is an error).
- Fixed: with nccl and no GPU, flame logged an error and returned None without training. Here
  zero workers raise :class:`~distcomm.errors.InvalidArgumentError` saying what to pass.
- A worker that raises ends the run at once with :class:`~distcomm.errors.RankFailedError`
  (its rank and traceback); the other workers are stopped.
- The caller's :class:`DistOptions` is not modified.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import logging
import os
import pickle
import sys
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

import distcomm
from distcomm._plugins.loader import check_backend
from distcomm._processes.workers import run_processes
from distcomm.backend.ports import free_port
from distcomm.errors import InvalidArgumentError

__all__ = [
    "DistOptions",
    "get_available_local_dist_url",
    "get_dist_options",
    "init_cpu_process_group",
    "start_distributed_training",
    "start_training",
]

_logger = logging.getLogger(__name__)


@dataclasses.dataclass
class DistOptions:
    """The command-line options of distributed training (flame's flags and defaults)."""

    dist: bool = False
    rank_start: int = 0
    world_size: int | None = None
    dist_backend: str = "nccl"
    dist_host: str = "127.0.0.1"
    dist_port: int | None = None
    nprocs: int | None = None

    @property
    def dist_url(self) -> str:
        """``"tcp://<dist_host>:<dist_port>"``.

        Raises:
            InvalidArgumentError: ``dist_port`` is not set.
        """
        if self.dist_port is None:
            raise InvalidArgumentError(
                "dist_url needs dist_port, which is None. HINT: pass --dist-port, or get the "
                "options from get_dist_options(), which fills a free port."
            )
        return f"tcp://{self.dist_host}:{self.dist_port}"

    def get_rank(self, proc_id: int) -> int:
        """The global rank of this node's process ``proc_id``: ``rank_start + proc_id``."""
        return self.rank_start + proc_id

    @classmethod
    def from_known_args(
        cls, args: Sequence[str] | None = None, parser: argparse.ArgumentParser | None = None
    ) -> tuple[DistOptions, list[str]]:
        """Parse ``args`` (default ``sys.argv[1:]``); return the options and the unknown args.

        ``parser``, when given, gets the options added (so a program can keep its own options
        in it). Each flag is accepted with dashes and with underscores (``--rank-start``,
        ``--rank_start``). argparse exits with a usage message on a malformed value, as
        flame's did.
        """
        if parser is None:  # no -h, and no abbreviations: a program's own options pass through
            parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
        defaults = cls()

        def option(name: str, **kwargs: Any) -> None:
            flags = [f"--{name.replace('_', '-')}"]
            if "_" in name:
                flags.append(f"--{name}")
            parser.add_argument(*flags, dest=name, default=getattr(defaults, name), **kwargs)

        option("dist", action="store_true", help="start distributed training")
        option("rank_start", type=int, help="the rank of this node's first process")
        option("world_size", type=int, help="the number of processes (computed if not given)")
        option("dist_backend", type=str, help="a distcomm backend: gloo, nccl, mpi, ...")
        option("dist_host", type=str, help="the address of rank 0's host")
        option("dist_port", type=int, help="a free port on rank 0's host (found if not given)")
        option("nprocs", type=int, help="processes on this node (default: GPUs for nccl, else 1)")
        namespace, unknown = parser.parse_known_args(args)
        values = {field.name: getattr(namespace, field.name) for field in dataclasses.fields(cls)}
        return cls(**values), unknown


def get_dist_options() -> DistOptions:
    """The options in ``sys.argv`` (unknown arguments ignored), with a free port if none given."""
    options, _ = DistOptions.from_known_args()
    if options.dist_port is None:
        options.dist_port = free_port()
    return options


def _init_process_group_fn(
    proc_id: int, worker_fn: Callable[..., Any], dist_options: DistOptions, *args: Any
) -> None:
    """Run ``worker_fn(*args)`` as process ``proc_id`` of this node.

    1. compute the rank: ``dist_options.get_rank(proc_id)``;
    2. ``distcomm.init`` with ``dist_backend``, that rank, ``world_size``, ``dist_host`` and
       ``dist_port``;
    3. set the CUDA device ``proc_id`` if torch is imported and CUDA is available;
    4. call ``worker_fn(*args)``, then ``distcomm.finalize()`` (even when it raises).

    Raises:
        InvalidArgumentError: ``world_size`` or ``dist_port`` is not set.
    """
    for name in ("world_size", "dist_port"):
        if getattr(dist_options, name) is None:
            raise InvalidArgumentError(
                f"dist_options.{name} is None. HINT: call start_distributed_training(), which "
                f"fills it, or set --{name.replace('_', '-')}."
            )
    distcomm.init(
        backend=dist_options.dist_backend,
        rank=dist_options.get_rank(proc_id),
        world_size=dist_options.world_size,
        master_addr=dist_options.dist_host,
        master_port=dist_options.dist_port,
    )
    try:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            torch.cuda.set_device(proc_id)
        worker_fn(*args)
    finally:
        distcomm.finalize()


def _process_main(worker_fn: Callable[..., Any], dist_options: DistOptions, *args: Any) -> None:
    """What each started process runs: its ``proc_id`` is the LOCAL_RANK it was given."""
    _init_process_group_fn(int(os.environ["LOCAL_RANK"]), worker_fn, dist_options, *args)


def start_distributed_training(
    worker_fn: Callable[..., Any], dist_options: DistOptions, args: tuple[Any, ...] = ()
) -> None:
    """Run ``worker_fn(*args)`` in ``nprocs`` processes, each a rank of ``dist_options``.

    1. ``nprocs``: as given, else the GPU count for nccl, else 1;
    2. ``world_size``: as given, else ``nprocs`` (a node with ``rank_start > 0`` must give it);
    3. start the processes (1: this one), each inits distcomm and calls ``worker_fn(*args)``.

    Returns when every worker has finished. ``dist_options`` is not modified.

    Raises:
        InvalidArgumentError: no worker to start (nccl without a GPU), ranks that do not fit
            in the world, or a ``worker_fn`` that cannot be pickled; nothing was started.
        BackendNotFoundError: ``dist_backend`` names no backend.
        RankFailedError: a worker raised or died (its rank and traceback); the others are
            stopped.
    """
    options = _complete(dist_options)
    assert options.nprocs is not None
    _logger.info(
        "starting ranks %d..%d of %d on %s (%s)",
        options.rank_start,
        options.rank_start + options.nprocs - 1,
        options.world_size,
        options.dist_backend,
        options.dist_url,
    )
    if options.nprocs == 1:
        _init_process_group_fn(0, worker_fn, options, *args)
        return
    try:
        pickle.dumps(worker_fn)
    except Exception as exc:
        raise InvalidArgumentError(
            f"worker_fn={worker_fn!r} cannot be pickled ({exc}); each process imports it by "
            "name. HINT: define it at the top level of an importable module (not a lambda or "
            "a nested function), as torch.multiprocessing.spawn requires too."
        ) from exc
    run_processes(
        _process_main,
        options.nprocs,
        (worker_fn, options, *args),
        variables=lambda proc_id: _variables(options, proc_id),
        backend=None,
        timeout=None,
        first_rank=options.rank_start,
        world_size=options.world_size,
    )


def _complete(dist_options: DistOptions) -> DistOptions:
    """A copy of ``dist_options`` with the backend checked and every blank filled."""
    backend = check_backend(dist_options.dist_backend)
    rank_start = _int_option("rank_start", dist_options.rank_start, minimum=0)
    nprocs = dist_options.nprocs
    if nprocs is None:
        nprocs = _gpu_count() if backend == "nccl" else 1
        if nprocs == 0:
            raise InvalidArgumentError(
                "dist_backend='nccl' starts one process per GPU, and no GPU is visible, so "
                "there is no worker to start. HINT: pass --nprocs N, or --dist-backend gloo "
                "to train on CPUs."
            )
    nprocs = _int_option("nprocs", nprocs, minimum=1)
    world_size = dist_options.world_size
    if world_size is None:
        if rank_start > 0:
            raise InvalidArgumentError(
                f"rank_start={rank_start} (not the first node) needs the world size. HINT: pass "
                "--world-size N, the number of processes on all nodes together."
            )
        world_size = nprocs
    world_size = _int_option("world_size", world_size, minimum=1)
    if rank_start + nprocs > world_size:
        raise InvalidArgumentError(
            f"ranks {rank_start}..{rank_start + nprocs - 1} (rank_start={rank_start}, "
            f"nprocs={nprocs}) do not fit in world_size={world_size}. HINT: pass a "
            "--world-size that counts the processes of every node, or fewer --nprocs."
        )
    port = dist_options.dist_port if dist_options.dist_port is not None else free_port()
    return dataclasses.replace(
        dist_options,
        dist_backend=backend,
        rank_start=rank_start,
        world_size=world_size,
        dist_port=_int_option("dist_port", port, minimum=1),
        nprocs=nprocs,
    )


def _int_option(name: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgumentError(
            f"{name}={value!r} must be an int >= {minimum}. HINT: check --{name.replace('_', '-')}."
        )
    return value


def _gpu_count() -> int:
    """The number of CUDA devices torch sees; 0 when torch is not installed."""
    if importlib.util.find_spec("torch") is None:
        return 0
    import torch

    count: int = torch.cuda.device_count()
    return count


def _variables(options: DistOptions, proc_id: int) -> dict[str, str]:
    """The launcher variables of this node's process ``proc_id``, as torchrun sets them."""
    return {
        "RANK": str(options.get_rank(proc_id)),
        "WORLD_SIZE": str(options.world_size),
        "LOCAL_RANK": str(proc_id),
        "LOCAL_WORLD_SIZE": str(options.nprocs),
        "MASTER_ADDR": options.dist_host,
        "MASTER_PORT": str(options.dist_port),
        "PYTHONUNBUFFERED": "1",
    }


def get_available_local_dist_url() -> str:
    """A dist url on this host with a free port, like ``tcp://127.0.0.1:12345``."""
    return f"tcp://127.0.0.1:{free_port()}"


def init_cpu_process_group(
    rank: int = 0, world_size: int = 1, dist_url: str = "tcp://127.0.0.1:12345"
) -> None:
    """Initialise distcomm on gloo as ``rank`` of ``world_size``, to test distributed code on
    CPUs. For testing only; call ``distcomm.finalize()`` afterwards.

    Raises:
        InvalidArgumentError: ``dist_url`` is not ``tcp://host:port``.
    """
    _logger.warning("init_cpu_process_group is for testing only; do not use it in production")
    host, port = _parse_url(dist_url)
    distcomm.init(
        backend="gloo", rank=rank, world_size=world_size, master_addr=host, master_port=port
    )


def _parse_url(dist_url: str) -> tuple[str, int]:
    """``(host, port)`` of ``tcp://host:port``."""
    host: str | None = None
    port: int | None = None
    try:
        parts = urllib.parse.urlsplit(str(dist_url))
        if parts.scheme == "tcp" and not parts.path.strip("/") and not parts.query:
            host, port = parts.hostname, parts.port
    except ValueError:  # a port that is not a number, or out of range
        pass
    if not host or port is None:
        raise InvalidArgumentError(
            f"dist_url={dist_url!r} is not a tcp://host:port url. HINT: e.g. "
            "get_available_local_dist_url(), or 'tcp://127.0.0.1:12345'."
        )
    return host, port


def start_training(worker_fn: Callable[..., Any], args: tuple[Any, ...] = ()) -> None:
    """With ``--dist`` in argv, :func:`start_distributed_training`; else ``worker_fn(*args)``."""
    options = get_dist_options()
    if options.dist:
        start_distributed_training(worker_fn, options, args)
    else:
        worker_fn(*args)
