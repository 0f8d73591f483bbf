"""A job whose rank sends an object that runs a command where it is unpickled (its __reduce__ is
``os.system``): ``python hostile_objects.py OP MARKER`` under a launcher. OP is
``all_gather_object`` (rank 1 sends it) or ``broadcast_object`` (rank 0 sends it). The ranks
that receive it must raise ObjectRefusedError, uncaught, and MARKER must never be created."""

from __future__ import annotations

import os
import sys
from typing import Any

import distcomm


class Command:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> Any:
        return (os.system, (self.command,))


def main() -> None:
    op, marker = sys.argv[1], sys.argv[2]
    distcomm.init()
    rank = distcomm.get_rank()
    attack = Command(f"touch {marker}")
    if op == "all_gather_object":
        distcomm.all_gather_object(attack if rank == 1 else f"rank {rank}")
    else:
        distcomm.broadcast_object(attack if rank == 0 else None, src=0)
        if rank == 0:
            distcomm.barrier()  # the others are gone: the launcher ends this rank
    print(f"rank {rank} finished", flush=True)
    distcomm.finalize()


if __name__ == "__main__":
    main()
