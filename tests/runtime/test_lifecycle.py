"""Tests of distcomm._runtime.lifecycle: init/finalize, backend and method choice at init, and the
timeout and device given at init. The rest of the runtime has a file per module here."""

from __future__ import annotations

import datetime
import os

import pytest

import distcomm
from distcomm._plugins.loader import PluginRegistry, get_registry
from distcomm._plugins.names import FIRST_PARTY_BACKENDS
from distcomm.errors import (
    AlreadyInitializedError,
    BackendNotFoundError,
    EnvironmentDetectionError,
    InvalidArgumentError,
    NotInitializedError,
)


@pytest.fixture
def only_core_backends(core_registry: PluginRegistry) -> None:
    """Use a registry of core plugins only, as if no backend distribution were installed."""
    assert set(get_registry().backends) == {"fakelink"}


# -- init / finalize ----------------------------------------------------------------------------
def test_init_on_a_plain_machine_runs_fakelink_world_of_one() -> None:
    assert not distcomm.is_initialized()
    assert distcomm.get_backend() is None
    comm = distcomm.init()
    assert distcomm.is_initialized()
    assert distcomm.get_backend() == "fakelink"
    assert comm.backend == "fakelink"
    assert (comm.rank, comm.world_size) == (0, 1)
    assert distcomm.get_communicator() is comm
    assert not distcomm.is_distributed()
    assert distcomm.is_main_process() and distcomm.is_local_main_process()


def test_init_twice_returns_the_running_communicator() -> None:
    first = distcomm.init()
    assert distcomm.init() is first
    assert distcomm.init(backend="fakelink") is first


def test_init_with_another_backend_while_running_names_both() -> None:
    distcomm.init()
    with pytest.raises(AlreadyInitializedError) as info:
        distcomm.init(backend="gloo")
    message = str(info.value)
    assert "'gloo'" in message and "'fakelink'" in message
    assert "HINT" in message and "finalize()" in message
    assert distcomm.get_backend() == "fakelink"


def test_finalize_then_init_again_gives_a_new_communicator() -> None:
    first = distcomm.init()
    distcomm.finalize()
    assert not distcomm.is_initialized()
    assert distcomm.get_backend() is None
    with pytest.raises(NotInitializedError):
        distcomm.get_communicator()
    second = distcomm.init()
    assert second is not first
    assert distcomm.get_communicator() is second


def test_finalize_when_not_initialised_is_a_no_op() -> None:
    before = dict(os.environ)
    distcomm.finalize()
    distcomm.finalize()
    assert not distcomm.is_initialized()
    assert dict(os.environ) == before


def test_get_communicator_before_init_says_what_to_call() -> None:
    with pytest.raises(NotInitializedError, match=r"distcomm\.init\(\)"):
        distcomm.get_communicator()


def test_backend_name_is_case_insensitive() -> None:
    comm = distcomm.init(backend="FakeLink")
    assert comm.backend == "fakelink"
    assert distcomm.get_backend() == "fakelink"


def test_rank_and_world_size_arguments_for_a_world_of_one() -> None:
    comm = distcomm.init(rank=0, world_size=1)
    assert (comm.rank, comm.world_size) == (0, 1)


def test_rank_without_world_size_on_one_node_is_refused() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        distcomm.init(rank=1)
    assert "world_size" in str(info.value) and "HINT" in str(info.value)
    assert not distcomm.is_initialized()


# -- backend and method resolution --------------------------------------------------------------
def test_unknown_backend_from_environment_lists_available_and_missing(
    monkeypatch: pytest.MonkeyPatch, only_core_backends: None
) -> None:
    monkeypatch.setenv("DISTCOMM_BACKEND", "nope")
    with pytest.raises(BackendNotFoundError) as info:
        distcomm.init()
    assert isinstance(info.value, LookupError)
    message = str(info.value)
    assert "'nope'" in message
    available = message.split("available:", 1)[1].split(".", 1)[0]
    assert "fakelink" in available
    for name, distribution in FIRST_PARTY_BACKENDS.items():
        assert name in message and distribution in message
    assert "Not installed" in message
    assert "HINT" in message
    assert not distcomm.is_initialized()


def test_misspelt_backend_gets_a_did_you_mean_and_the_distribution(
    monkeypatch: pytest.MonkeyPatch, only_core_backends: None
) -> None:
    monkeypatch.setenv("DISTCOMM_BACKEND", "ncl")
    with pytest.raises(BackendNotFoundError) as info:
        distcomm.init()
    message = str(info.value)
    assert "'ncl'" in message
    assert "did you mean 'nccl'" in message
    assert "distcomm-torch" in message
    assert "HINT" in message


def test_backend_argument_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTCOMM_BACKEND", "nope")
    assert distcomm.init(backend="fakelink").backend == "fakelink"


def test_method_not_matching_the_launch_is_an_environment_error() -> None:
    with pytest.raises(EnvironmentDetectionError) as info:
        distcomm.init(method="slurm")
    assert "'slurm'" in str(info.value) and "HINT" in str(info.value)
    assert not distcomm.is_initialized()


def test_unknown_method_from_environment_lists_the_methods(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTCOMM_INIT_METHOD", "nope")
    with pytest.raises(InvalidArgumentError) as info:
        distcomm.init()
    message = str(info.value)
    assert "'nope'" in message and "HINT" in message
    for method in ("env", "slurm", "mpi", "single_node"):
        assert method in message


def test_world_of_two_with_only_core_lists_why_no_backend(
    monkeypatch: pytest.MonkeyPatch, only_core_backends: None
) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(BackendNotFoundError) as info:
        distcomm.init()
    message = str(info.value)
    assert "world of 2" in message and "'env'" in message
    assert "fakelink: in-process only" in message
    for name, distribution in FIRST_PARTY_BACKENDS.items():
        assert f"{name}: not installed" in message
        assert distribution in message
    assert "HINT" in message
    assert not distcomm.is_initialized()
    assert "LOCAL_RANK" not in os.environ  # nothing exported by a failed init


# -- timeout at init ----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["abc", "0", "-1", "inf"])
def test_bad_timeout_in_the_environment_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    monkeypatch.setenv("DISTCOMM_TIMEOUT", bad)
    with pytest.raises(InvalidArgumentError) as info:
        distcomm.init()
    assert f"DISTCOMM_TIMEOUT={bad!r}" in str(info.value)
    assert "HINT" in str(info.value)


def test_init_timeout_reaches_the_communicator(monkeypatch: pytest.MonkeyPatch) -> None:
    comm = distcomm.init(timeout=7)
    assert comm.timeout == 7  # type: ignore[attr-defined]
    distcomm.finalize()
    monkeypatch.setenv("DISTCOMM_TIMEOUT", "12.5")
    assert distcomm.init().timeout == 12.5  # type: ignore[attr-defined]


def test_init_with_a_different_timeout_while_running_is_refused() -> None:
    distcomm.init(timeout=7)
    assert distcomm.init(timeout=datetime.timedelta(seconds=7)) is distcomm.get_communicator()
    with pytest.raises(AlreadyInitializedError, match=r"timeout=8\.0"):
        distcomm.init(timeout=8)


# -- device at init -----------------------------------------------------------------------------
@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:1", "CUDA:0"])
def test_valid_devices_are_accepted(device: str) -> None:
    assert distcomm.init(device=device).backend == "fakelink"


def test_a_torch_device_is_accepted() -> None:
    torch = pytest.importorskip("torch")
    assert distcomm.init(device=torch.device("cpu")).backend == "fakelink"


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", "cuda:", "cpu:x", 3, ""])
def test_invalid_devices_are_refused(bad: object) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        distcomm.init(device=bad)
    message = str(info.value)
    assert f"device={bad!r}" in message
    assert "'cuda:N'" in message and "HINT" in message
    assert not distcomm.is_initialized()


# -- the launch method and a missing backend ----------------------------------------------------
def test_init_method_variable_applies_before_init_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("DISTCOMM_INIT_METHOD", "single_node")
    assert (distcomm.get_rank(), distcomm.get_world_size()) == (0, 1)
    assert distcomm.all_reduce(5) == 5, "a world of 1 by the chosen method: an identity"
    distcomm.init()
    assert (distcomm.get_rank(), distcomm.get_world_size()) == (0, 1)


@pytest.mark.usefixtures("only_core_backends")
def test_missing_first_party_backend_says_what_to_install() -> None:
    with pytest.raises(BackendNotFoundError) as info:
        distcomm.init(backend="gloo")
    message = str(info.value)
    assert "backend 'gloo' is provided by distcomm-torch" in message
    assert "HINT: pip install ./backends/distcomm-torch" in message
    assert "available: fakelink" in message


def test_a_failed_init_fixes_no_object_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    """``init()`` fixes the object policy from ``DISTCOMM_OBJECTS`` before it selects a
    backend; when it then fails, the policy follows the variable again (``distcomm info`` and a
    later ``init()`` read it as it is then)."""
    from distcomm import _unpickling

    with pytest.raises(distcomm.BackendNotFoundError):
        distcomm.init(backend="no-such-backend")
    monkeypatch.setenv("DISTCOMM_OBJECTS", "pickle")
    assert _unpickling.policy() == "pickle", "the failed init() left its policy fixed"
