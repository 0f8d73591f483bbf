"""What the restricted unpickling of a peer's objects costs (docs/security.md), 2 ranks, one run.

Run:  distcomm run -n 2 --backend gloo benchmarks/object_policy.py [--rounds 7]
      mpirun -n 2 python benchmarks/object_policy.py [--rounds 7]
      (by hand, not in CI; about 30 s each on this 2-core machine)

Every object operation distcomm bench times, with benchmarks/peers.py's objects (1 KiB: a dict
holding 1000 bytes; 16 MiB: a dict holding a 16 MiB numpy array), under the default policy
("distcomm": the allow-list) and under plain pickle ("plain pickle": ``DISTCOMM_OBJECTS=pickle``),
the two taking turns round by round on the same objects (benchmarks/timing.py). Each side sets
its policy before each call, so both pay the same for that. Rank 0 prints the table: a ratio
(plain pickle / distcomm) of at least 0.95 means the allow-list costs at most 5%.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from peers import CALLS, OBJECT_OPS, OBJECT_SIZES, make_object
from timing import comparison_table, interleaved

import distcomm
from distcomm import _unpickling


def sides(op: str, label: str) -> dict[str, Callable[[], object]]:
    obj = make_object(label)
    world = distcomm.get_world_size()
    calls: dict[str, Callable[[], object]] = {
        "all_gather_object": lambda: distcomm.all_gather_object(obj),
        "broadcast_object": lambda: distcomm.broadcast_object(obj),
        "gather_object": lambda: distcomm.gather_object(obj, 0),
        "scatter_object": lambda: distcomm.scatter_object([obj] * world, 0),
    }
    call = calls[op]
    return {
        "distcomm": lambda: (_unpickling.set_policy("restricted"), call()),
        "plain pickle": lambda: (_unpickling.set_policy("pickle"), call()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    comm = distcomm.init()
    engine = comm.backend
    results: dict[str, dict[str, dict[str, list[float]]]] = {engine: {}}
    for op in OBJECT_OPS:
        for label in OBJECT_SIZES:
            calls = CALLS.get(engine, CALLS["gloo"])[label]
            samples = interleaved(sides(op, label), calls, args.rounds, distcomm.barrier)
            results[engine][f"{op} {label}"] = samples
    if distcomm.is_main_process():
        print("\n".join(comparison_table(results)), flush=True)
    distcomm.finalize()


if __name__ == "__main__":
    main()
