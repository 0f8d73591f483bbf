"""A pipeline schedule's neighbour exchange: each stage sends its activations forward and its
gradients backward in one ``batch_isend_irecv`` per step (the steady state of 1F1B), after the
first stage has sent every other stage the run's settings as a Python object (``send_object``).

The receives of a batch are posted before its sends, so two neighbours that send to each other
at once never wait on one another, on any backend.

Run:  distcomm run -n 4 examples/pipeline_exchange.py        (gloo)
      mpirun -n 4 python examples/pipeline_exchange.py      (mpi)
"""

from __future__ import annotations

import numpy as np

import distcomm
from distcomm import P2POp


def main() -> None:
    comm = distcomm.init()
    rank, stages = comm.rank, comm.world_size
    first, last = rank == 0, rank == stages - 1
    if first:
        settings = {"steps": 8, "width": 4}
        for stage in range(1, stages):
            distcomm.send_object(settings, stage)
    else:
        settings = distcomm.recv_object(0)

    wrong = np.zeros(1, dtype=np.int64)
    for step in range(settings["steps"]):
        activation = np.full(settings["width"], 100 * rank + step, dtype=np.float32)
        gradient = -activation
        from_previous = np.zeros_like(activation)  # the previous stage's activation
        from_next = np.zeros_like(activation)  # the next stage's gradient
        ops = []
        if not last:
            ops += [P2POp(distcomm.isend, activation, rank + 1)]
            ops += [P2POp(distcomm.irecv, from_next, rank + 1)]
        if not first:
            ops += [P2POp(distcomm.isend, gradient, rank - 1)]
            ops += [P2POp(distcomm.irecv, from_previous, rank - 1)]
        for work in distcomm.batch_isend_irecv(ops):
            work.wait()
        if not first:
            wrong += int(np.any(from_previous != 100 * (rank - 1) + step))
        if not last:
            wrong += int(np.any(from_next != -(100 * (rank + 1) + step)))

    distcomm.all_reduce(wrong)
    if first:
        print(
            f"{stages} stage{'s' if stages > 1 else ''} on {comm.backend}, "
            f"{settings['steps']} steps: "
            f"{int(wrong[0])} exchanges with a wrong value"
        )
    distcomm.finalize()


if __name__ == "__main__":
    main()
