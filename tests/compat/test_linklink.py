"""distcomm.compat.linklink: the linklink API on distcomm backends.

The unchanged legacy script (examples/linklink_legacy.py) runs on gloo under ``distcomm run`` and
on mpi under ``mpirun``; the finer behaviour is checked on thread-ranks (fakelink).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from jobs import run_job

import distcomm
from distcomm.compat import linklink
from distcomm.testing import run_threads

ROOT = Path(__file__).resolve().parents[2]
LEGACY = "examples/linklink_legacy.py"


def run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return run_job(command, cwd=ROOT)


@pytest.mark.timeout(200)
def test_legacy_script_runs_unchanged_on_gloo() -> None:
    done = run(
        [
            sys.executable,
            "-m",
            "distcomm",
            "run",
            "-n",
            "3",
            "--backend",
            "gloo",
            "-m",
            "distcomm.compat.linklink",
            LEGACY,
        ]
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in range(3):
        assert f"[rank {rank}] rank {rank} of 3: linklink script ok on gloo" in done.stdout


@pytest.mark.timeout(200)
@pytest.mark.parametrize("nprocs", [2, 4])
def test_legacy_script_runs_unchanged_on_mpi(mpirun: str, nprocs: int) -> None:
    done = run(
        [mpirun, "-n", str(nprocs), sys.executable, "-m", "distcomm.compat.linklink", LEGACY]
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in range(nprocs):
        assert f"rank {rank} of {nprocs}: linklink script ok on mpi" in done.stdout


@pytest.fixture
def clean_modules() -> Iterator[None]:
    """No linklink in sys.modules before, and none left after (install() puts one there)."""
    names = ("linklink", "spring", "spring.linklink")
    saved = {name: sys.modules.pop(name) for name in names if name in sys.modules}
    yield
    for name in names:
        sys.modules.pop(name, None)
    sys.modules.update(saved)


@pytest.mark.usefixtures("clean_modules")
def test_install_makes_import_linklink_resolve_here() -> None:
    assert linklink.install() is linklink
    import linklink as link  # type: ignore[import-not-found]

    assert link is linklink and link.__distcomm_shim__
    linklink.install("spring.linklink")
    import spring.linklink as spring_link  # type: ignore[import-not-found]

    assert spring_link is linklink
    with pytest.raises(distcomm.InvalidArgumentError, match=r"'linklink' and 'spring\.linklink'"):
        linklink.install("torch")


def test_module_runner_usage() -> None:
    done = run([sys.executable, "-m", "distcomm.compat.linklink"])
    assert done.returncode == 2 and "usage: python -m distcomm.compat.linklink" in done.stderr


def test_world_of_one_before_initialize() -> None:
    assert (linklink.get_rank(), linklink.get_world_size(), linklink.get_local_rank()) == (0, 1, 0)
    assert not linklink.is_initialized() and linklink.get_backend() is None
    t = np.arange(3.0)
    linklink.allreduce(t)
    linklink.allreduce_async("w", t)
    linklink.synchronize()
    linklink.broadcast(t, 0)
    assert t.tolist() == [0.0, 1.0, 2.0]


def test_initialize_and_finalize_run_distcomm() -> None:
    linklink.initialize()
    try:
        assert linklink.is_initialized() and linklink.get_backend() == "fakelink"
        handle = linklink.new_group([0])
        assert handle == 1
    finally:
        linklink.finalize()
    assert not linklink.is_initialized()
    linklink.initialize()
    try:
        with pytest.raises(distcomm.InvalidArgumentError, match="do not survive finalize"):
            linklink.allreduce(np.ones(1), group_idx=handle)
    finally:
        linklink.finalize()


def ops(rank: int, world: int) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    x = np.full(2, float(rank + 1))
    linklink.allreduce(x, linklink.allreduceOp_t.Min)
    seen["min"] = x.tolist()
    works = [
        linklink.allreduce_async(np.full(1, float(rank)), reduce_op=linklink.allreduceOp_t.Max)
        for _ in range(2)
    ]
    linklink.synchronize()
    seen["async_done"] = all(w.is_completed() for w in works)
    y = np.full(1, float(rank))
    linklink.allreduce_async(y, linklink.allreduceOp_t.Sum, linklink.group.WORLD)
    linklink.synchronize()
    seen["positional"] = y.item()
    odds = linklink.new_group(ranks=[r for r in range(world) if r % 2])
    seen["handle"] = odds
    if rank % 2:
        z = np.ones(1)
        linklink.allreduce(z, group_idx=odds)
        seen["odd_sum"] = z.item()
        w = np.full(1, float(rank))
        linklink.broadcast(w, 0, group_idx=odds)  # root 0 of the group: world rank 1
        seen["odd_bcast"] = w.item()
    else:
        with pytest.raises(distcomm.InvalidArgumentError, match="not a member"):
            linklink.allreduce(np.ones(1), group_idx=odds)
    with pytest.raises(distcomm.InvalidArgumentError, match="group_idx=7"):
        linklink.barrier(group_idx=7)
    with pytest.raises(TypeError, match="allreduce_async takes"):
        linklink.allreduce_async("name")
    comm = distcomm.new_group(list(range(world)))
    v = np.ones(1)
    linklink.allreduce(v, group_idx=comm)  # a distcomm communicator as the group
    seen["comm_group"] = v.item()
    return seen


def test_collectives_groups_and_async_on_thread_ranks() -> None:
    world = 4
    results = run_threads(lambda: ops(distcomm.get_rank(), world), world)
    for rank, seen in enumerate(results):
        assert seen["min"] == [1.0, 1.0]
        assert seen["async_done"]
        assert seen["positional"] == sum(range(world))
        assert seen["handle"] == 1
        assert seen["comm_group"] == world
        if rank % 2:
            assert (seen["odd_sum"], seen["odd_bcast"]) == (2.0, 1.0)
