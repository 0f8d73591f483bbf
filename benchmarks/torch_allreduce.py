"""distcomm.all_reduce against torch.distributed.all_reduce on the same tensor and process group.

Run:  distcomm run -n 2 benchmarks/torch_allreduce.py [--rounds 7]

Both sides run in one job, interleaved round by round after a warm-up, on a float32 tensor of
8 bytes and of 64 MiB. Rank 0 prints, per size, each side's median time per call with the
min-max over rounds, and the median (min-max) of the per-round ratio distcomm / torch.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from timing import cell, interleaved, ratio

import distcomm

SIZES = {"8 B": 2, "64 MiB": 16 * 1024 * 1024}  # float32 elements
CALLS = {"8 B": 2000, "64 MiB": 5}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    distcomm.init(backend="gloo")
    if distcomm.is_main_process():
        print(f"{distcomm.get_world_size()} ranks, gloo, torch {torch.__version__}")
        print(f"{'size':<7} {'distcomm':>22} {'torch.distributed':>22} {'ratio':>18}")
    for label, numel in SIZES.items():
        tensor = torch.ones(numel, dtype=torch.float32)
        sides = {
            "distcomm": lambda t=tensor: distcomm.all_reduce(t),
            "torch": lambda t=tensor: dist.all_reduce(t),
        }
        times = interleaved(sides, CALLS[label], args.rounds, sync=distcomm.barrier)
        if distcomm.is_main_process():
            ours, theirs = times["distcomm"], times["torch"]
            print(f"{label:<7} {cell(ours):>22} {cell(theirs):>22} {ratio(ours, theirs):>18}")
    distcomm.finalize()


if __name__ == "__main__":
    main()
