"""A training loop that survives a restart: it saves a checkpoint every epoch and resumes from it.

Run:  distcomm run -n 2 --max-restarts 1 examples/elastic_train.py --checkpoint ckpt --crash-at 3
      torchrun --nproc-per-node 2 --max-restarts 1 examples/elastic_train.py --checkpoint ckpt \
          --crash-at 3

The model learns y = 3*x0 - 2*x1 + 0.5*x2 + 1 by gradient descent; each rank computes the
gradient of its own batch and the ranks average them (``all_reduce``). After each epoch the main
rank writes the checkpoint (``run_on_main``: its failure would reach every rank), then every rank
waits for it (``barrier``). At start, every rank loads the checkpoint if there is one and goes
on from the epoch after it. ``--crash-at E`` makes rank 1 fail at the start of epoch E on the
job's first attempt only (``distcomm.restart_count() == 0``): the launcher restarts every rank,
they resume from epoch E's checkpoint, and the final weights are the same, bit for bit, as an
uninterrupted run's (each batch is drawn from a seed of its epoch, step and rank).

The checkpoint folder must be one that every rank reads: on one node any folder; on several,
a shared file system.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

import distcomm

TRUE = torch.tensor([3.0, -2.0, 0.5, 1.0])  # three weights, then the bias


def batch(epoch: int, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch at (epoch, step): the same on every attempt."""
    generator = torch.Generator().manual_seed(epoch * 100_003 + step * 101 + rank)
    x = torch.cat([torch.randn(32, 3, generator=generator), torch.ones(32, 1)], dim=1)
    return x, x @ TRUE + 0.01 * torch.randn(32, generator=generator)


def save(path: str, epoch: int, weights: torch.Tensor) -> None:
    """Write the checkpoint atomically (a crash while writing leaves the previous one)."""
    part = f"{path}.part"
    with open(part, "w", encoding="utf-8") as out:
        json.dump({"epoch": epoch, "weights": weights.tolist()}, out)
    os.replace(part, path)


def load(path: str) -> tuple[int, torch.Tensor]:
    """The next epoch and the weights: from the checkpoint, or from the start."""
    if not os.path.exists(path):
        return 0, torch.zeros(4, dtype=torch.float64)
    with open(path, encoding="utf-8") as saved:
        state = json.load(saved)
    return state["epoch"] + 1, torch.tensor(state["weights"], dtype=torch.float64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="the checkpoint folder")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--steps", type=int, default=20, help="steps per epoch")
    parser.add_argument("--crash-at", type=int, default=None, metavar="EPOCH")
    args = parser.parse_args()

    comm = distcomm.init()
    rank, world = comm.rank, comm.world_size
    path = os.path.join(args.checkpoint, "state.json")
    distcomm.run_on_main(os.makedirs, (args.checkpoint,), {"exist_ok": True})
    start, weights = load(path)
    if distcomm.is_main_process():
        attempt = f"restart {distcomm.restart_count()}" if distcomm.restart_count() else "start"
        print(f"{attempt}: from epoch {start} of {args.epochs}", flush=True)
    for epoch in range(start, args.epochs):
        if epoch == args.crash_at and rank == 1 and distcomm.restart_count() == 0:
            sys.exit(f"rank 1: a simulated failure at the start of epoch {epoch}")
        for step in range(args.steps):
            x, y = batch(epoch, step, rank)
            gradient = 2 * x.T.double() @ (x.double() @ weights - y.double()) / len(y)
            distcomm.all_reduce(gradient)
            weights -= 0.05 * gradient / world
        distcomm.run_on_main(save, (path, epoch, weights))
        distcomm.barrier()  # every rank goes on once the checkpoint is written
    if distcomm.is_main_process():
        print(f"final weights: {json.dumps([round(w, 12) for w in weights.tolist()])}")
    distcomm.finalize()


if __name__ == "__main__":
    main()
