"""Repository-wide pytest rules and fixtures (core and backend tests alike).

Every test starts from a plain machine (no launcher or DISTCOMM_* variable) and leaves distcomm
finalised; ``core_registry`` hides installed plugins.

With CI=true a skipped test is a failure: every engine and tool the suite needs (torch, numpy,
the example plugin, mpi4py, mpirun, and Slurm, which the tests install and start as root) is
there, so a skip means a broken install, not a missing machine. Only skips for what CI cannot
have are allowed: a GPU, an MPI world of the wrong size, or root (CI runs as root, so the Slurm
and network-namespace tests run there); their reasons start with one of ``ALLOWED_SKIPS``. A test
that needs a tool (mpirun, ...) gets its path from :func:`require_tool`, which skips outside CI
and fails under CI=true; the ``mpirun`` fixture asks it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import distcomm
from distcomm._plugins.loader import PluginRegistry, set_registry
from distcomm.testing import WarmWorld

sys.path.insert(0, str(Path(__file__).resolve().parent / "tests" / "support"))  # jobs, multirank
from jobs import find_mpirun, in_use, job_environment

pytest_plugins = ("pytester", "scheduling")  # pytester: for testing distcomm's own pytest plugin

#: "Test requires": pytest-mpi's min_size; "needs root": the Slurm and netns tests (CI is root).
ALLOWED_SKIPS = ("needs CUDA", "needs world size", "Test requires", "needs root")


def under_ci() -> bool:
    """Whether this is a CI run (CI=true), which must have every engine and tool."""
    return os.environ.get("CI") == "true"


def require_tool(name: str, found: str | None, install: str) -> str:
    """``found``, the path of tool ``name``. Where it is None the test cannot run: outside CI it
    is skipped, and under CI=true it fails (every test that needs a tool asks here).

    Args:
        name: the tool, e.g. ``"mpirun"``.
        found: its path, or None where it is missing.
        install: how to get it, e.g. ``"pip install mpich"``.
    """
    if found is not None:
        return found
    reason = f"{name} is not installed ({install})"
    if under_ci():
        pytest.fail(f"{reason}, but CI=true must have every tool", pytrace=False)
    pytest.skip(reason)


def _fail_a_skip_under_ci(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Under CI=true, make a skip whose reason is not in ALLOWED_SKIPS a failure."""
    if not under_ci() or not report.skipped:
        return
    reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if reason.startswith("Skipped: "):
        reason = reason[len("Skipped: ") :]
    if not reason.startswith(ALLOWED_SKIPS):
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which must run everything: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    _fail_a_skip_under_ci(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):  # type: ignore[no-untyped-def]
    """A module skipped as a whole (``pytest.importorskip`` at its top) follows the rule too."""
    outcome = yield
    _fail_a_skip_under_ci(outcome.get_result())


# -- tests that repeat a whole job to estimate a failure rate: 3 times, more under --stress ----
#: How many times such a test repeats its job in a normal run (CI included).
REPEATS = 3


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--stress",
        action="store_true",
        help="tests marked stress repeat their job as often as they ask (scripts/stress.sh); "
        f"without it, {REPEATS} times",
    )


@pytest.fixture
def repetitions(request: pytest.FixtureRequest) -> Callable[[int], int]:
    """``repetitions(n)``: how many times a test repeats a whole job to estimate a failure
    rate: ``n`` under ``--stress`` (``bash scripts/stress.sh``), else :data:`REPEATS`. Such a
    test is marked ``stress``, so that the stress run finds it."""
    assert request.node.get_closest_marker("stress") is not None, "mark the test stress"

    def times(n: int) -> int:
        return n if request.config.getoption("stress") else min(n, REPEATS)

    return times


#: Launcher variables read by distcomm's launch detection (plus the ones ``init`` exports).
LAUNCHER_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
)
LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "MV2_", "MPI_LOCAL", "DISTCOMM_")


@pytest.fixture(autouse=True)
def plain_machine(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Remove every launcher and DISTCOMM_* variable, and finalize distcomm after the test.

    Tests marked ``mpi`` run inside a real MPI job (``mpirun ... pytest --with-mpi``), and the
    conformance kit's (``--pyargs distcomm.testing.conformance``) inside any launched job: their
    launcher variables are the point, and their world lives across tests, so they are left alone.
    """
    kit = "distcomm_check" in request.fixturenames
    if kit or request.node.get_closest_marker("mpi") is not None:
        yield
        return
    for name in list(os.environ):
        if name in LAUNCHER_VARIABLES or name.startswith(LAUNCHER_PREFIXES):
            monkeypatch.delenv(name)
    try:
        yield
    finally:
        distcomm.finalize()


@pytest.fixture
def core_registry() -> Iterator[PluginRegistry]:
    """Make the process's registry hold the core's plugins only, whatever else is installed."""
    registry = PluginRegistry.load(entry_points=[], environ={})
    previous = set_registry(registry)
    try:
        yield registry
    finally:
        set_registry(previous)


@pytest.fixture
def mpirun() -> str:
    """The path of ``mpirun`` (the venv's MPICH first); see :func:`require_tool` where there is
    none. A test that needs it for one parameter only asks ``request.getfixturevalue("mpirun")``."""
    return _mpirun()


#: What an MPICH job ended by MPI_Abort leaves behind: its shared-memory segment, and the
#: topology file of its launcher (hydra).
MPICH_LEFTOVERS = ("/dev/shm/mpich_shm_*", "/tmp/hydra_hwloc_xmlfile_*")


def mpich_leftovers() -> set[Path]:
    """The files of :data:`MPICH_LEFTOVERS` there are now that no running process uses (a live
    job's, beside this test on another pytest-xdist worker, is not a leftover)."""
    found = {str(path) for pattern in MPICH_LEFTOVERS for path in Path("/").glob(pattern[1:])}
    return {Path(path) for path in found - in_use(found)}


@pytest.fixture
def aborted_mpich_job() -> Iterator[None]:
    """For tests that end an MPI job with MPI_Abort on purpose: the ranks die before MPICH
    unlinks its shared-memory segment, and its launcher leaves a topology file in /tmp; remove
    those the test created."""
    before = mpich_leftovers()
    try:
        yield
    finally:
        for leftover in mpich_leftovers() - before:
            leftover.unlink(missing_ok=True)


#: Worlds of the ``warm_world`` fixture kept running at once (each rank holds torch: ~300 MB).
WARM_WORLDS_RUNNING = 4


@pytest.fixture(scope="session")
def warm_world() -> Iterator[Callable[..., WarmWorld]]:
    """``get(nprocs, backend="gloo", launcher="spawn", launcher_args=())``: the session's
    :class:`~distcomm.testing.WarmWorld` of that shape, started at its first call and reused by
    every test that asks for the same shape (docs/testing.md#warm-worlds). At most
    :data:`WARM_WORLDS_RUNNING` run at once: the least recently used one is stopped (it starts
    again when asked for). All are closed at the end of the session."""
    worlds: dict[tuple[Any, ...], WarmWorld] = {}

    def get(
        nprocs: int,
        backend: str | None = "gloo",
        launcher: str = "spawn",
        launcher_args: tuple[str, ...] = (),
    ) -> WarmWorld:
        key = (nprocs, backend, launcher, tuple(launcher_args))
        world = worlds.pop(key, None) or WarmWorld(
            nprocs, backend=backend, launcher=launcher, launcher_args=launcher_args
        )
        worlds[key] = world  # the most recently used last
        running = [w for w in worlds.values() if w.pids]
        for old in running[: max(0, len(running) - WARM_WORLDS_RUNNING + 1)]:
            if old is not world:
                worlds.pop(next(k for k, w in worlds.items() if w is old)).close()
        return world

    try:
        yield get
    finally:
        for world in worlds.values():
            world.close()


@pytest.fixture(scope="session")
def scenario_worlds(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[[str], dict[str, list[Any]]]:
    """``get(backend)``: every registered scenario's per-rank results on ``backend`` ("threads",
    "gloo" or "mpirun"), from one 4-rank world per backend, run at the first request.

    The results also hold ``"leftover"``: distcomm files in /dev/shm that the run left behind.
    """
    import multirank

    cache: dict[str, Any] = {}

    def get(backend: str) -> dict[str, list[Any]]:
        if backend not in cache:
            workdir = str(tmp_path_factory.mktemp(f"scenarios-{backend}"))
            before, mpich = multirank.shm_files(), mpich_leftovers()
            names = list(multirank.SCENARIOS)
            try:
                if backend == "threads":
                    results = multirank.on_threads(names, workdir)
                elif backend == "gloo":
                    results = multirank.on_gloo(names, workdir)
                else:
                    results = multirank.on_mpi(names, workdir, _mpirun(), job_environment())
                results["leftover"] = sorted(multirank.shm_files() - before)
                cache[backend] = results
            except BaseException as exc:
                cache[backend] = exc
            finally:
                for leftover in mpich_leftovers() - mpich:
                    leftover.unlink(missing_ok=True)  # left by a failed MPI job
        found = cache[backend]
        if isinstance(found, BaseException):
            raise found
        return found  # type: ignore[no-any-return]

    return get


def _mpirun() -> str:
    return require_tool("mpirun", find_mpirun(), "pip install mpich")
