"""distcomm's debugging aids, each meeting the bug it is for (docs/debugging.md):

- a hook that counts the collectives and the bytes they move;
- the mismatch check: rank 0's batch is larger than the others';
- the main-only guard: a collective inside ``main_process_only``;
- ``assert_same``: one rank's weights drifted;
- a mismatch late in the job among batches whose size varies, each size made before: every
  rank checks such a call before the engine sees it, and names it; nothing ran.

    distcomm run -n 2 examples/debugging.py        (gloo; mpirun -n 2 python ... for mpi)

Every bug is caught and printed, and the job ends normally.
"""

import numpy as np

import distcomm

comm = distcomm.init()
rank = comm.rank
moved = {"calls": 0, "bytes": 0}


def count(event: distcomm.CollectiveEvent) -> None:
    moved["calls"] += 1
    moved["bytes"] += (event.numel or 0) * (4 if event.dtype == "float32" else 8)


with distcomm.add_hook(before=count):
    grads = np.full(1000, rank, dtype=np.float32)
    distcomm.all_reduce(grads)
    distcomm.broadcast_object({"lr": 0.1})
print(f"rank {rank}: the hook saw {moved['calls']} collectives, {moved['bytes']} tensor bytes")

batch = np.ones(6 if rank == 0 else 4, dtype=np.float32)  # a bug: rank 0's batch is larger
try:
    distcomm.all_reduce(batch)
except distcomm.CollectiveMismatchError as exc:
    sizes = [row["numel"] for row in exc.table]
    print(f"rank {rank}: mismatch at #{exc.seq}: element counts by rank {sizes}")


@distcomm.main_process_only
def save_checkpoint() -> None:
    distcomm.barrier()  # a bug: only main runs this function


try:
    save_checkpoint()
except distcomm.MainOnlyCollectiveError as exc:
    print(f"rank {rank}: MainOnlyCollectiveError: {exc.op} inside {exc.region.split(' (')[0]}")
except distcomm.RankFailedError as exc:
    print(f"rank {rank}: RankFailedError: rank {exc.rank} failed in main_process_only")

weights = {"layer.weight": np.ones((2, 2)), "layer.bias": np.zeros(2)}
if rank == comm.world_size - 1:
    weights["layer.bias"][0] = 1e-7  # drifted
try:
    distcomm.assert_same(weights, what="weights after step 1")
except distcomm.NotSameError as exc:
    print(f"rank {rank}: NotSameError: ranks {exc.ranks} differ in {exc.keys}")

sizes = [4, 6, 4, 8]  # batches whose size varies, in a pattern
try:
    for step in range(200):  # a bug at step 149: rank 1's batch has another step's size
        n = 8 if (rank == 1 and step == 149) else sizes[step % 4]
        distcomm.all_reduce(np.zeros(n, dtype=np.float32))
except distcomm.CollectiveMismatchError as exc:
    assert exc.ran is None  # stopped before the engine saw it: the communicator still works
    print(f"rank {rank}: late mismatch at #{exc.seq}, stopped before it ran")
distcomm.barrier()
distcomm.finalize()
