"""distcomm.all_reduce against torch.distributed.all_reduce on the same tensor and process group.

Run:  distcomm run -n 2 benchmarks/torch_allreduce.py [--rounds 7]

Both sides run in one job, interleaved round by round after a warm-up, on a float32 tensor of
8 bytes and of 64 MiB. Rank 0 prints, per size, each side's median time per call with the
min-max over rounds, and the median (min-max) of the per-round ratio distcomm / torch.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

import distcomm

SIZES = {"8 B": 2, "64 MiB": 16 * 1024 * 1024}  # float32 elements
CALLS = {"8 B": 2000, "64 MiB": 5}


def per_call(fn: Callable[[], object], calls: int) -> float:
    distcomm.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


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
        for fn in sides.values():
            per_call(fn, max(1, CALLS[label] // 10))  # warm-up
        times: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(args.rounds):
            for name, fn in sides.items():
                times[name].append(per_call(fn, CALLS[label]))
        if distcomm.is_main_process():
            ratios = [d / t for d, t in zip(times["distcomm"], times["torch"], strict=True)]
            cells = [_cell(times["distcomm"]), _cell(times["torch"])]
            ratio = f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
            print(f"{label:<7} {cells[0]:>22} {cells[1]:>22} {ratio:>18}")
    distcomm.finalize()


def _cell(values: list[float]) -> str:
    scale, unit = (1e6, "us") if statistics.median(values) < 1e-2 else (1e3, "ms")
    low, mid, high = min(values) * scale, statistics.median(values) * scale, max(values) * scale
    return f"{mid:.1f} ({low:.1f}-{high:.1f}) {unit}"


if __name__ == "__main__":
    main()
