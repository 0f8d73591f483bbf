"""A DDP training step on CPU, 2 ranks: torch's own gloo against torch's groups over distcomm.

Run:  mpirun -n 2 python benchmarks/ddp_step.py [--rounds 5] [--steps 20] [--width 512]

One job, three sides taking turns each round after a warm-up round:
- ``torch gloo``: ``distcomm.init(backend="gloo")``; DDP on torch's own Gloo group;
- ``distcomm/gloo``: ``init(backend="gloo", torch_group="distcomm")``; DDP on torch's group
  ``"distcomm"``, whose all-reduces run on distcomm's communicator over Gloo;
- ``distcomm/mpi``: ``init(backend="mpi", torch_group="distcomm")``; the same over MPICH.

Each side makes its world, a DDP model (a 4-layer MLP, ``--width`` 512: about 4 MiB of float32
parameters), runs 40 untimed steps (past the mismatch check's first 64 collectives, which it
checks every one of: a long job runs sampled), then times ``--steps`` steps (forward, backward
with DDP's all-reduces, SGD). Rank 0
prints each side's median time per step (min-max over rounds, the slowest rank's), and the
ratios torch gloo / each side (> 1: the side is faster).
"""

from __future__ import annotations

import argparse
import time

import torch
from mpi4py import MPI
from timing import cell, ratio

import distcomm

SIDES = {
    "torch gloo": {"backend": "gloo"},
    "distcomm/gloo": {"backend": "gloo", "torch_group": "distcomm"},
    "distcomm/mpi": {"backend": "mpi", "torch_group": "distcomm"},
}


def step_time(options: dict[str, str], steps: int, width: int) -> float:
    """Seconds per DDP step on the world ``init(**options)`` makes (the slowest rank's)."""
    distcomm.init(**options)
    try:
        return _timed(steps, width)
    finally:
        distcomm.finalize()


def _timed(steps: int, width: int) -> float:
    world = MPI.COMM_WORLD
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(4):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch = torch.randn(32, width, generator=torch.Generator().manual_seed(world.rank))

    def step() -> None:
        optimizer.zero_grad()
        model(batch).pow(2).mean().backward()
        optimizer.step()

    for _ in range(40):  # DDP's first step builds its buckets; the check's first 64 calls
        step()
    world.Barrier()
    began = time.perf_counter()
    for _ in range(steps):
        step()
    took = (time.perf_counter() - began) / steps
    return float(world.allreduce(took, op=MPI.MAX))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=512)
    args = parser.parse_args()
    for options in SIDES.values():  # the warm-up
        step_time(options, 2, args.width)
    samples: dict[str, list[float]] = {name: [] for name in SIDES}
    for _ in range(args.rounds):
        for name, options in SIDES.items():
            samples[name].append(step_time(options, args.steps, args.width))
    if MPI.COMM_WORLD.rank == 0:
        size = 4 * (args.width * args.width + args.width) * 4 / 2**20
        print(
            f"DDP step, {MPI.COMM_WORLD.size} ranks, {size:.1f} MiB of parameters, "
            f"{args.rounds} rounds of {args.steps} steps after a warm-up"
        )
        for name, values in samples.items():
            print(f"  {name:14s} {cell(values)}")
        for name in ("distcomm/gloo", "distcomm/mpi"):
            print(f"  torch gloo / {name}: {ratio(samples['torch gloo'], samples[name])}")


if __name__ == "__main__":
    main()
