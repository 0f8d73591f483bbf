"""A real, small DDP training on CPU: distcomm starts the job, torch's DDP trains, distcomm
averages the metrics.

Run:  distcomm run -n 2 examples/ddp_train.py [--steps 300]      (gloo)
      mpirun -n 2 python examples/ddp_train.py                   (mpi)

The model learns y = 3*x0 - 2*x1 + 0.5*x2 + 1 from synthetic data; each rank draws its own
batches. ``distcomm.init()`` leaves torch's default process group behind whatever backend it
picks (gloo makes it; beside mpi distcomm makes one, docs/interop.md), and DDP averages the
gradients over it; the loss printed is the mean over ranks (``all_reduce(x, "mean")``, on the
backend distcomm picked).
"""

from __future__ import annotations

import argparse

import torch

import distcomm

TRUE_WEIGHTS = torch.tensor([[3.0, -2.0, 0.5]])
TRUE_BIAS = 1.0


def batch(generator: torch.Generator, size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(size, 3, generator=generator)
    noise = 0.01 * torch.randn(size, 1, generator=generator)
    return x, x @ TRUE_WEIGHTS.T + TRUE_BIAS + noise


def train(steps: int) -> tuple[float, float]:
    """Train for ``steps``; return the first and last loss averaged over ranks."""
    rank = distcomm.get_rank()
    torch.manual_seed(0)  # identical initial weights on every rank (DDP also broadcasts them)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    )
    optimiser = torch.optim.Adam(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(1000 + rank)
    first = last = 0.0
    for step in range(steps):
        x, y = batch(generator)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimiser.zero_grad()
        loss.backward()  # DDP all-reduces the gradients here
        optimiser.step()
        last = distcomm.all_reduce(loss.item(), op="mean")
        first = last if step == 0 else first
        if distcomm.is_main_process() and step % 50 == 0:
            print(f"step {step:4d}  loss {last:.4f}")
    return first, last


def main() -> None:
    parser = argparse.ArgumentParser(description="tiny DDP training over distcomm")
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()

    distcomm.init()  # torch was imported: torch's default process group exists after it
    # The DDP model lives inside train(): it is gone before finalize() destroys the group it
    # uses (a DDP module that outlives its Gloo group can abort the process at exit).
    first, last = train(args.steps)
    if distcomm.is_main_process():
        print(
            f"done: loss {first:.4f} -> {last:.4f} over {args.steps} steps "
            f"on {distcomm.get_world_size()} ranks"
        )
    distcomm.finalize()


if __name__ == "__main__":
    main()
