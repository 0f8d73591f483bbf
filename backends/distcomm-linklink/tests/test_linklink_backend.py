"""The linklink backend against a stand-in linklink module (tests/standin/linklink).

linklink is SenseTime's proprietary library and cannot be installed here, so these tests mock it:
the stand-in implements linklink's API surface over torch.distributed's Gloo. Everything above
that module (the backend, distcomm's template, the conformance suite) is the real code.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import distcomm
from distcomm.testing import spawn
from distcomm.testing.conformance import CHECKS, run_all

STANDIN = str(Path(__file__).resolve().parent / "standin")


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The stand-in linklink importable here and in spawned ranks (they inherit sys.path)."""
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
@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_conformance_on_the_stand_in(nprocs: int) -> None:
    results = spawn(conformance, nprocs, backend="linklink", timeout=240)
    for seen in results:
        assert seen["backend"] == "linklink"
        assert seen["checks"] == list(CHECKS)
        if nprocs > 1:  # the engine really moved the data
            assert seen["calls"]["allreduce"] > 0 and seen["calls"]["allgather"] > 0
            assert seen["calls"]["broadcast"] > 0 and seen["calls"]["new_group"] > 0


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
def test_send_is_refused_with_the_fix() -> None:
    for refusal, options in spawn(p2p_and_options, 2, backend="linklink"):
        assert "has no point-to-point messages" in refusal and "HINT" in refusal
        assert "takes no options" in options
