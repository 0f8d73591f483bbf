"""The engine contract as a plugin meets it (kit API 2, :mod:`distcomm.backend.engine`).

The kit holds the engine, never inherits from it, so an engine's names are its own: one that
keeps state and helpers under the kit's names (``_rank``, ``_call``, ``_history``, ``describe``,
``all_reduce_steps``...) passes the whole conformance kit and leaves the kit's state alone (this
replaces the reserved-name list of kit API 1, which refused such names when the class was made).
What the contract does refuse: an engine without one of the required methods, when its
communicator is made, naming each one missing; and a backend written for another kit API, when
its spec is made, naming both versions.
"""

from __future__ import annotations

from typing import Any

import pytest
from kit_engines import Idle, over

import distcomm
from distcomm.backend import KIT_API, BackendSpec, BaseCommunicator
from distcomm.backend.engine import REQUIRED
from distcomm.errors import NotSupportedError
from distcomm.fakelink import FakeLinkEngine, create, is_available
from distcomm.fakelink import communicator as fakelink
from distcomm.testing import run_threads
from distcomm.testing.conformance import CHECKS, run_all

#: Helpers an engine author reaches for, under names of the kit's communicator (its pipeline's
#: steps, its public methods that are not the engine's).
HELPERS = (
    "_call",
    "_start",
    "_finish",
    "_stage",
    "_count",
    "_begin",
    "_check_rank",
    "_use",
    "_all_reduce_steps",
    "all_reduce_steps",
    "describe",
    "timed_out",
    "group_over",
)
#: State an engine author keeps, under names of the kit's communicator's state.
STATE = (
    "_rank",
    "_world_size",
    "_launch",
    "_global_ranks",
    "_pending",
    "_mismatch_check",
    "_debug",
    "_plans",
    "_kinds",
    "_event",
    "_recorder",
    "_control",
    "seq",
    "op",
    "name",
    "timeout",
    "unusable",
    "blocked_seq",
    "blocked_op",
    "backend_name",
    "capabilities",
    "engine",
)


def _helper(name: str) -> Any:
    def helper(self: Any, *args: Any, **kwargs: Any) -> str:
        return f"the engine's own {name}"

    return helper


class Squatter(FakeLinkEngine):
    """fakelink's engine, with helpers and state of its own under the kit's names."""

    locals().update({name: _helper(name) for name in HELPERS})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in STATE:
            setattr(self, name, f"the engine's own {name}")


def _own_names_kept(comm: BaseCommunicator) -> list[str]:
    """The names of ``comm``'s engine that no longer hold the engine's own, and those of the
    communicator that hold the engine's: none, where the kit kept to its own."""
    engine = comm.engine
    lost = [n for n in STATE if getattr(engine, n) != f"the engine's own {n}"]
    lost += [n for n in HELPERS if getattr(engine, n)() != f"the engine's own {n}"]
    taken = [n for n in STATE if getattr(comm, n, None) == f"the engine's own {n}"]
    taken += [
        n for n in HELPERS if getattr(getattr(comm, n, None), "__func__", None) is vars(Squatter)[n]
    ]
    return lost + taken


def test_an_engine_using_the_kits_names_passes_the_conformance_kit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Thread-ranks make their worlds over fakelink's engine class (read when each is made), and
    # fakelink's split makes each group's engine of its engine's class: all are Squatters.
    monkeypatch.setattr(fakelink, "FakeLinkEngine", Squatter)

    def body() -> tuple[str, list[str], list[str], tuple[Any, ...]]:
        comm = distcomm.get_communicator()
        assert isinstance(comm, BaseCommunicator)
        ran = run_all()
        group = distcomm.new_group(range(comm.world_size))
        assert isinstance(group, BaseCommunicator)
        kit = (comm.rank, comm.describe(), comm.seq > 0, comm.unusable)
        return type(comm.engine).__name__, ran, _own_names_kept(comm) + _own_names_kept(group), kit

    results = run_threads(body, 4, timeout=240)
    assert {kind for kind, _, _, _ in results} == {"Squatter"}
    assert all(list(ran) == list(CHECKS) for _, ran, _, _ in results), results[0][1]
    assert [clashes for _, _, clashes, _ in results] == [[]] * 4, "the kit used the engine's names"
    assert [kit for _, _, _, kit in results] == [
        (rank, "fakelink 'world' (4 ranks)", True, None) for rank in range(4)
    ]


@pytest.mark.parametrize(
    "missing",
    [("all_reduce",), ("isend", "irecv"), ("split",), REQUIRED],
    ids=["one", "two", "split", "all"],
)
def test_an_engine_lacking_a_required_method_is_refused_naming_each(
    missing: tuple[str, ...],
) -> None:
    partial = type("Partial", (), {n: Idle._never for n in REQUIRED if n not in missing})
    with pytest.raises(TypeError) as refused:
        over(partial(), backend="partial")
    text = str(refused.value)
    assert text.startswith(
        f"backend 'partial': its engine (Partial) lacks the required method(s) "
        f"{', '.join(missing)} of distcomm's engine contract."
    ), text
    assert "HINT: see distcomm.backend.engine (docs/plugins.md" in text, text


def test_a_required_name_that_is_not_a_method_counts_as_missing() -> None:
    """An attribute of a required method's name that cannot be called (None) is no method."""

    class Disabled(Idle):
        broadcast = None

    with pytest.raises(TypeError, match=r"lacks the required method\(s\) broadcast of"):
        over(Disabled(), backend="disabled")


@pytest.mark.parametrize("declared", [1, 0, None])
def test_a_spec_of_another_kit_api_is_refused_naming_both_versions(declared: Any) -> None:
    assert KIT_API == 2, "this distcomm runs kit API 2: 1 is the API of BaseCommunicator subclasses"
    with pytest.raises(NotSupportedError) as refused:
        BackendSpec("old", create, is_available, kit_api=declared)
    text = str(refused.value)
    written = (
        "declares no kit API version"
        if declared is None
        else f"was written for distcomm's kit API {declared}"
    )
    assert text.startswith(
        f"backend 'old' {written}, and this distcomm runs backends of kit API 2 only."
    ), text
    assert "HINT: install a release of the plugin written for kit API 2" in text, text
    if declared is not None:
        assert f"or a distcomm release that runs kit API {declared}" in text, text
