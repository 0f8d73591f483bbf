"""What a hang looks like with distcomm: rank 1 skips a barrier, and every other rank gets a
DistTimeoutError naming the barrier, its sequence number and rank 1, within the timeout, and
showing where rank 1 is (its Python stack: asleep in ``load_next_shard``). When rank 1 wakes
up, its ``finalize()`` finds that it skipped a collective the others made: a
CollectiveMismatchError naming the barrier, operation #2.

    DISTCOMM_TIMEOUT=3 distcomm run -n 3 examples/timeouts.py

Under ``mpirun -n 3`` (the mpi backend) MPI cannot cancel the blocked barrier: the watchdog
prints the same diagnostic and ends the job (MPI_Abort). The first collective is an async
all-reduce of a temporary: the Work owns it, so nothing can free it under the engine.
"""

import time

import numpy as np

import distcomm


def load_next_shard(seconds: float) -> None:
    time.sleep(seconds)  # rank 1 is busy here while the others wait for it


comm = distcomm.init()
rank = comm.rank
work = distcomm.all_reduce(np.full(4, rank + 1.0), async_op=True)  # a temporary, owned by work
work.wait()
if rank == 1:
    load_next_shard(comm.timeout + 4)  # skips the barrier the others wait in
    print(f"rank {rank}: woke up after the others gave up")
    try:
        distcomm.finalize()
    except distcomm.CollectiveMismatchError as exc:  # finalize sees what rank 1 skipped
        print(f"rank {rank}: finalize: {exc}")
else:
    try:
        distcomm.barrier()
    except distcomm.DistTimeoutError as exc:
        print(f"rank {rank}: {type(exc).__name__}: {exc}")
        print(f"rank {rank}: op={exc.op!r} seq={exc.seq} missing_ranks={exc.missing_ranks}")
    time.sleep(comm.timeout + 3)  # until rank 1 has finalized: rank 0 serves gloo's store
    distcomm.finalize()
