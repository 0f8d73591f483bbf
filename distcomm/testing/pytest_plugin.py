"""distcomm's pytest plugin (entry point ``pytest11``): failing ranks end their job at once, and
the options of the conformance kit.

Under ``mpirun -n N python -m pytest --with-mpi`` every rank runs every test. When one rank
fails a multi-rank test (marked ``mpi``, as pytest-mpi does) while the others wait in a
collective, a plain run deadlocks until the job's time limit. This plugin prints the failing
rank's report to stderr, prefixed with its rank, and calls ``MPI_Abort``, so the job ends within
seconds with the report that explains it.

The conformance kit (``python -m pytest --pyargs distcomm.testing.conformance
--distcomm-backend=NAME``) takes its options from here: ``--distcomm-backend`` turns it on and
registers :class:`ConformanceKit`, whose hooks add a timeout to each check, end the whole job
(:func:`distcomm.backend.abort_job`) when a check fails on a rank of a multi-rank world, and
print rank 0's summary. Without ``--distcomm-backend`` nothing of the kit is registered.

The plugin is inert otherwise, and imports mpi4py only to abort.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import pytest

from distcomm.environment.mpi import detect

if TYPE_CHECKING:
    from distcomm.testing.conformance.kit import KitOptions, World

__all__ = [
    "CHECK_ARGUMENT",
    "KIT",
    "ConformanceKit",
    "pytest_addoption",
    "pytest_configure",
    "pytest_runtest_logreport",
]

#: The argument of the kit's test that holds the check's name.
CHECK_ARGUMENT = "distcomm_check"
#: Seconds a test may run past the kit's timeout before pytest-timeout ends the process: the
#: operations' own timeout (the kit's) fires first, with a better report.
_TIMEOUT_MARGIN = 30.0
_KIT_OPTIONS = ("distcomm_threads", "distcomm_checks", "distcomm_timeout")


def pytest_addoption(parser: pytest.Parser) -> None:
    """The conformance kit's options (known to every pytest run, used only by the kit)."""
    group = parser.getgroup(
        "distcomm", "distcomm conformance kit (pytest --pyargs distcomm.testing.conformance)"
    )
    group.addoption(
        "--distcomm-backend",
        metavar="NAME",
        help="run the conformance kit on backend NAME, one rank per process (start pytest "
        "under a launcher: distcomm run, mpirun, srun) or in thread-ranks (--distcomm-threads)",
    )
    group.addoption(
        "--distcomm-threads",
        type=int,
        metavar="N",
        help="threads mode: run each check in a world of N thread-ranks of this process "
        "(in-process backends only: fakelink)",
    )
    group.addoption(
        "--distcomm-checks",
        metavar="A,B",
        help="run only these conformance checks (comma-separated names; default: all)",
    )
    group.addoption(
        "--distcomm-timeout",
        type=float,
        metavar="SECONDS",
        help="limit of each check and of each operation in it (default: 120)",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Check the kit's options and register :class:`ConformanceKit` when the kit is asked for.

    Raises:
        pytest.UsageError: a kit option without ``--distcomm-backend``, or a bad value (the
            message names it, the valid choices and a fix).
    """
    from distcomm.backend import _uncaught

    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is not None:  # a rank that ends its MPI job mid-test: its message is shown
        _uncaught.before_writing(lambda: capture.suspend_global_capture(in_=False))
    backend = config.getoption("distcomm_backend", None)
    if backend is None:
        given = [name for name in _KIT_OPTIONS if config.getoption(name, None) is not None]
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise pytest.UsageError(
                f"{flag} is an option of the distcomm conformance kit, which needs "
                "--distcomm-backend=NAME. HINT: e.g. python -m pytest --pyargs "
                "distcomm.testing.conformance --distcomm-backend=fakelink --distcomm-threads=4"
            )
        return
    from distcomm.errors import DistcommError
    from distcomm.testing.conformance.kit import parse_options

    try:
        options = parse_options(
            backend,
            config.getoption("distcomm_threads"),
            config.getoption("distcomm_checks"),
            config.getoption("distcomm_timeout"),
        )
    except DistcommError as exc:
        raise pytest.UsageError(f"{type(exc).__name__}: {exc}") from None
    kit = ConformanceKit(options)
    config.stash[KIT] = kit
    config.pluginmanager.register(kit, "distcomm-conformance-kit")


class ConformanceKit:
    """The conformance kit's state and hooks for one pytest session (registered by
    :func:`pytest_configure` when ``--distcomm-backend`` is given).

    Attributes:
        options: what to run.
        world: the world the checks run in, once :meth:`start` made it.
        outcomes: ``"passed"``, ``"failed"`` or ``"skipped"`` per check that ran.
    """

    def __init__(self, options: KitOptions) -> None:
        self.options = options
        self.world: World | None = None
        self.outcomes: dict[str, str] = {}
        self._checks: dict[str, str] = {}  # test node id -> check name

    def start(self) -> None:
        """Make the world (the kit's session fixture calls this once).

        If that fails, a world of several processes fails the first test, whose report ends the
        whole job (as a failed check does); otherwise pytest stops with distcomm's error.
        """
        from distcomm.testing.conformance.kit import start

        try:
            self.world = start(self.options)
        except Exception as exc:
            if self._shared_world() is not None:
                raise
            text = f"distcomm.init(backend={self.options.backend!r}) failed: {exc!r}"
            pytest.exit(text, returncode=pytest.ExitCode.TESTS_FAILED)

    def stop(self) -> None:
        """Finalize distcomm in this process (nothing to do for thread-ranks)."""
        if self.options.threads is None:
            import distcomm

            distcomm.finalize()

    @pytest.hookimpl
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        """Note the kit's tests, and give each a timeout when pytest-timeout is installed."""
        timed = config.pluginmanager.hasplugin("timeout")
        limit = self.options.timeout + _TIMEOUT_MARGIN
        for item in items:
            callspec = getattr(item, "callspec", None)
            if callspec is None or CHECK_ARGUMENT not in callspec.params:
                continue
            self._checks[item.nodeid] = callspec.params[CHECK_ARGUMENT]
            if timed:
                item.add_marker(pytest.mark.timeout(limit, method="thread"))

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Count the outcome of a check; end the job when it failed in a multi-rank world."""
        name = self._checks.get(report.nodeid)
        if name is None:
            return
        if report.failed:
            self.outcomes[name] = "failed"
            self._end_job_if_shared(report.nodeid, report.when, report.longreprtext)
        elif report.skipped:
            self.outcomes.setdefault(name, "skipped")
        elif report.when == "call":
            self.outcomes.setdefault(name, "passed")

    def _end_job_if_shared(self, test: str, when: str, text: str) -> None:
        """In a world of several processes, print this rank's report and end the whole job:
        the other ranks would otherwise wait in the failed check's collectives."""
        shared = self._shared_world()
        if shared is not None:
            from distcomm.backend import abort_job
            from distcomm.testing.conformance.kit import failure_report

            abort_job(failure_report(*shared, test, when, text))

    def _shared_world(self) -> tuple[int, int] | None:
        """(rank, world size) when the world is several processes, else None."""
        if self.options.threads is not None:
            return None
        if self.world is not None:
            rank, world_size = self.world.rank, self.world.world_size
        else:  # before init: what the launcher says
            import distcomm

            rank, world_size = distcomm.get_rank(), distcomm.get_world_size()
        return (rank, world_size) if world_size > 1 else None

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        """On rank 0: the backend, world size, native capabilities and checks per topic."""
        if self.world is None or self.world.rank != 0 or not self.outcomes:
            return
        from distcomm.testing.conformance.kit import summary, title

        terminalreporter.write_sep("=", title(self.world))
        for line in summary(self.world, self.outcomes):
            terminalreporter.write_line(line)


#: Where the session's :class:`ConformanceKit` is kept (on ``config.stash``), if registered.
KIT = pytest.StashKey[ConformanceKit]()


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Abort the MPI job when this rank fails (or errors in) a test marked ``mpi``."""
    if not report.failed or "mpi" not in report.keywords:
        return
    launch = detect(os.environ)
    if launch is None or launch.world_size < 2:
        return
    prefix = f"[rank {launch.rank}] "
    lines = [
        f"distcomm: rank {launch.rank} of {launch.world_size} failed {report.nodeid} "
        f"({report.when}); aborting the MPI job so that the other ranks do not wait forever.",
        *report.longreprtext.splitlines(),
    ]
    sys.stderr.write("".join(f"{prefix}{line}\n" for line in lines))
    sys.stderr.flush()
    from mpi4py import MPI

    from distcomm.backend.aborts import abort_job, set_job_abort

    # an MPI job, whether or not this rank initialized distcomm's mpi backend; abort_job runs
    # the last words (the mpi backend removes MPICH's files there) and gives the launcher a
    # moment to forward the report, which it drops when it is in flight at MPI_Abort
    set_job_abort(lambda: MPI.COMM_WORLD.Abort(1))
    abort_job("")
