"""The conformance suite as pytest tests: one test per check, for any backend, under any launcher.

Collected by ``python -m pytest --pyargs distcomm.testing.conformance --distcomm-backend=NAME``
(never by the project's own test run, whose ``testpaths`` do not include this package). Run it in
every rank of a job (``distcomm run -n 4 -m pytest ...``, ``mpirun -n 4 python -m pytest ...``,
``srun``), or in one process with ``--distcomm-threads=N`` on fakelink. The options, the
fail-fast abort and the summary live in distcomm's pytest plugin
(:mod:`distcomm.testing.pytest_plugin`); the pytest-free parts in
:mod:`distcomm.testing.conformance.kit`. docs/testing.md shows a run.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from distcomm.testing.conformance import CHECKS
from distcomm.testing.conformance.kit import KitOptions, run
from distcomm.testing.pytest_plugin import CHECK_ARGUMENT, KIT

#: Why the tests are skipped when the kit is not asked for.
INACTIVE = (
    "the distcomm conformance kit runs only with --distcomm-backend=NAME, e.g. "
    "`distcomm run -n 2 -m pytest --pyargs distcomm.testing.conformance --distcomm-backend=gloo`"
    " or `python -m pytest --pyargs distcomm.testing.conformance --distcomm-backend=fakelink "
    "--distcomm-threads=4`"
)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One test per selected check (every check when the kit is inactive), ids = check names."""
    if CHECK_ARGUMENT in metafunc.fixturenames:
        kit = metafunc.config.stash.get(KIT, None)
        names = list(kit.options.checks) if kit is not None else list(CHECKS)
        metafunc.parametrize(CHECK_ARGUMENT, names, ids=names)


@pytest.fixture(scope="session")
def conformance_world(request: pytest.FixtureRequest) -> Iterator[KitOptions]:
    """This process's world for the whole session: ``distcomm.init`` once (or thread-ranks),
    ``distcomm.finalize()`` at the end. Skips every test when the kit is not asked for."""
    kit = request.config.stash.get(KIT, None)
    if kit is None:
        pytest.skip(INACTIVE)
    kit.start()
    try:
        yield kit.options
    finally:
        kit.stop()


def test_check(conformance_world: KitOptions, distcomm_check: str) -> None:
    """Run one conformance check on every rank of the world."""
    __tracebackhide__ = True
    run(conformance_world, distcomm_check)
