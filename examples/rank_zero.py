"""Rank-zero helpers and the workspace: prepare once, load everywhere, merge on one rank.

    python examples/rank_zero.py               # one process
    distcomm run -n 4 examples/rank_zero.py    # four (gloo, or whatever is installed)
    mpirun -n 4 python examples/rank_zero.py   # four MPI ranks

Rank 0 "downloads" a vocabulary while the others wait (zero_first), every rank computes a
shard, and rank 0 receives all shards through shared memory (distcomm.workspace), with no copy
through the engine.
"""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np

import distcomm
from distcomm import workspace


def main() -> None:
    distcomm.init()
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    cache = os.path.join(tempfile.gettempdir(), f"distcomm-example-vocab-{os.getuid()}.json")

    with distcomm.zero_first():  # rank 0 first; the others find its file in the cache
        if not os.path.exists(cache):
            with open(cache, "w") as file:
                json.dump({"words": ["a", "b", "c"]}, file)
        with open(cache) as file:
            vocabulary = json.load(file)["words"]

    shard = np.full(4, float(rank))
    shards = workspace.gather_tensors(shard)  # [] except on rank 0
    if shards:
        merged = np.concatenate(shards)
        print(f"rank 0 merged {len(shards)} shards: sum {merged.sum():g}", flush=True)

    @distcomm.main_process_only
    def summary() -> str:
        return f"{world} ranks, vocabulary of {len(vocabulary)}"

    print(distcomm.rank_prefixed_message(summary()), flush=True)
    distcomm.barrier()
    if rank == 0:
        os.unlink(cache)
    distcomm.finalize()


if __name__ == "__main__":
    main()
