"""Tests of distcomm._runtime.torch_group: the choice (``init(torch_group=...)``,
``DISTCOMM_TORCH_GROUP``) and when no group is made, in one process. The group made beside mpi
in a real MPI job: the mpi suite (test_mpi_torch_group.py); torch-native libraries on it under
every launcher: tests/test_interop.py."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from distcomm._runtime import torch_group
from distcomm.backend import Registry
from distcomm.environment import LaunchInfo
from distcomm.errors import BackendUnavailableError, InvalidArgumentError

LAUNCH = LaunchInfo("mpi", 0, 2, 0, 2, 0, 1)


class World:
    """What ``make`` asks of the communicator ``init`` made: a 2-rank world of a non-torch
    backend, which must not be asked anything when no group is made."""

    backend, rank = "standin", 0

    def __init__(self, size: int = 2) -> None:
        self.world_size = size

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        raise AssertionError("a rendezvous was started although no group is made")


@pytest.mark.parametrize(
    ("given", "environ", "choice"),
    [
        (None, {}, "auto"),
        (None, {"DISTCOMM_TORCH_GROUP": " Off "}, False),
        (None, {"DISTCOMM_TORCH_GROUP": "1"}, True),
        (None, {"DISTCOMM_TORCH_GROUP": "auto"}, "auto"),
        (True, {"DISTCOMM_TORCH_GROUP": "0"}, True),  # the argument wins
        (False, {}, False),
        ("auto", {}, "auto"),
        ("distcomm", {}, "distcomm"),
        (None, {"DISTCOMM_TORCH_GROUP": " DistComm "}, "distcomm"),
    ],
)
def test_the_choice(given: Any, environ: dict[str, str], choice: Any) -> None:
    assert torch_group.policy(given, environ) == choice


@pytest.mark.parametrize("given", ["always", 1, 0, "AUTO", None])
def test_a_bad_choice_names_the_valid_ones(given: Any) -> None:
    environ = {"DISTCOMM_TORCH_GROUP": "sometimes"} if given is None else {}
    with pytest.raises(InvalidArgumentError) as info:
        torch_group.policy(given, environ)
    text = str(info.value)
    assert ("sometimes" if given is None else repr(given)) in text and "HINT" in text
    assert "auto" in text and ("True, False" in text or "1, 0" in text) and "distcomm" in text


def test_no_group_when_off_alone_or_torch_not_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = Registry()
    assert torch_group.make(False, World(), LAUNCH, registry, 60, None) == (
        None,
        None,
        "torch group: off",
    )
    made, group, why = torch_group.make(True, World(size=1), LAUNCH, registry, 60, None)
    assert made is None and group is None and "a world of 1" in why
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    made, group, why = torch_group.make("auto", World(), LAUNCH, registry, 60, None)
    assert made is None and group is None and "had not imported torch" in why
    assert "torch" not in sys.modules, "auto imported torch for a program that had not"


def test_asked_for_without_the_torch_plugin_says_what_to_install() -> None:
    with pytest.raises(BackendUnavailableError, match=r"pip install \./backends/distcomm-torch"):
        torch_group.make(True, World(), LAUNCH, Registry(), 60, None)
    made, group, why = torch_group.make("auto", World(), LAUNCH, Registry(), 60, None)
    assert (made, group) == (None, None)
    assert why == "torch group: none (distcomm-torch is not installed)"


def test_over_distcomm_without_the_torch_plugin_says_what_to_install() -> None:
    """``"distcomm"`` needs the torch plugin's adapter; without it nothing is asked of the
    communicator (no rendezvous)."""
    with pytest.raises(BackendUnavailableError) as info:
        torch_group.make("distcomm", World(), LAUNCH, Registry(), 60, None)
    text = str(info.value)
    assert "torch_group='distcomm'" in text and "pip install ./backends/distcomm-torch" in text
