"""A 2 x 2 mesh on 4 ranks (tests/runtime/test_meshes.py starts it under each launcher): data
parallel all_reduce along ``dp``, tensor parallel all_gather along ``tp``, and DDP training on
the ``dp`` group of ``mesh.torch()``. Each rank writes what it saw to ``rank-N.json`` in the
folder given."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

import distcomm


def main() -> None:
    out = Path(sys.argv[1])
    comm = distcomm.init()
    rank = comm.rank
    mesh = distcomm.mesh((2, 2), ("dp", "tp"))
    grad = np.array([float(rank)])
    distcomm.all_reduce(grad, group=mesh["dp"])
    shards = np.zeros(2)
    mesh["tp"].all_gather_into_tensor(shards, np.array([10.0 * rank]))

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    dp = mesh.torch()["dp"].get_group()
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=dp)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(rank)
    for _ in range(3):
        x = torch.randn(8, 4, generator=generator)
        optimizer.zero_grad()
        ddp(x).pow(2).mean().backward()
        optimizer.step()
    weights = [float(w) for w in model.weight.detach().reshape(-1)]
    (out / f"rank-{rank}.json").write_text(
        json.dumps(
            {
                "coordinate": list(mesh.coordinate),
                "dp_sum": grad.item(),
                "tp": shards.tolist(),
                "weights": weights,
                "backend": comm.backend,
            }
        )
    )
    distcomm.finalize()


if __name__ == "__main__":
    main()
