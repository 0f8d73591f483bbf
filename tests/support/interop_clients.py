"""torch-native libraries right after ``distcomm.init()``, under any launcher: the body of every
rank in the interop tests.

    python interop_clients.py OUT_DIR

The program imports torch, then ``distcomm.init()`` with automatic selection (gloo under
``distcomm run`` and torchrun, mpi under mpirun and ``srun --mpi=pmi2``, with torch's default
process group made beside it), then runs each client in turn: DDP, FSDP, HF Accelerate and
PyTorch-Ignite. Each rank writes ``OUT_DIR/rank-<rank>.json``: per client, what it saw, or
``"error: <type>: <message>"``.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import distcomm


def ddp() -> dict[str, Any]:
    """One SGD step on different data per rank: DDP averages the gradients, so every rank
    ends with the same weights (also made the same at the start: DDP broadcasts rank 0's)."""
    from torch.nn.parallel import DistributedDataParallel

    rank = distcomm.get_rank()
    torch.manual_seed(rank)  # different initial weights per rank
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    before = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(8, 4) + rank).sum().backward()
    optimizer.step()
    weights = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
    everyone = distcomm.all_gather_object(weights)
    return {"same_weights": all(w == everyone[0] for w in everyone), "stepped": weights != before}


def fsdp() -> dict[str, Any]:
    """FSDP2 (``fully_shard``) on a CPU device mesh: one step, the same full weights after."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    rank = distcomm.get_rank()
    mesh = init_device_mesh("cpu", (distcomm.get_world_size(),))
    torch.manual_seed(0)  # FSDP does not broadcast: the same initial weights everywhere
    model = fully_shard(torch.nn.Linear(4, 2), mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(8, 4) + rank).sum().backward()
    optimizer.step()
    full = [p.full_tensor().flatten() for p in model.parameters()]  # type: ignore[attr-defined]
    weights = torch.cat(full).tolist()
    everyone = distcomm.all_gather_object(weights)
    return {"same_weights": all(w == everyone[0] for w in everyone)}


def accelerate() -> dict[str, Any]:
    from accelerate import Accelerator
    from accelerate.utils import gather_object

    accelerator = Accelerator(cpu=True)
    gathered = accelerator.gather(torch.tensor([float(distcomm.get_rank())]))
    return {
        "num_processes": accelerator.num_processes,
        "process_index": accelerator.process_index,
        "gather": gathered.tolist(),
        "gather_object": gather_object([f"rank {distcomm.get_rank()}"]),
    }


def ignite() -> dict[str, Any]:
    import ignite.distributed as idist

    return {
        "backend": idist.backend(),
        "world_size": idist.get_world_size(),
        "rank": idist.get_rank(),
        "all_reduce": idist.all_reduce(torch.tensor([1.0])).tolist(),
        "all_gather": idist.all_gather(torch.tensor([float(distcomm.get_rank())])).tolist(),
    }


CLIENTS: dict[str, Callable[[], dict[str, Any]]] = {
    "ddp": ddp,
    "fsdp": fsdp,
    "accelerate": accelerate,
    "ignite": ignite,
}


def main() -> None:
    out = Path(sys.argv[1])
    comm = distcomm.init()
    made = getattr(comm, "torch_group", None) is not None
    seen: dict[str, Any] = {"backend": comm.backend, "torch_group": made}
    for name, client in CLIENTS.items():
        try:
            seen[name] = client()
        except Exception as exc:
            seen[name] = f"error: {type(exc).__name__}: {exc}"
            traceback.print_exc()
        distcomm.barrier()  # the next client starts together
    (out / f"rank-{comm.rank}.json").write_text(json.dumps(seen))
    distcomm.finalize()


if __name__ == "__main__":
    main()
