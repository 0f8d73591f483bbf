"""The linklink backend against a stand-in linklink module (tests/standin/linklink).

linklink is SenseTime's proprietary library and cannot be installed here, so these tests mock it:
the stand-in implements linklink's API surface over torch.distributed's Gloo. Everything above
that module (the backend, distcomm's template, the conformance suite) is the real code.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jobs
import pytest

import distcomm
from distcomm.testing import WarmWorld
from distcomm.testing.conformance import CHECKS, run_all

STANDIN = str(Path(__file__).resolve().parent / "standin")


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The stand-in linklink importable here and in the ranks (they take this sys.path)."""
    monkeypatch.syspath_prepend(STANDIN)
    for name in ("linklink", "spring", "spring.linklink"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield
    sys.modules.pop("linklink", None)


def test_unavailable_without_linklink_names_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    from distcomm_linklink.plugin import is_available

    for name in ("linklink", "spring", "spring.linklink"):
        monkeypatch.delitem(sys.modules, name, raising=False)

    launch = distcomm.detect_environment()
    ok, why = is_available(launch)
    assert not ok and "neither `linklink` nor `spring.linklink` can be imported" in why
    with pytest.raises(distcomm.BackendUnavailableError, match="HINT"):
        distcomm.init(backend="linklink")


def test_never_runs_on_the_compat_shim(monkeypatch: pytest.MonkeyPatch) -> None:
    from distcomm_linklink.plugin import is_available

    from distcomm.compat import linklink

    monkeypatch.setitem(sys.modules, "linklink", linklink)
    ok, why = is_available(distcomm.detect_environment())
    assert not ok and "is distcomm.compat.linklink" in why


@pytest.mark.usefixtures("standin")
def test_available_with_linklink_and_never_automatic() -> None:
    from distcomm_linklink.plugin import is_available

    assert is_available(distcomm.detect_environment()) == (True, "`import linklink` works")
    report = distcomm.init()
    try:
        assert report.backend == "fakelink"  # priority 0: only when asked for
    finally:
        distcomm.finalize()


def conformance() -> dict[str, Any]:
    import linklink  # the stand-in

    comm = distcomm.get_communicator()
    return {"backend": comm.backend, "checks": run_all(), "calls": dict(linklink.calls)}


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("standin")
def test_the_engine_moves_the_data_of_the_conformance_suite(
    warm_world: Callable[..., WarmWorld],
) -> None:
    for seen in warm_world(3, "linklink").run(conformance, timeout=240):
        assert seen["backend"] == "linklink"
        assert seen["checks"] == list(CHECKS)
        assert seen["calls"]["allreduce"] > 0 and seen["calls"]["allgather"] > 0
        assert seen["calls"]["broadcast"] > 0 and seen["calls"]["new_group"] > 0


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nprocs", [1, 2, 4])
def test_the_stand_in_passes_the_conformance_kit(nprocs: int) -> None:
    """The kit a plugin author runs, with the stand-in importable as ``linklink``."""
    kit = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs"]
    kit += ["distcomm.testing.conformance", "--distcomm-backend=linklink"]
    env = jobs.job_environment()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [STANDIN, env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "distcomm", "run", "-n", str(nprocs), *kit],
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    passed = re.findall(rf"\[rank (\d+)\] {len(CHECKS)} passed in ", done.stdout)
    assert sorted(map(int, passed)) == list(range(nprocs)), done.stdout[-4000:]


def p2p_and_options() -> list[str]:
    import numpy as np

    from distcomm.errors import NotSupportedError

    seen = []
    try:
        distcomm.send(np.ones(1), (distcomm.get_rank() + 1) % 2)
    except NotSupportedError as exc:
        seen.append(str(exc))
    from distcomm_linklink.communicator import create

    try:
        create(distcomm.get_communicator().launch, fast=True)
    except distcomm.InvalidArgumentError as exc:
        seen.append(str(exc))
    return seen


@pytest.mark.timeout(200)
@pytest.mark.usefixtures("standin")
def test_send_is_refused_with_the_fix(warm_world: Callable[..., WarmWorld]) -> None:
    for refusal, options in warm_world(2, "linklink").run(p2p_and_options):
        assert "has no point-to-point messages" in refusal and "HINT" in refusal
        assert "takes no options" in options
