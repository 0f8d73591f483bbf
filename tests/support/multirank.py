"""Run many multi-rank scenarios in one world per backend: 4 thread-ranks, 4 gloo processes, an
``mpirun -n 4`` job.

A scenario is a top-level function ``fn(workdir) -> value`` registered with :func:`scenario`;
every rank of the world runs every scenario, in registration order, and the per-rank values
come back as ``{"module:name": [value of rank 0, ...]}``. ``workdir`` is a directory all ranks
share. Scenarios must not leave ranks waiting on each other when one fails on purpose: that is
what the fault scenarios check. One world per backend keeps process starts (each importing
torch) to three for the whole suite.

Run as a script, this is the body of each MPI rank: ``python multirank.py OUT WORKDIR
module:name ...``.
"""

from __future__ import annotations

import importlib
import os
import pickle
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobs import dev_shm_names

WORLD = 4
SCENARIOS: list[str] = []
_HERE = Path(__file__).resolve().parent


def scenario(fn: Callable[[str], Any]) -> Callable[[str], Any]:
    """Register ``fn`` to run on every rank of every backend's world."""
    SCENARIOS.append(f"{fn.__module__}:{fn.__qualname__}")
    return fn


def run_scenarios(names: list[str], workdir: str) -> dict[str, Any]:
    """The body of one rank: every scenario, in order."""
    results = {}
    for name in names:
        module, _, attr = name.partition(":")
        results[name] = getattr(importlib.import_module(module), attr)(workdir)
    return results


def shm_files() -> set[str]:
    """distcomm's files in /dev/shm now, but those a running process uses."""
    return {name for name in dev_shm_names() if name.startswith("distcomm-")}


def by_scenario(per_rank: list[dict[str, Any]]) -> dict[str, list[Any]]:
    return {name: [rank[name] for rank in per_rank] for name in per_rank[0]}


def on_threads(names: list[str], workdir: str) -> dict[str, list[Any]]:
    from distcomm.testing import run_threads

    return by_scenario(run_threads(run_scenarios, WORLD, names, workdir, timeout=120))


def on_gloo(names: list[str], workdir: str) -> dict[str, list[Any]]:
    from distcomm.testing import spawn

    return by_scenario(spawn(run_scenarios, WORLD, names, workdir, backend="gloo", timeout=180))


def on_mpi(names: list[str], workdir: str, mpirun: str, env: dict[str, str]) -> dict[str, Any]:
    """One ``mpirun -n 4`` job; each rank pickles its results into ``workdir``."""
    paths = os.pathsep.join(
        sorted({str(Path(sys.modules[n.partition(":")[0]].__file__ or "").parent) for n in names})
    )
    env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [paths, env.get("PYTHONPATH")]))}
    out = tempfile.mkdtemp(prefix="multirank-", dir=workdir)
    command = [mpirun, "-n", str(WORLD), sys.executable, __file__, out, workdir, *names]
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL
    )
    if done.returncode != 0:
        raise AssertionError(f"mpirun failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    per_rank = [pickle.loads(Path(out, f"rank-{r}.pkl").read_bytes()) for r in range(WORLD)]
    return by_scenario(per_rank)


def _mpi_rank(out: str, workdir: str, names: list[str]) -> None:
    import distcomm

    comm = distcomm.init()
    try:
        results = run_scenarios(names, workdir)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)  # the launcher ends the other ranks, which may be waiting for this one
    results["backend"] = comm.backend
    Path(out, f"rank-{comm.rank}.pkl").write_bytes(pickle.dumps(results))
    distcomm.finalize()


if __name__ == "__main__":
    sys.path.insert(0, str(_HERE))
    _mpi_rank(sys.argv[1], sys.argv[2], sys.argv[3:])


def outcome(fn: Callable[..., Any]) -> str:
    """The key of scenario ``fn`` in a world's results."""
    return f"{fn.__module__}:{fn.__qualname__}"


def caught(fn: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    """``("ok", value)``; a RankFailedError as ``("RankFailedError", its rank)``; any other
    exception as ``(its type's name, its message)``. Picklable, for every backend's world."""
    from distcomm.errors import RankFailedError

    try:
        return "ok", fn(*args)
    except RankFailedError as exc:
        return "RankFailedError", exc.rank
    except Exception as exc:
        return type(exc).__name__, str(exc)
