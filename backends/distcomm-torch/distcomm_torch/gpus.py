"""One GPU per rank: NCCL's rule, checked through the rendezvous store before NCCL starts.

NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU detected", or a hang,
per its user guide). Ranks pick their GPU locally (the local rank modulo the visible devices,
or ``init(device=...)``), so more ranks on a node than GPUs, or the same ``device="cuda:0"``
on every rank, would share one. Before torch's process group exists, each rank of a node
leaves its GPU's identity (its UUID, which ``CUDA_VISIBLE_DEVICES`` does not renumber) in the
store under its host and local rank, reads those of its node's other ranks, and every rank
that shares a GPU raises the same clear error. A node's ranks read each other's keys only:
``local_world_size`` reads a rank.
"""

from __future__ import annotations

import datetime
import os
import socket
from typing import Any

from distcomm import BackendUnavailableError, LaunchInfo

__all__ = ["check_one_gpu_per_rank", "gpu_identity"]


def gpu_identity(torch: Any, index: int) -> str:
    """The identity of visible device ``index``: its UUID (else its PCI address), the same in
    every process whatever ``CUDA_VISIBLE_DEVICES`` says."""
    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        return str(uuid)
    return "pci {}:{}:{}".format(
        *(getattr(props, f"pci_{part}_id", "?") for part in ("domain", "bus", "device"))
    )


def check_one_gpu_per_rank(
    name: str, launch: LaunchInfo, store: Any, device: Any, timeout: float
) -> None:
    """Fail on every rank of a node where two ranks chose the same GPU (``device``: this
    rank's torch.device), before NCCL meets them.

    Raises:
        BackendUnavailableError: ranks of this node share a GPU; the message names them, the
            GPU, and the fix.
    """
    if launch.local_world_size < 2:
        return
    import torch

    host = socket.gethostname()
    mine = f"{launch.rank} {device} {gpu_identity(torch, device.index)}"
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")  # torchrun's store outlives one
    keys = [f"distcomm/gpus/{attempt}/{host}/{local}" for local in range(launch.local_world_size)]
    store.set(keys[launch.local_rank], mine)
    store.wait(keys, datetime.timedelta(seconds=timeout))
    by_gpu: dict[str, list[tuple[int, str]]] = {}
    for key in keys:
        rank, chosen, gpu = bytes(store.get(key)).decode().split(" ", 2)
        by_gpu.setdefault(gpu, []).append((int(rank), chosen))
    shared = sorted(ranks for ranks in by_gpu.values() if len(ranks) > 1)
    if not shared:
        return
    count = torch.cuda.device_count()
    told = "; ".join(
        f"ranks {', '.join(str(r) for r, _ in ranks)} on {ranks[0][1]} of {host}"
        for ranks in shared
    )
    raise BackendUnavailableError(
        f"{name}: NCCL needs one GPU per rank, but {told} would share one "
        f"({launch.local_world_size} ranks on this node, {count} GPU(s) visible). HINT: start at "
        f"most {count} rank(s) per node (torchrun --nproc-per-node {count}, srun --ntasks-per-node "
        f"{count}), give each rank its own GPU (CUDA_VISIBLE_DEVICES, srun --gpus-per-task=1), "
        "or omit init(device=...) so that each rank takes its local rank's GPU.",
        backend=name,
        reason="ranks share a GPU",
    )
