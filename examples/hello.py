"""Hello, distcomm: every rank adds its number, whatever launched it and whichever engine runs.

Run:  distcomm run -n 4 examples/hello.py            (gloo, from distcomm-torch)
      torchrun --nproc-per-node 4 examples/hello.py
      srun -n 4 python examples/hello.py
"""

from __future__ import annotations

import numpy as np

import distcomm


def main() -> None:
    comm = distcomm.init()
    rank, world = comm.rank, comm.world_size

    total = np.array([rank], dtype=np.int64)
    distcomm.all_reduce(total)  # in place: 0 + 1 + ... + (world - 1)
    names = distcomm.all_gather_object(f"rank-{rank}")

    if distcomm.is_main_process():
        print(
            f"{world} ranks on {comm.backend} ({comm.launch.method} launch): "
            f"sum of ranks {int(total[0])} (expected {world * (world - 1) // 2})"
        )
        print("hello from " + ", ".join(names))
    distcomm.finalize()


if __name__ == "__main__":
    main()
