"""The conformance suite on fakelink thread-ranks, at world sizes 1 to 4.

Two variants of the backend run it: fakelink as it is ("native": every operation, dtype and op is
the engine's own), and fakelink's engine reduced to the methods every engine must define, with
few native dtypes, no native AVG and no any-source receive ("minimal"), so that the kit's
defaults of the optional operations, dtype bridges and emulations pass the same suite.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kit_engines import Minimal

from distcomm.backend.specs import Capabilities
from distcomm.fakelink import communicator as fakelink
from distcomm.testing import run_threads
from distcomm.testing.conformance import CHECKS, run_all, run_check

WORLD_SIZES = (1, 2, 3, 4)
MINIMAL_CAPABILITIES = Capabilities(
    dtypes=frozenset({"uint8", "int32", "int64", "float32", "float64"}),
    reduce_ops=frozenset({"SUM", "MIN", "MAX"}),  # PRODUCT and bitwise ops: by gathering
    any_source=False,
)


@pytest.fixture(params=["native", "minimal"])
def variant(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """fakelink as it is, or its engine reduced to the required methods (``Minimal``: the kit's
    defaults of the optional operations run) with few capabilities. ``run_threads``' worlds
    read fakelink's engine class and capabilities when they are made."""
    if request.param == "minimal":
        monkeypatch.setattr(fakelink, "FakeLinkEngine", Minimal)
        monkeypatch.setattr(fakelink, "CAPABILITIES", MINIMAL_CAPABILITIES)
    yield request.param


@pytest.mark.parametrize("name", list(CHECKS))
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_check(variant: str, world_size: int, name: str) -> None:
    run_threads(run_check, world_size, name, timeout=60)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_run_all_runs_every_check_in_one_world(variant: str, world_size: int) -> None:
    results = run_threads(run_all, world_size, timeout=120)
    assert results == [list(CHECKS)] * world_size
