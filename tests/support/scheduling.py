"""Which test runs where and when (a pytest plugin of the repository's ``conftest.py``).

- **The docs blocks run last**, in their order (tests/test_docs_run.py), so that a block that
  names the tests running exactly what it runs (``same-as``) finds their outcome:
  ``outcomes_of(target)``. Outcomes are kept in this process and, under pytest-xdist, also in a
  folder every worker shares (``TESTS_SHARED_DIR``, made by the controlling process), so that a
  block reads the outcome of a test another worker ran.
- **Worker groups** (pytest-xdist, ``--dist loadgroup``; scripts/test.sh runs the suite with
  ``-n 2``): tests that must not run beside each other run one after another on one worker
  (:func:`worker_group`); every other test runs wherever a worker is free. Each worker writes
  the groups it collected to the shared folder, and the controller's scheduler
  (:class:`GroupScheduling`) reads them there: pytest-xdist 3.8's own ``loadgroup`` marks a
  grouped test by renaming its node id, which pytest 9 no longer allows, so it would spread a
  group over both workers.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

#: The docs check's blocks, which run last.
DOCS_BLOCKS = "tests/test_docs_run.py::test_a_block_runs_as_the_doc_shows"
#: The folder every worker shares (set for the workers by the controller): the outcomes, and
#: the groups each worker collected (``groups-WORKER.json``).
SHARED_DIR = "TESTS_SHARED_DIR"
#: What a test reads or leaves that every test shares, in its function's source: files in
#: /dev/shm (the leftover checks, MPICH's segment of a job it aborts on purpose, distcomm's
#: workspace files).
SHARED_STATE = re.compile(
    r"dev_shm_names|shm_files|shm_entries|mpich_leftovers|aborted_mpich_job|/dev/shm|workspace"
)
#: Fixtures that read or leave what every test shares.
SHARED_FIXTURES = {"aborted_mpich_job", "scenario_worlds"}

#: The worst outcome of each test this process ran, by node id.
_outcomes: dict[str, str] = {}


# -- outcomes ---------------------------------------------------------------------------------
def pytest_configure(config: pytest.Config) -> None:
    """In pytest-xdist's controlling process: the folder the workers share (they inherit the
    variable when they start, after this)."""
    if _xdist_controller(config):
        os.environ[SHARED_DIR] = tempfile.mkdtemp(prefix="distcomm-tests-")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _xdist_controller(config) and SHARED_DIR in os.environ:
        shutil.rmtree(os.environ.pop(SHARED_DIR), ignore_errors=True)


def _xdist_controller(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    before = _outcomes.get(report.nodeid)
    if report.failed or before == "failed":
        outcome = "failed"
    elif report.skipped:
        outcome = "skipped"
    elif report.when == "call" and before is None:
        outcome = "passed"
    else:
        return
    _outcomes[report.nodeid] = outcome
    folder = os.environ.get(SHARED_DIR)
    if folder:
        with contextlib.suppress(OSError):
            Path(folder, _file_name(report.nodeid)).write_text(outcome)


def _file_name(nodeid: str) -> str:
    return hashlib.sha1(nodeid.encode()).hexdigest()


def _outcome(nodeid: str) -> str:
    """What this process or, under xdist, any worker knows of a test's outcome."""
    if nodeid in _outcomes:
        return _outcomes[nodeid]
    folder = os.environ.get(SHARED_DIR)
    if folder:
        with contextlib.suppress(OSError):
            return Path(folder, _file_name(nodeid)).read_text()
    return "not run"


@pytest.fixture
def outcomes_of(request: pytest.FixtureRequest) -> Callable[[str], dict[str, str] | None]:
    """``outcomes_of(target)``: ``{node id: outcome}`` of this session's tests under ``target``
    (a folder, a file, or ``file::test``, parametrized or not); None when the session collected
    none of them (run alone, or deselected). A test collected but not run yet (it may be running
    on another worker) is ``"not run"``."""

    def outcomes(target: str) -> dict[str, str] | None:
        prefix = target.rstrip("/")
        found = {
            item.nodeid: _outcome(item.nodeid)
            for item in request.session.items
            if item.nodeid == prefix
            or item.nodeid.startswith((f"{prefix}[", f"{prefix}/", f"{prefix}::"))
        }
        return found or None

    return outcomes


def wait_for_outcomes(
    outcomes: Callable[[], dict[str, str] | None], seconds: float
) -> dict[str, str] | None:
    """``outcomes()`` once none is ``"not run"`` any more, or as it is after ``seconds``."""
    deadline = time.monotonic() + seconds
    found = outcomes()
    while found and "not run" in found.values() and time.monotonic() < deadline:
        time.sleep(1.0)
        found = outcomes()
    return found


# -- order and groups -------------------------------------------------------------------------
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The docs blocks last. In a pytest-xdist worker, also the groups (:func:`worker_group`)
    first, so that the long ones start early, and each test's group written to the shared
    folder for the controller's scheduler."""
    worker = getattr(config, "workerinput", {}).get("workerid")
    folder = os.environ.get(SHARED_DIR)
    if not (worker and folder):
        items.sort(key=lambda item: item.nodeid.startswith(DOCS_BLOCKS))
        return
    groups = {item.nodeid: group for item in items if (group := worker_group(item))}
    items.sort(key=lambda item: (item.nodeid.startswith(DOCS_BLOCKS), item.nodeid not in groups))
    written = Path(folder, f"groups-{worker}.json.part")
    written.write_text(json.dumps(groups))
    written.replace(written.with_suffix(""))  # whole, or not there


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``: :class:`GroupScheduling`, in the order of the collection."""
    if config.getvalue("dist") != "loadgroup" or not os.environ.get(SHARED_DIR):
        return None
    config.option.loadscopereorder = False  # not the biggest group first: the docs run last
    return GroupScheduling(config, log)


class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
    """pytest-xdist's scope scheduling whose scope is the test's group, as the workers wrote
    them (:func:`pytest_collection_modifyitems`), or the test alone: a group runs on one
    worker, in order; the other tests wherever a worker is free."""

    groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self.groups is None:
            # every worker has written its groups before it reports its collection
            self.groups = {}
            for written in Path(os.environ[SHARED_DIR]).glob("groups-*.json"):
                self.groups.update(json.loads(written.read_text()))
        group = self.groups.get(nodeid)
        return f"@{group}" if group else nodeid


def worker_group(item: pytest.Item) -> str | None:
    """The pytest-xdist group of a test (its tests run one after another on one worker), or
    None for a test any worker may run beside any other.

    - ``shared-state``: tests that check or leave what every test shares (:data:`SHARED_STATE`
      in the test function's source, a fixture of :data:`SHARED_FIXTURES`), and those of
      ``tests/errors`` (its conftest checks /dev/shm after each test);
    - ``warm-worlds``: the users of the ``warm_world`` fixture, so that the session's warm
      worlds start on one worker only;
    - ``docs-PAGE``: the docs blocks of a page, in order: they share the page's TMPDIR;
    - ``launchers``: the tests of ``tests/launchers``: one private Slurm cluster (a session
      fixture) on one worker.
    """
    if item.nodeid.startswith(DOCS_BLOCKS):
        # a page's blocks share its TMPDIR (a later block uses what an earlier one wrote)
        return f"docs-{item.nodeid.split('[', 1)[1].split(':', 1)[0]}"
    fixtures = set(getattr(item, "fixturenames", ()))
    if (
        item.nodeid.startswith("tests/errors/")
        or fixtures & SHARED_FIXTURES
        or SHARED_STATE.search(_source(item))
    ):
        return "shared-state"
    if "warm_world" in fixtures:
        return "warm-worlds"
    if item.nodeid.startswith("tests/launchers/"):
        return "launchers"
    return None


def _source(item: pytest.Item) -> str:
    """The source of a test's function, and of the module's fixtures it uses."""
    function = getattr(item, "function", None)
    if function is None:
        return ""
    parts = [function]
    module = getattr(item, "module", None)
    for name in getattr(item, "fixturenames", ()):
        fixture = getattr(module, name, None)
        if fixture is not None and callable(fixture):
            parts.append(getattr(fixture, "__wrapped__", fixture))
    texts = []
    for part in parts:
        with contextlib.suppress(OSError, TypeError):
            texts.append(inspect.getsource(part))
    return "\n".join(texts)
