"""Tests of distcomm._runtime.request: resolving init's timeout (its device: test_lifecycle.py)."""

from __future__ import annotations

import datetime

import pytest

from distcomm._runtime.request import DEFAULT_TIMEOUT, resolve_timeout
from distcomm.errors import InvalidArgumentError


@pytest.mark.parametrize(
    ("given", "seconds"),
    [(5, 5.0), (2.5, 2.5), ("30", 30.0), (datetime.timedelta(minutes=2), 120.0)],
)
def test_resolve_timeout_accepts_seconds_and_timedeltas(given: object, seconds: float) -> None:
    assert resolve_timeout(given) == seconds  # type: ignore[arg-type]


def test_resolve_timeout_default_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_timeout(None) == DEFAULT_TIMEOUT == 1800.0
    monkeypatch.setenv("DISTCOMM_TIMEOUT", "12.5")
    assert resolve_timeout(None) == 12.5
    assert resolve_timeout(3) == 3.0  # an argument wins over the environment


@pytest.mark.parametrize("bad", ["abc", 0, -1, float("inf"), float("nan"), datetime.timedelta(0)])
def test_resolve_timeout_rejects_bad_values(bad: object) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        resolve_timeout(bad)  # type: ignore[arg-type]
    assert f"timeout={bad!r}" in str(info.value)
    assert "HINT" in str(info.value)


def test_a_master_address_given_to_init_is_not_the_launchers_store() -> None:
    """Under torchrun its agent serves the store at MASTER_ADDR:MASTER_PORT; init(master_port=...)
    moves the rendezvous elsewhere, where rank 0 must serve it again."""
    from distcomm._runtime.request import InitRequest, apply_overrides
    from distcomm.environment import LaunchInfo

    launch = LaunchInfo("env", 0, 2, 0, 2, 0, 1, "127.0.0.1", 29500, agent_store=True)
    assert apply_overrides(launch, InitRequest.parse()).agent_store
    moved = apply_overrides(launch, InitRequest.parse(master_port=29600))
    assert (moved.master_port, moved.agent_store) == (29600, False)
    assert moved.sources["agent_store"] == "argument"
