"""The body of each rank in the "a rank is late" tests, under any launcher.

    python straggler.py FLAG_DIR

The odd ranks sleep in ``load_a_huge_shard`` while the even ones enter an all-reduce and wait
past ``DISTCOMM_TIMEOUT``. Each even rank prints ``rank R: <its DistTimeoutError>`` on stdout
(:func:`late_ranks` returns it) and drops a flag in FLAG_DIR; the odd ranks wake when every even
rank has, finalize (which says that they skipped the all-reduce: a collective mismatch), and
drop a flag of their own, which the even ranks wait for before they
exit (rank 0 serves torch's store: it leaves last). Under MPI the blocked all-reduce ends the
job instead, with the same diagnostic.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import numpy as np

import distcomm


def load_a_huge_shard(flags: Path, expected: int) -> None:
    wait_for(flags, "timed-out-*", expected)


def wait_for(flags: Path, pattern: str, expected: int) -> None:
    """Block in one call until ``expected`` flags match (60 s at most).

    A thread polls the folder while this thread waits on an event, so every late rank's stack,
    whenever it is sampled, ends on the same line (a rank caught in ``glob`` and another in
    ``sleep`` would be shown apart instead of as "ranks 1, 3").
    """
    arrived = threading.Event()

    def poll() -> None:
        deadline = time.monotonic() + 60
        while len(list(flags.glob(pattern))) < expected and time.monotonic() < deadline:
            time.sleep(0.05)
        arrived.set()

    threading.Thread(target=poll, name="straggler-flags", daemon=True).start()
    arrived.wait()


def late_ranks(folder: str) -> str | None:
    """This rank's part (it is initialised); an even rank's error message, else None."""
    flags = Path(folder)
    rank, size = distcomm.get_rank(), distcomm.get_world_size()
    late = size // 2
    if rank % 2:
        load_a_huge_shard(flags, size - late)
        try:
            distcomm.finalize()
        except distcomm.CollectiveMismatchError as exc:  # it is one: this rank skipped #1
            assert exc.seq == 1, exc
        (flags / f"done-{rank}").touch()
        return None
    try:
        distcomm.all_reduce(np.ones(2))
        said = "the all-reduce returned"
    except distcomm.DistTimeoutError as exc:
        said = str(exc)
    (flags / f"timed-out-{rank}").touch()
    wait_for(flags, "done-*", late)
    return said


def main() -> None:
    distcomm.init()
    said = late_ranks(sys.argv[1])
    if said is not None:
        print(f"rank {distcomm.get_rank()}: {said}", flush=True)


if __name__ == "__main__":
    main()
