"""A torch.distributed program, unchanged but for one import (docs/from-torch.md).

    distcomm run -n 2 examples/from_torch.py           # distcomm's drop-in, chosen backend
    mpirun -n 2 python examples/from_torch.py          # the same, on mpi
    torchrun --nproc-per-node 2 examples/from_torch.py
    torchrun --nproc-per-node 2 examples/from_torch.py --torch   # torch.distributed itself

Each rank prints one line of JSON: what it got from each call. The four runs print the same.
"""

import json
import sys

import torch

if "--torch" in sys.argv:
    import torch.distributed as dist
else:
    import distcomm.compat.torch_distributed as dist

if dist.is_available() and not dist.is_initialized():
    dist.init_process_group("gloo" if "--torch" in sys.argv else None)
rank, world = dist.get_rank(), dist.get_world_size()
got = {"rank": rank, "world": world}

total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
pieces = [torch.zeros(2) for _ in range(world)]
dist.all_gather(pieces, torch.full((2,), float(rank)))
got.update(sum=total.item(), pieces=[p.tolist() for p in pieces])

stats = {"rank": rank, "loss": 1.0 / (rank + 1)}
gathered = [None] * world
dist.all_gather_object(gathered, stats)
config = [{"lr": 0.1}, "run-7"] if rank == 0 else [None, None]
dist.broadcast_object_list(config, src=0)
on_last = [None] * world if rank == world - 1 else None
dist.gather_object(rank * 10, on_last, dst=world - 1)
mine = [None]
dist.scatter_object_list(mine, [f"shard-{r}" for r in range(world)] if rank == 0 else None, src=0)
got.update(gathered=gathered, config=config, on_last=on_last, mine=mine)

# a group of the last rank alone (of every rank when there is one): only its member reduces
tail = dist.new_group([world - 1])
value = torch.tensor([float(rank)])
if rank == world - 1:
    dist.all_reduce(value, group=tail)
    got.update(tail_ranks=dist.get_process_group_ranks(tail))
    got.update(tail_root=dist.get_global_rank(tail, 0))
got.update(tail_value=value.item(), rank_in_tail=dist.get_rank(tail))

work = dist.all_reduce(torch.ones(3), async_op=True)
work.wait()
got.update(async_done=work.is_completed())
dist.barrier()
sys.stdout.write(json.dumps(got, sort_keys=True) + "\n")  # one write: the ranks share a pipe
sys.stdout.flush()
dist.destroy_process_group()
