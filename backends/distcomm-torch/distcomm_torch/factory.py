"""Creating (or adopting) torch's default process group from a LaunchInfo, and its engine.

Rendezvous: a world of 1 needs no network (a HashStore); otherwise rank 0 serves a TCPStore at
the launch's master address and port. Under an MPI launcher, which gives no master address,
rank 0's address and a free port reach the others over MPI (mpi4py) at init.

On nccl the default group is bound to the rank's GPU (``init_process_group(device_id=...)``,
where torch has it): torch then creates the NCCL communicator at once, so an NCCL failure ends
``init``, and makes later groups by splitting it (see
:func:`distcomm_torch.communicator.unbound_default_group` for the groups it must not split).
"""

from __future__ import annotations

import inspect
import socket
import traceback
from typing import Any

import torch.distributed as dist

from distcomm import BackendUnavailableError, InvalidArgumentError, LaunchInfo
from distcomm.backend import abort_on_uncaught_exception, free_port, select_cuda_device
from distcomm_torch import gpus, process_group, rendezvous
from distcomm_torch.communicator import (
    GlooEngine,
    NcclEngine,
    TorchEngine,
    torch_timeout,
    unbound_default_group,
    watchdog_timeout,
)
from distcomm_torch.progress import StoreProgress

__all__ = ["create"]

#: Whether this torch binds the default group to a device (``device_id``, torch >= 2.2).
_BINDS_DEVICE = "device_id" in inspect.signature(dist.init_process_group).parameters


def create(
    name: str,
    launch: LaunchInfo,
    *,
    timeout: float = 1800.0,
    device: str | None = None,
    companion: bool = False,
    torch_group: str | None = None,
    **options: Any,
) -> TorchEngine:
    """Factory of ``gloo`` and ``nccl``: the engine of torch's default group for ``launch``,
    which the kit makes the world communicator around (``timeout`` is the communicator's too).
    nccl's holds a Gloo group of the world, its side channel for objects (made when the
    communicator is).

    ``companion=True`` is distcomm's own, for torch's default group made beside another
    backend (``init(torch_group=...)``): distcomm's operations never run on it, so it publishes
    no progress and answers no "where are you?" (which would read the store while idle).

    ``torch_group="distcomm"`` (``init(torch_group="distcomm")``, gloo): torch's default group
    is made first as the ``"distcomm"`` backend's, unbound
    (:func:`distcomm_torch.process_group.begin`), then the engine's Gloo group beside it, which
    the default group runs over once the communicator is made.

    Raises:
        BackendUnavailableError: the rendezvous is impossible (no master address or port), or a
            torch default process group exists with another backend.
        InvalidArgumentError: unknown options, or a device the backend cannot use.
    """
    if options:
        raise InvalidArgumentError(
            f"backend {name!r} takes no options, got {sorted(options)!r}. HINT: remove them "
            "from init(); the rendezvous comes from the launch (MASTER_ADDR, MASTER_PORT)."
        )
    if not dist.is_available():
        raise BackendUnavailableError(
            f"{name}: this torch build has no torch.distributed", backend=name
        )
    under = torch_group == "distcomm"
    if under:
        _check_under(name)
    adopting = dist.is_initialized()
    if adopting:
        launch = _adopt(name, launch)
    cuda_device = _cuda_device(name, launch, device)
    group = None
    if not adopting:
        launch, group = _init_default_group(name, launch, timeout, cuda_device, under)
    progress = None if companion else _progress()
    if name == "gloo":
        return GlooEngine(group, owns_group=not adopting, progress=progress, launch=launch)
    with unbound_default_group():
        side_pg = dist.new_group(backend="gloo", timeout=torch_timeout(timeout))
    return NcclEngine(
        None,
        side_group=side_pg,
        owns_group=not adopting,
        progress=progress,
        device=cuda_device,
        launch=launch,
    )


def _check_under(name: str) -> None:
    """``torch_group="distcomm"``: gloo only (nccl's CUDA tensors stay on torch's own NCCL
    group), and no torch default group made before."""
    if name != "gloo":
        raise InvalidArgumentError(
            f"init(backend={name!r}, torch_group='distcomm'): torch's groups over distcomm move "
            "CPU tensors (gloo, mpi, zmq); on nccl torch's default group is NCCL's own. HINT: "
            "torch_group='auto' on nccl, or backend='gloo' (or 'mpi') for CPU tensors."
        )
    if dist.is_initialized():
        raise InvalidArgumentError(
            f"init(torch_group='distcomm'): torch's default process group "
            f"({dist.get_backend()}) exists already, so it cannot run over distcomm. HINT: "
            "torch_group='auto' adopts it; or torch.distributed.destroy_process_group() first."
        )


def _cuda_device(name: str, launch: LaunchInfo, device: str | None) -> Any:
    if name == "nccl":
        return select_cuda_device(name, launch, device, "use backend='gloo' for CPU tensors.")
    if device not in (None, "cpu"):
        raise InvalidArgumentError(
            f"backend 'gloo' moves CPU tensors; device={device!r} is not for it (valid: None or "
            "'cpu'). HINT: omit "
            "device (CUDA tensors are staged through host memory), or use backend='nccl'."
        )
    return None


def _adopt(name: str, launch: LaunchInfo) -> LaunchInfo:
    """Check that torch's existing default group can be adopted: of backend ``name``; return
    ``launch`` with the group's rank and world size (distcomm's world is the group's; a group
    of another size than the launch's is taken for one node).

    Raises:
        BackendUnavailableError: the group's backend is another.
    """
    current = str(dist.get_backend()).lower()
    if name not in current:
        raise BackendUnavailableError(
            f"a torch default process group with backend {current!r} already exists, so "
            f"distcomm cannot create a {name!r} one. "
            f"HINT: init(backend={current.split(':')[-1]!r}) "
            "to adopt it, or torch.distributed.destroy_process_group() first.",
            backend=name,
            reason="another torch default process group exists",
        )
    rank, world = dist.get_rank(), dist.get_world_size()
    if (rank, world) == (launch.rank, launch.world_size):
        return launch
    return launch.replace(
        "the existing torch default process group",
        rank=rank,
        world_size=world,
        local_rank=rank if world != launch.world_size else launch.local_rank,
        local_world_size=world if world != launch.world_size else launch.local_world_size,
        node_rank=0 if world != launch.world_size else launch.node_rank,
        num_nodes=1 if world != launch.world_size else launch.num_nodes,
    )


def _init_default_group(
    name: str, launch: LaunchInfo, timeout_s: float, device: Any = None, under: bool = False
) -> tuple[LaunchInfo, Any]:
    """Create torch's default group (bound to ``device``, nccl's CUDA device, where torch can);
    return ``launch`` with the rendezvous it used, and the engine's group: None (the default
    group), or with ``under`` a Gloo group beside the default group, which is the
    ``"distcomm"`` backend's (:func:`distcomm_torch.process_group.begin`).

    Raises:
        DistTimeoutError: the rendezvous did not complete within the timeout (the master
            cannot be reached, or ranks never arrived: they are named).
        BackendUnavailableError: the rendezvous cannot be served or reached at all.
    """
    store: Any
    if launch.world_size == 1:
        store = dist.HashStore()  # type: ignore[attr-defined]  # re-exported from torch._C
    else:
        addr, port = launch.master_addr, launch.master_port
        if launch.method == "mpi" and (addr is None or port is None):
            addr, port = _master_over_mpi(launch)
            launch = launch.replace(
                "derived: rank 0's, over MPI", master_addr=addr, master_port=port
            )
        if addr is None or port is None:
            missing = "MASTER_ADDR" if addr is None else "MASTER_PORT"
            raise BackendUnavailableError(
                f"{name}: a world of {launch.world_size} ({launch.method} launch) needs a "
                f"rendezvous address, but {missing} is unknown. HINT: export MASTER_ADDR and "
                "MASTER_PORT (rank 0's host and a free port), or pass init(master_addr=..., "
                "master_port=...).",
                backend=name,
                reason=f"{missing} unknown",
            )
        store = rendezvous.open_store(name, launch, addr, port, timeout_s)
    if device is not None:  # before NCCL meets two ranks on one GPU (it fails, or hangs)
        try:
            gpus.check_one_gpu_per_rank(name, launch, store, device, timeout_s)
        except BackendUnavailableError:
            del store  # rank 0's server port goes, even while the error is kept
            raise
    bound: dict[str, Any] = {"device_id": device} if device is not None and _BINDS_DEVICE else {}
    engine = watchdog_timeout(timeout_s) if name == "nccl" else torch_timeout(timeout_s)
    try:
        with rendezvous.overrun_guard(name, launch, timeout_s, engine.total_seconds()):
            if under:
                process_group.begin(store, launch.rank, launch.world_size, engine)
            else:
                dist.init_process_group(
                    name,
                    store=store,
                    rank=launch.rank,
                    world_size=launch.world_size,
                    timeout=engine,
                    **bound,
                )
    except RuntimeError as exc:
        error = rendezvous.failed(name, launch, store, timeout_s, exc)
        # Let go of the store (rank 0's server port) even while the error is kept.
        traceback.clear_frames(exc.__traceback__)
        del store
        raise error from exc
    group = None
    try:
        if under:
            with process_group.torch_makes_groups():
                group = dist.new_group(backend=name, timeout=engine)
        if launch.world_size > 1:
            rendezvous.confirm(name, launch, store, f"{launch.master_addr}:{launch.master_port}")
    except BaseException:
        dist.destroy_process_group()
        raise
    return launch, group


def _progress() -> StoreProgress | None:
    """Progress publishing over the default group's store (None where torch hides it)."""
    try:
        store = dist.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError, ValueError):
        return None
    return StoreProgress(store, dist.get_rank())


def _master_over_mpi(launch: LaunchInfo) -> tuple[str, int]:
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise BackendUnavailableError(
            "an MPI launcher gives no master address, and mpi4py (needed to agree on one) is "
            "not installed. HINT: pip install mpi4py, or export MASTER_ADDR and MASTER_PORT.",
            reason="mpi4py missing",
        ) from exc
    world = MPI.COMM_WORLD
    if world.Get_size() != launch.world_size:
        raise BackendUnavailableError(
            f"MPI's COMM_WORLD has {world.Get_size()} ranks but the launch says "
            f"{launch.world_size}. HINT: start every rank with the same mpirun.",
            reason="MPI world size mismatch",
        )
    # An MPI job: a rank that dies of an exception must end it (the others would wait).
    abort_on_uncaught_exception(world.Get_rank(), lambda: world.Abort(1), "MPI_Abort")
    found: tuple[str, int] | None = None
    if world.Get_rank() == 0:
        one_node = launch.num_nodes == 1 and launch.local_world_size == launch.world_size
        host = "127.0.0.1" if one_node else socket.gethostbyname(socket.gethostname())
        found = (host, free_port(host))
    result: tuple[str, int] = world.bcast(found, root=0)
    return result
