"""A script written for SenseTime's linklink, unchanged, running on distcomm.

Nothing here mentions distcomm: ``python -m distcomm.compat.linklink`` installs distcomm's
linklink API under the name ``linklink`` and runs the script, on whichever backend distcomm
picks (gloo under ``distcomm run``, mpi under ``mpirun``)::

    distcomm run -n 4 -m distcomm.compat.linklink examples/linklink_legacy.py
    mpirun -n 4 python -m distcomm.compat.linklink examples/linklink_legacy.py

Every rank checks what it received and prints one line.
"""

import linklink as link
import torch


def main():
    link.initialize()
    rank, world = link.get_rank(), link.get_world_size()
    total = world * (world + 1) / 2

    grad = torch.full((4,), float(rank + 1))
    link.allreduce(grad)
    assert grad.tolist() == [total] * 4, grad

    best = torch.tensor([float(rank)])
    link.allreduce(best, reduce_op=link.allreduceOp_t.Max)
    assert best.item() == world - 1, best

    grads = [torch.full((3,), float(rank + i)) for i in range(3)]
    for i, g in enumerate(grads):
        link.allreduce_async(f"layer{i}.weight", g)
    link.synchronize()
    for i, g in enumerate(grads):
        assert g.tolist() == [total - world + i * world] * 3, (i, g)

    weights = torch.arange(5.0) if rank == 0 else torch.zeros(5)
    link.broadcast(weights, 0)
    assert weights.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0], weights

    parts = [torch.zeros(2) for _ in range(world)]
    link.allgather(parts, torch.full((2,), float(rank)))
    assert [p[0].item() for p in parts] == list(range(world)), parts

    stacked = torch.zeros(world * 2)
    link.allgather(stacked, torch.full((2,), float(rank)))
    assert stacked.tolist() == [float(r) for r in range(world) for _ in range(2)], stacked

    mine = [torch.zeros(1) for _ in range(world)]
    link.gather(mine, torch.tensor([float(rank)]), 0)
    if rank == 0:
        assert [m.item() for m in mine] == list(range(world)), mine

    link.barrier()
    evens = [r for r in range(world) if r % 2 == 0]
    group = link.new_group(ranks=evens)
    if rank in evens:
        ones = torch.ones(1)
        link.allreduce(ones, group_idx=group)
        assert ones.item() == len(evens), ones
    link.barrier()

    print(f"rank {rank} of {world}: linklink script ok on {link.get_backend()}")
    link.finalize()


if __name__ == "__main__":
    main()
