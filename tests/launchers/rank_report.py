"""The body of each rank in the launcher tests: initialise as told, report what distcomm sees.

    python rank_report.py OUT_DIR MODE BACKEND

MODE ``dist_init`` calls ``distcomm.dist_init(method="slurm", backend=...)``; MODE ``init``
calls ``distcomm.init(backend=...)`` with the launch detected. BACKEND ``auto`` leaves the
backend to distcomm. Each rank writes ``OUT_DIR/rank-<rank>.json``.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import distcomm


def main() -> None:
    out, mode, backend = sys.argv[1], sys.argv[2], sys.argv[3]
    chosen = None if backend == "auto" else backend
    if mode == "dist_init":
        distcomm.dist_init(method="slurm", backend=chosen)
    else:
        distcomm.init(backend=chosen)
    comm = distcomm.get_communicator()
    launch = comm.launch
    report = {
        "rank": comm.rank,
        "world_size": comm.world_size,
        "local_rank": distcomm.get_local_rank(),
        "local_world_size": distcomm.get_local_world_size(),
        "node_rank": distcomm.get_node_rank(),
        "num_nodes": launch.num_nodes,
        "backend": comm.backend,
        "method": launch.method,
        "master_addr": launch.master_addr,
        "host": socket.gethostname(),
        "sum": distcomm.all_reduce(comm.rank + 1),
        "hosts": distcomm.all_gather_object(socket.gethostname()),
        # whether the world's CPU tensors moved through node memory (docs/backends.md)
        "node_memory": getattr(getattr(comm, "_node", None), "calls", 0) > 0,
    }
    distcomm.finalize()
    Path(out, f"rank-{report['rank']}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
